/**
 * What serving a PyTorch checkpoint costs before its first request: the graph
 * built from a bert-base-sized checkpoint (12 layers, hidden 768, F32
 * model.safetensors of 436 MB, random weights) into an empty graph cache, and a
 * start that finds it cached (the weights hashed to find it), in float32 and
 * float16, on the build thread a server uses (checkpointGraphOffThread).
 *
 *   node dist/bench/micro/checkpoint-build.js [--rounds 3] [--layers 12]
 *
 * The checkpoint and the caches are written into a temporary folder.
 */
import { mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { checkpointGraphOffThread } from '../../src/main/checkpoint/off-thread.js';
import { encodeSafetensors, type F32Tensor } from '../../src/shared/model-format/safetensors.js';
import { parseOptions } from '../args.js';
import { median } from '../suite/phases.js';

const values = parseOptions('node dist/bench/micro/checkpoint-build.js [options]', {
  rounds: { type: 'int', min: 1, default: 3, help: 'rounds: each builds into a fresh cache, then starts from it' },
  layers: { type: 'int', min: 1, default: 12, help: 'encoder layers (bert-base: 12)' },
});

const H = 768;
const I = 3072;
const VOCAB = 30522;

/** A BertModel checkpoint's tensors (torch's [out, in] layout), uniform in ±1/sqrt(fan-in). */
function bertTensors(layers: number): Record<string, F32Tensor> {
  let seed = 1;
  const random = (shape: number[], scale: number): F32Tensor => {
    const data = new Float32Array(shape.reduce((a, b) => a * b, 1));
    for (let i = 0; i < data.length; i++) data[i] = (((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32) * 2 - 1) * scale;
    return { shape, data };
  };
  const t: Record<string, F32Tensor> = {};
  const linear = (name: string, fanIn: number, fanOut: number) => {
    t[`${name}.weight`] = random([fanOut, fanIn], 1 / Math.sqrt(fanIn));
    t[`${name}.bias`] = random([fanOut], 0.02);
  };
  const norm = (name: string) => {
    t[`${name}.weight`] = { shape: [H], data: new Float32Array(H).fill(1) };
    t[`${name}.bias`] = { shape: [H], data: new Float32Array(H) };
  };
  t['embeddings.word_embeddings.weight'] = random([VOCAB, H], 0.02);
  t['embeddings.position_embeddings.weight'] = random([512, H], 0.02);
  t['embeddings.token_type_embeddings.weight'] = random([2, H], 0.02);
  norm('embeddings.LayerNorm');
  for (let l = 0; l < layers; l++) {
    const p = `encoder.layer.${l}`;
    for (const k of ['query', 'key', 'value']) linear(`${p}.attention.self.${k}`, H, H);
    linear(`${p}.attention.output.dense`, H, H);
    norm(`${p}.attention.output.LayerNorm`);
    linear(`${p}.intermediate.dense`, H, I);
    linear(`${p}.output.dense`, I, H);
    norm(`${p}.output.LayerNorm`);
  }
  linear('pooler.dense', H, H);
  return t;
}

const root = mkdtempSync(join(tmpdir(), 'slabserve-checkpoint-build-'));
try {
  const dir = join(root, 'bert-base');
  const config = { architectures: ['BertModel'], model_type: 'bert', hidden_size: H, num_attention_heads: 12, num_hidden_layers: values.layers, intermediate_size: I, hidden_act: 'gelu', vocab_size: VOCAB, max_position_embeddings: 512, type_vocab_size: 2, layer_norm_eps: 1e-12, pad_token_id: 0 };
  mkdirSync(dir);
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
  writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors(bertTensors(values.layers)));
  console.log(`checkpoint: ${values.layers} layers, model.safetensors ${(statSync(join(dir, 'model.safetensors')).size / 1e6).toFixed(0)} MB`);
  const times: Record<string, number[]> = {};
  const timed = async (label: string, dtype: 'fp32' | 'fp16', cacheDir: string) => {
    const started = performance.now();
    const built = await checkpointGraphOffThread('bert-base', dir, 'hidden', { cacheDir, dtype, log: () => {} });
    (times[label] ??= []).push((performance.now() - started) / 1000);
    return built!;
  };
  for (let r = 0; r < values.rounds; r++) {
    for (const dtype of ['fp32', 'fp16'] as const) {
      const cacheDir = join(root, `cache-${r}-${dtype}`);
      const built = await timed(`${dtype} first build`, dtype, cacheDir);
      await timed(`${dtype} cached start`, dtype, cacheDir);
      if (r === 0) console.log(`${dtype} graph: ${(statSync(built.path).size / 1e6).toFixed(0)} MB`);
      rmSync(cacheDir, { recursive: true, force: true });
    }
  }
  console.log('\n| | median s | rounds (s) |\n|---|---|---|');
  for (const [label, s] of Object.entries(times)) console.log(`| ${label} | ${median(s).toFixed(2)} | ${s.map((v) => v.toFixed(2)).join(', ')} |`);
} finally {
  rmSync(root, { recursive: true, force: true });
}
