/**
 * A checkpoint's weights, found in its folder and handed to the graph builder
 * in the layout it needs: model.safetensors, sharded safetensors
 * (model.safetensors.index.json), pytorch_model.bin or sharded .bin files;
 * F32, F16 and BF16 read as float32. Names are looked up as transformers
 * loads them: with or without the family's body prefix (a bare model's weights
 * from a task checkpoint, or the other way round), LayerNorm's older
 * gamma/beta as weight/bias; tensors the model does not use are ignored.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { floatsOf, openSafetensors, type TensorFile } from '../../shared/model-format/safetensors.js';
import { readJsonFile } from '../../shared/model-format/hf-folder.js';
import type { EncoderPlan, ModernBertPlan } from './architectures.js';
import type { EncoderParams } from './encoder-graph.js';
import type { ModernBertParams } from './modernbert-graph.js';
import { openTorchFile } from './torch-file.js';

/** The files that hold the weights: the one file, or an index's shards. */
export function weightFiles(dir: string, file: string): string[] {
  if (!file.endsWith('.index.json')) return [file];
  const index = readJsonFile<{ weight_map?: Record<string, string> }>(join(dir, file));
  if (!index.weight_map || typeof index.weight_map !== 'object') throw new Error(`${join(dir, file)}: no weight_map`);
  return [...new Set(Object.values(index.weight_map))].sort();
}

/** The tensors of a checkpoint by name, across its shards. */
export class Checkpoint {
  private readonly owner = new Map<string, TensorFile>();

  private constructor(private readonly files: TensorFile[]) {
    for (const f of files) for (const name of f.names()) this.owner.set(name, f);
  }

  static open(dir: string, file: string): Checkpoint {
    const opened: TensorFile[] = [];
    try {
      for (const shard of weightFiles(dir, file)) {
        const path = join(dir, shard);
        if (!existsSync(path)) throw new Error(`${join(dir, file)} names ${shard}, which the folder lacks`);
        opened.push(shard.endsWith('.safetensors') ? openSafetensors(path) : openTorchFile(path));
      }
    } catch (err) {
      for (const f of opened) f.close();
      throw err;
    }
    return new Checkpoint(opened);
  }

  has(name: string): boolean {
    return this.owner.has(name);
  }

  /** The tensor as float32, checked against the shape the model needs; throws naming it. */
  floats(name: string, shape: number[]): Float32Array {
    const file = this.owner.get(name);
    if (!file) throw new Error(`the checkpoint has no tensor ${name}`);
    const info = file.info(name)!;
    if (info.shape.length !== shape.length || info.shape.some((d, i) => d !== shape[i])) {
      throw new Error(`tensor ${name} has shape [${info.shape.join(', ')}], the config needs [${shape.join(', ')}]`);
    }
    return floatsOf(file.bytes(name), info.dtype, `tensor ${name}`);
  }

  close(): void {
    for (const f of this.files) f.close();
  }
}

/** The builder's weights from `checkpoint`, named as `plan` says. */
export function checkpointParams(checkpoint: Checkpoint, plan: EncoderPlan): EncoderParams {
  const prefix = bodyPrefixOf(checkpoint, plan, 'embeddings.word_embeddings.weight');
  const full = (canonical: string) => {
    const { name, part } = plan.nameOf(canonical);
    return part === 'body' ? `${prefix}${name}` : name;
  };
  /** A weight by its name, or by its older LayerNorm name (gamma, beta). */
  const tensor = (name: string, suffix: 'weight' | 'bias', shape: number[]) => {
    const older = `${name}.${suffix === 'weight' ? 'gamma' : 'beta'}`;
    return checkpoint.floats(!checkpoint.has(`${name}.${suffix}`) && checkpoint.has(older) ? older : `${name}.${suffix}`, shape);
  };
  return {
    linear: (canonical, fanIn, fanOut) => {
      const name = full(canonical);
      return { weight: transpose(tensor(name, 'weight', [fanOut, fanIn]), fanOut, fanIn), bias: tensor(name, 'bias', [fanOut]) };
    },
    embedding: (canonical, rows, width) => tensor(full(canonical), 'weight', [rows, width]),
    layerNorm: (canonical, width) => {
      const name = full(canonical);
      return { weight: tensor(name, 'weight', [width]), bias: tensor(name, 'bias', [width]) };
    },
    decoder: (hidden, vocab) => {
      // Tied, as transformers ties it (tie_word_embeddings): the word embeddings, [vocab, hidden].
      const own = checkpoint.has(plan.decoderNames.weight);
      const weight = own ? checkpoint.floats(plan.decoderNames.weight, [vocab, hidden]) : checkpoint.floats(full('embeddings.word_embeddings') + '.weight', [vocab, hidden]);
      const biasName = plan.decoderNames.bias.find((n) => checkpoint.has(n)) ?? plan.decoderNames.bias[0]!;
      return { weight: transpose(weight, vocab, hidden), bias: checkpoint.floats(biasName, [vocab]) };
    },
  };
}

/** The body's prefix as the file has it: a task checkpoint's (bert., model.), or none (a bare model saved alone). */
function bodyPrefixOf(checkpoint: Checkpoint, plan: { bodyPrefix: string; architecture: string }, word: string): string {
  if (checkpoint.has(`${plan.bodyPrefix}${word}`)) return plan.bodyPrefix;
  if (checkpoint.has(word)) return '';
  throw new Error(`the checkpoint has no tensor ${plan.bodyPrefix}${word} (nor ${word}): not a ${plan.architecture} checkpoint`);
}

/**
 * ModernBERT's weights by its own names: the body under `model.` (or bare), the head, classifier and
 * decoder at the root; a bias read where the config says the layer has one (and required then).
 */
export function modernBertParams(checkpoint: Checkpoint, plan: ModernBertPlan): ModernBertParams {
  const prefix = bodyPrefixOf(checkpoint, plan, 'embeddings.tok_embeddings.weight');
  const full = (name: string) => (/^(head|classifier|decoder)\b/.test(name) ? name : `${prefix}${name}`);
  const hasBias = (name: string) => (/\.attn\./.test(name) ? plan.bias.attention : /\.mlp\./.test(name) ? plan.bias.mlp : name === 'classifier' ? true : plan.bias.classifier);
  // Wi (input, gate) is asked for in row slices, one after the other: the tensor is read once.
  let last: { name: string; data: Float32Array } | undefined;
  const floats = (name: string, shape: number[]) => (last?.name === name ? last.data : (last = { name, data: checkpoint.floats(name, shape) }).data);
  return {
    linear: (name, fanIn, fanOut, rows) => {
      const [start, end, total] = rows ?? [0, fanOut, fanOut];
      const weight = floats(`${full(name)}.weight`, [total, fanIn]).subarray(start * fanIn, end * fanIn);
      const bias = hasBias(name) ? checkpoint.floats(`${full(name)}.bias`, [total]).slice(start, end) : undefined;
      return { weight: transpose(weight, fanOut, fanIn), bias };
    },
    embedding: (name, rows, width) => checkpoint.floats(`${full(name)}.weight`, [rows, width]),
    norm: (name, width) => ({ weight: checkpoint.floats(`${full(name)}.weight`, [width]), bias: plan.bias.norm ? checkpoint.floats(`${full(name)}.bias`, [width]) : undefined }),
    decoder: (hidden, vocab) => {
      // Tied to the token embeddings, as transformers ties it.
      const weight = checkpoint.has('decoder.weight') ? checkpoint.floats('decoder.weight', [vocab, hidden]) : checkpoint.floats(`${prefix}embeddings.tok_embeddings.weight`, [vocab, hidden]);
      return { weight: transpose(weight, vocab, hidden), bias: plan.bias.decoder ? checkpoint.floats('decoder.bias', [vocab]) : undefined };
    },
  };
}

/** A row-major [rows, cols] matrix as [cols, rows] (torch's Linear keeps [out, in]; MatMul wants [in, out]). */
function transpose(m: Float32Array, rows: number, cols: number): Float32Array {
  const out = new Float32Array(m.length);
  for (let r = 0; r < rows; r++) {
    const base = r * cols;
    for (let c = 0; c < cols; c++) out[c * rows + r] = m[base + c]!;
  }
  return out;
}
