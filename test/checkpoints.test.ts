/**
 * Model folders that hold a PyTorch checkpoint and no ONNX graph, served from
 * a graph slabserve builds from the weights, against an independent
 * reference: transformers' forward passes written out in PyTorch
 * (test/fixtures/torch_reference.py, Debian's python3-torch, fetched once
 * where the machine lacks it), one text at a time, on the same token ids (the
 * Rust `tokenizers` library's). The checkpoints are random, at each
 * architecture's real structure and naming (2 layers, small widths, fan-in
 * scaled weights so every layer mixes tokens), written here as transformers
 * saves them: safetensors in F32, F16, BF16 and sharded; a pytorch_model.bin
 * saved by torch.save (with non-row-major strides and an int64 buffer).
 */
import { execFile } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type Server } from '../dist/src/main/server.js';
import { encodeSafetensors, type F32Tensor } from '../dist/src/shared/model-format/safetensors.js';
import { loadModelSpec, type Dtype } from '../dist/src/shared/model-format/model-config.js';
import { checkpointGraph } from '../dist/src/main/checkpoint/build.js';
import { checkpointGraphOffThread } from '../dist/src/main/checkpoint/off-thread.js';
import { planModel } from '../dist/src/main/plan-models.js';
import { relativeBucket } from '../dist/src/main/checkpoint/encoder-graph.js';
import { onnx } from '../dist/src/shared/model-format/onnx-graph.js';
import { writePreset } from '../dist/models/generator/presets.js';
import { sentTogether } from './fixtures/queued-together.js';
import { toolOnPath } from './fixtures/system-tools.js';
import { makeRandom, testServerConfig } from './helpers.js';

process.env.SLABSERVE_TEST_HOOKS = '1';

const REFERENCE = fileURLToPath(new URL('./fixtures/torch_reference.py', import.meta.url));
/** fp32 graphs against the reference, absolute. */
const TOLERANCE = 1e-4;

interface RustEncoding {
  getIds(): number[];
  getTypeIds(): number[];
}
interface RustTokenizer {
  encode(text: string, pair?: string | null): Promise<RustEncoding>;
}
const rust = createRequire(import.meta.url)('tokenizers') as { Tokenizer: { fromFile(path: string): RustTokenizer } };

type Family = 'bert' | 'roberta' | 'distilbert' | 'electra' | 'mpnet' | 'modernbert';
type Head = 'hidden' | 'classify' | 'mlm';

interface Case {
  name: string;
  architecture: string;
  family: Family;
  head: Head;
  labels?: number;
  /** The preset whose tokenizer (and sentence-transformers files) the folder takes. */
  preset: 'tiny-embed' | 'tiny-xlmr' | 'tiny-distilbert' | 'tiny-splade' | 'tiny-modernbert';
  /** ModernBERT: the v5 config keys (layer_types, rope_parameters) instead of v4's, and every bias on. */
  v5?: boolean;
  /** A SPLADE folder: tiny-splade's sentence-transformers files (MLMTransformer, SpladePooling) beside the preset's tokenizer. */
  splade?: boolean;
  storage: 'F32' | 'F16' | 'BF16' | 'sharded' | 'bin' | 'bin-strided' | 'bin-sharded';
  /** Whether the body's weights carry the family's prefix (bert., roberta., ...): a task model's always do. */
  prefixed: boolean;
  hiddenAct?: string;
  embeddingSize?: number;
}

const CASES: Case[] = [
  { name: 'bert-model', architecture: 'BertModel', family: 'bert', head: 'hidden', preset: 'tiny-embed', storage: 'F32', prefixed: false },
  { name: 'bert-intent', architecture: 'BertForSequenceClassification', family: 'bert', head: 'classify', labels: 3, preset: 'tiny-embed', storage: 'F16', prefixed: true, hiddenAct: 'gelu_new' },
  { name: 'bert-rerank', architecture: 'BertForSequenceClassification', family: 'bert', head: 'classify', labels: 1, preset: 'tiny-embed', storage: 'sharded', prefixed: true, hiddenAct: 'relu' },
  { name: 'bert-splade', architecture: 'BertForMaskedLM', family: 'bert', head: 'mlm', preset: 'tiny-splade', storage: 'bin-strided', prefixed: true },
  { name: 'xlmr-splade', architecture: 'XLMRobertaForMaskedLM', family: 'roberta', head: 'mlm', preset: 'tiny-xlmr', splade: true, storage: 'F16', prefixed: true },
  { name: 'distilbert-splade', architecture: 'DistilBertForMaskedLM', family: 'distilbert', head: 'mlm', preset: 'tiny-distilbert', splade: true, storage: 'F32', prefixed: true },
  { name: 'modernbert-splade', architecture: 'ModernBertForMaskedLM', family: 'modernbert', head: 'mlm', preset: 'tiny-modernbert', splade: true, storage: 'F32', prefixed: true },
  // A bare model's weights under the task checkpoint's prefix (roberta.): read as transformers strips it.
  { name: 'xlmr-model', architecture: 'XLMRobertaModel', family: 'roberta', head: 'hidden', preset: 'tiny-xlmr', storage: 'BF16', prefixed: true },
  { name: 'xlmr-rerank', architecture: 'XLMRobertaForSequenceClassification', family: 'roberta', head: 'classify', labels: 1, preset: 'tiny-xlmr', storage: 'bin', prefixed: true },
  { name: 'mpnet-model', architecture: 'MPNetModel', family: 'mpnet', head: 'hidden', preset: 'tiny-xlmr', storage: 'F32', prefixed: false },
  { name: 'modernbert-model', architecture: 'ModernBertModel', family: 'modernbert', head: 'hidden', preset: 'tiny-modernbert', storage: 'F32', prefixed: false },
  { name: 'modernbert-rerank', architecture: 'ModernBertForSequenceClassification', family: 'modernbert', head: 'classify', labels: 1, preset: 'tiny-modernbert', storage: 'BF16', prefixed: true, v5: true },
  { name: 'distilbert-model', architecture: 'DistilBertModel', family: 'distilbert', head: 'hidden', preset: 'tiny-distilbert', storage: 'F32', prefixed: false },
  { name: 'distilbert-intent', architecture: 'DistilBertForSequenceClassification', family: 'distilbert', head: 'classify', labels: 4, preset: 'tiny-distilbert', storage: 'bin-sharded', prefixed: true, hiddenAct: 'relu' },
  // The layers' tanh GELU, the classification head's exact GELU whatever hidden_act says.
  { name: 'electra-rerank', architecture: 'ElectraForSequenceClassification', family: 'electra', head: 'classify', labels: 1, preset: 'tiny-embed', storage: 'F32', prefixed: true, embeddingSize: 32, hiddenAct: 'gelu_new' },
];

const H = 64;
const HEADS = 4;
const I = 128;
const LAYERS = 2;
/** ModernBERT: four layers, so that layers 1 and 2 attend locally (every third is global), within a window of 16 (texts are longer). */
const MODERNBERT_LAYERS = 4;
const MODERNBERT_WINDOW = 16;

let root: string;
let python: string;
let server: Server;
const dirs = new Map<string, string>();
const tokenizers = new Map<string, RustTokenizer>();

/** A seeded normal generator. */
function normals(rand: () => number) {
  return (n: number, std: number, mean = 0) => {
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = mean + std * Math.sqrt(-2 * Math.log(1 - rand())) * Math.cos(2 * Math.PI * rand());
    return out;
  };
}

/** The state dict of `c` as transformers names and shapes it, with random fan-in scaled weights. */
function stateDict(c: Case, vocab: number, positions: number, types: number, rand: () => number): Record<string, F32Tensor> {
  if (c.family === 'modernbert') return modernBertStateDict(c, vocab, rand);
  const normal = normals(rand);
  const sd: Record<string, F32Tensor> = {};
  const t = (name: string, shape: number[], std: number, mean = 0) => (sd[name] = { shape, data: normal(shape.reduce((a, b) => a * b, 1), std, mean) });
  const linear = (name: string, fanIn: number, fanOut: number, gain = 1) => {
    t(`${name}.weight`, [fanOut, fanIn], gain / Math.sqrt(fanIn));
    t(`${name}.bias`, [fanOut], 0.02);
  };
  const norm = (name: string, width = H) => {
    t(`${name}.weight`, [width], 0.05, 1);
    t(`${name}.bias`, [width], 0.02);
  };
  const prefix = c.prefixed ? { bert: 'bert.', roberta: 'roberta.', distilbert: 'distilbert.', electra: 'electra.', mpnet: 'mpnet.' }[c.family] : '';
  const E = c.embeddingSize ?? H;
  t(`${prefix}embeddings.word_embeddings.weight`, [vocab, E], 1);
  t(`${prefix}embeddings.position_embeddings.weight`, [positions, E], 0.5);
  if (c.family !== 'distilbert' && c.family !== 'mpnet') t(`${prefix}embeddings.token_type_embeddings.weight`, [types, E], 0.1);
  if (c.family === 'mpnet') t(`${prefix}encoder.relative_attention_bias.weight`, [32, HEADS], 1);
  norm(`${prefix}embeddings.LayerNorm`, E);
  if (c.embeddingSize) linear(`${prefix}embeddings_project`, E, H);
  for (let l = 0; l < LAYERS; l++) {
    if (c.family === 'distilbert') {
      const p = `${prefix}transformer.layer.${l}`;
      linear(`${p}.attention.q_lin`, H, H, 1.5);
      linear(`${p}.attention.k_lin`, H, H, 1.5);
      linear(`${p}.attention.v_lin`, H, H);
      linear(`${p}.attention.out_lin`, H, H, 0.5);
      norm(`${p}.sa_layer_norm`);
      linear(`${p}.ffn.lin1`, H, I);
      linear(`${p}.ffn.lin2`, I, H, 0.5);
      norm(`${p}.output_layer_norm`);
      continue;
    }
    const p = `${prefix}encoder.layer.${l}`;
    const [q, k, v, o, ln] = c.family === 'mpnet' ? ['attn.q', 'attn.k', 'attn.v', 'attn.o', 'LayerNorm'] : ['self.query', 'self.key', 'self.value', 'output.dense', 'output.LayerNorm'];
    linear(`${p}.attention.${q}`, H, H, 1.5);
    linear(`${p}.attention.${k}`, H, H, 1.5);
    linear(`${p}.attention.${v}`, H, H);
    linear(`${p}.attention.${o}`, H, H, 0.5);
    norm(`${p}.attention.${ln}`);
    linear(`${p}.intermediate.dense`, H, I);
    linear(`${p}.output.dense`, I, H, 0.5);
    norm(`${p}.output.LayerNorm`);
  }
  // Bare BERT and RoBERTa models carry a pooler they never use for token states.
  if (c.family === 'bert' || c.family === 'roberta' || c.family === 'mpnet') linear(`${prefix}pooler.dense`, H, H);
  if (c.head === 'classify') {
    const L = c.labels!;
    if (c.family === 'bert') linear('classifier', H, L, 2);
    else if (c.family === 'distilbert') (linear('pre_classifier', H, H), linear('classifier', H, L, 2));
    else (linear('classifier.dense', H, H), linear('classifier.out_proj', H, L, 2));
  }
  if (c.head === 'mlm') {
    // The decoder is tied to the word embeddings: a checkpoint keeps only its bias.
    const [dense, layerNorm, bias] = {
      bert: ['cls.predictions.transform.dense', 'cls.predictions.transform.LayerNorm', 'cls.predictions.bias'],
      roberta: ['lm_head.dense', 'lm_head.layer_norm', 'lm_head.bias'],
      distilbert: ['vocab_transform', 'vocab_layer_norm', 'vocab_projector.bias'],
    }[c.family as 'bert' | 'roberta' | 'distilbert'];
    linear(dense!, H, H);
    norm(layerNorm!);
    t(bias!, [vocab], 0.3, -3.3);
  }
  return sd;
}

/** ModernBERT's state dict: its own names (model. for a task checkpoint), Wqkv [3H, H] and Wi [2I, H], biases where v5 cases turn them on. */
function modernBertStateDict(c: Case, vocab: number, rand: () => number): Record<string, F32Tensor> {
  const normal = normals(rand);
  const sd: Record<string, F32Tensor> = {};
  const t = (name: string, shape: number[], std: number, mean = 0) => (sd[name] = { shape, data: normal(shape.reduce((a, b) => a * b, 1), std, mean) });
  const bias = c.v5 === true;
  const lin = (name: string, fanIn: number, fanOut: number, gain = 1, withBias = bias) => {
    t(`${name}.weight`, [fanOut, fanIn], gain / Math.sqrt(fanIn));
    if (withBias) t(`${name}.bias`, [fanOut], 0.02);
  };
  const ln = (name: string) => {
    t(`${name}.weight`, [H], 0.05, 1);
    if (bias) t(`${name}.bias`, [H], 0.02);
  };
  const p = c.prefixed ? 'model.' : '';
  t(`${p}embeddings.tok_embeddings.weight`, [vocab, H], 1);
  ln(`${p}embeddings.norm`);
  for (let l = 0; l < MODERNBERT_LAYERS; l++) {
    if (l > 0) ln(`${p}layers.${l}.attn_norm`);
    lin(`${p}layers.${l}.attn.Wqkv`, H, 3 * H, 1.5);
    lin(`${p}layers.${l}.attn.Wo`, H, H, 0.5);
    ln(`${p}layers.${l}.mlp_norm`);
    lin(`${p}layers.${l}.mlp.Wi`, H, 2 * I);
    lin(`${p}layers.${l}.mlp.Wo`, I, H, 0.5);
  }
  ln(`${p}final_norm`);
  if (c.head !== 'hidden') {
    lin('head.dense', H, H);
    ln('head.norm');
  }
  if (c.head === 'classify') lin('classifier', H, c.labels!, 2, true);
  // The masked-LM decoder is tied to the token embeddings; its bias (decoder_bias, true by default) is its own.
  if (c.head === 'mlm') t('decoder.bias', [vocab], 0.3, -3.3);
  return sd;
}

function configOf(c: Case, vocab: number, positions: number, types: number): Record<string, unknown> {
  const labels = c.labels ? { id2label: Object.fromEntries(Array.from({ length: c.labels }, (_, i) => [String(i), `L${i}`])) } : {};
  if (c.family === 'modernbert') {
    const layout = c.v5
      ? {
          layer_types: Array.from({ length: MODERNBERT_LAYERS }, (_, l) => (l % 3 === 0 ? 'full_attention' : 'sliding_attention')),
          rope_parameters: { full_attention: { rope_theta: 160000.0, rope_type: 'default' }, sliding_attention: { rope_theta: 10000.0, rope_type: 'default' } },
          norm_bias: true, attention_bias: true, mlp_bias: true, classifier_bias: true, classifier_pooling: 'mean',
        }
      : { global_rope_theta: 160000.0, local_rope_theta: 10000.0, global_attn_every_n_layers: 3, norm_bias: false, attention_bias: false, mlp_bias: false, classifier_pooling: 'cls' };
    return {
      architectures: [c.architecture], model_type: 'modernbert', hidden_size: H, num_attention_heads: HEADS, num_hidden_layers: MODERNBERT_LAYERS, intermediate_size: I,
      vocab_size: vocab, max_position_embeddings: positions, norm_eps: 1e-5, hidden_activation: 'gelu', classifier_activation: 'gelu', local_attention: MODERNBERT_WINDOW,
      ...layout, ...labels,
    };
  }
  if (c.family === 'distilbert') {
    return { architectures: [c.architecture], model_type: 'distilbert', dim: H, n_heads: HEADS, n_layers: LAYERS, hidden_dim: I, vocab_size: vocab, max_position_embeddings: positions, activation: c.hiddenAct ?? 'gelu', pad_token_id: 0, ...labels };
  }
  return {
    architectures: [c.architecture],
    model_type: { bert: 'bert', roberta: 'xlm-roberta', electra: 'electra', mpnet: 'mpnet' }[c.family],
    hidden_size: H, num_attention_heads: HEADS, num_hidden_layers: LAYERS, intermediate_size: I, hidden_act: c.hiddenAct ?? 'gelu',
    vocab_size: vocab, max_position_embeddings: positions, layer_norm_eps: c.family === 'roberta' || c.family === 'mpnet' ? 1e-5 : 1e-12,
    pad_token_id: c.family === 'roberta' || c.family === 'mpnet' ? 1 : 0,
    ...(c.family === 'mpnet' ? { relative_attention_num_buckets: 32 } : { type_vocab_size: types, position_embedding_type: 'absolute' }),
    ...(c.embeddingSize ? { embedding_size: c.embeddingSize } : {}),
    ...labels,
  };
}

/**
 * Runs the reference script with `job` on stdin; its JSON answer. Asynchronous: a test thread
 * blocked for the seconds torch takes would let the server close its idle keep-alive sockets
 * unseen, and the next request would go out on a closed one.
 */
async function reference<T>(job: unknown): Promise<T> {
  const child = execFile(python, [REFERENCE], { encoding: 'utf8', maxBuffer: 2 ** 30 });
  child.stdin!.end(JSON.stringify(job));
  const [out] = await Promise.all([
    new Promise<string>((resolve, reject) => {
      let text = '';
      child.stdout!.on('data', (d: string) => (text += d));
      child.on('error', reject);
      child.on('close', (code) => (code === 0 ? resolve(text) : reject(new Error(`${REFERENCE} exited ${code}`))));
    }),
  ]);
  return JSON.parse(out) as T;
}

/**
 * A checkpoint folder for `c`: the preset's tokenizer (and its sentence-transformers files), config.json, the weights.
 * A .bin is written by torch.save: the job for it goes to `pending`, run with the others in one process.
 */
function writeCase(c: Case, presets: Map<string, string>, rand: () => number, pending: object[]): string {
  const preset = presets.get(c.preset)!;
  const dir = join(root, c.name);
  mkdirSync(dir);
  for (const f of readdirSync(preset)) if (f !== 'model.onnx' && f !== 'config.json' && f !== 'serve.json') cpSync(join(preset, f), join(dir, f), { recursive: true });
  if (c.splade) {
    rmSync(join(dir, '1_Pooling'), { recursive: true, force: true });
    for (const f of ['modules.json', '1_SpladePooling', 'sentence_bert_config.json', 'config_sentence_transformers.json']) cpSync(join(presets.get('tiny-splade')!, f), join(dir, f), { recursive: true });
  }
  const presetConfig = JSON.parse(readFileSync(join(preset, 'config.json'), 'utf8')) as { vocab_size: number; max_position_embeddings?: number };
  // ModernBERT's embedding table is larger than its tokenizer (50368 rows for 50280 tokens): so here.
  const vocab = presetConfig.vocab_size + (c.family === 'modernbert' ? 64 : 0);
  const positions = presetConfig.max_position_embeddings ?? 512;
  const types = c.family === 'roberta' ? 1 : 2;
  writeFileSync(join(dir, 'config.json'), JSON.stringify(configOf(c, vocab, positions, types), null, 2));
  const sd = stateDict(c, vocab, positions, types, rand);
  if (c.storage === 'sharded') {
    const names = Object.keys(sd);
    const half = Math.ceil(names.length / 2);
    const shards = [names.slice(0, half), names.slice(half)];
    const map: Record<string, string> = {};
    shards.forEach((part, i) => {
      const file = `model-0000${i + 1}-of-00002.safetensors`;
      writeFileSync(join(dir, file), encodeSafetensors(Object.fromEntries(part.map((n) => [n, sd[n]!]))));
      for (const n of part) map[n] = file;
    });
    writeFileSync(join(dir, 'model.safetensors.index.json'), JSON.stringify({ metadata: {}, weight_map: map }));
  } else if (c.storage.startsWith('bin')) {
    // torch.save of the same weights (from a scratch folder), with BERT's int64 position_ids buffer that loaders ignore.
    const scratch = join(root, `${c.name}-f32`);
    mkdirSync(scratch);
    writeFileSync(join(scratch, 'model.safetensors'), encodeSafetensors(sd));
    pending.push({ save_bin: dir, from: scratch, strided: c.storage === 'bin-strided', shards: c.storage === 'bin-sharded' ? 3 : 0 });
  } else {
    writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors(sd, c.storage));
  }
  return dir;
}

function vocabularyWordsOf(tokenizerPath: string): string[] {
  const model = (JSON.parse(readFileSync(tokenizerPath, 'utf8')) as { model: { vocab: Record<string, number> | [string, number][] } }).model;
  const pieces = Array.isArray(model.vocab) ? model.vocab.map(([p]) => p.replace(/^▁/, '')) : Object.keys(model.vocab);
  return [...new Set(pieces.filter((w) => /^[a-z]{2,}$/.test(w)))];
}

beforeAll(async () => {
  python = toolOnPath('python3-torch');
  root = mkdtempSync(join(tmpdir(), 'slabserve-checkpoints-'));
  const presetRoot = join(root, 'presets');
  const presets = new Map(['tiny-embed', 'tiny-xlmr', 'tiny-distilbert', 'tiny-splade', 'tiny-modernbert'].map((p) => [p, writePreset(p, presetRoot).dir]));
  const rand = makeRandom('checkpoint weights');
  const pending: object[] = [];
  for (const c of CASES) {
    dirs.set(c.name, writeCase(c, presets, rand, pending));
    tokenizers.set(c.name, rust.Tokenizer.fromFile(join(dirs.get(c.name)!, 'tokenizer.json')));
  }
  // The same BERT weights as torch.onnx.export writes them: served through the graph path.
  const exported = join(root, 'bert-export');
  mkdirSync(exported);
  for (const f of readdirSync(dirs.get('bert-model')!)) if (f !== 'model.safetensors') cpSync(join(dirs.get('bert-model')!, f), join(exported, f));
  await reference({ jobs: [...pending, { export: exported, from: dirs.get('bert-model') }] });
  // bert-model's graph built with its weights in model.onnx_data, as weights over 1 GiB are, served as an ONNX folder.
  const external = join(root, 'bert-external');
  const built = checkpointGraph('bert-model', dirs.get('bert-model')!, 'hidden', { cacheDir: join(root, 'external-graphs'), dtype: 'fp32', externalDataAbove: 0, log: () => {} })!;
  mkdirSync(external);
  for (const f of readdirSync(dirs.get('bert-model')!)) if (f !== 'model.safetensors') cpSync(join(dirs.get('bert-model')!, f), join(external, f));
  for (const f of ['model.onnx', 'model.onnx_data']) cpSync(join(dirname(built.path), f), join(external, f));
  const models = [...CASES.map((c) => dirs.get(c.name)!), exported, external];
  // Texts here are under 100 tokens: a max length of 128 keeps the warm-up of 18 models to a few buckets each.
  server = await startServer(testServerConfig({ models, graphCacheDir: join(root, 'graphs'), slotsPerModel: 64, maxInputLength: 128, batching: { maxBatchTokens: 4096 } }));
  await server.ready;
}, 900_000);

afterAll(async () => {
  await server?.close();
  if (root) rmSync(root, { recursive: true, force: true });
});

async function post(path: string, body: unknown): Promise<any> {
  const r = await fetch(`${server.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.text();
  if (r.status !== 200) throw new Error(`${path}: ${r.status} ${text.slice(0, 400)}`);
  return JSON.parse(text);
}

function worstDiff(a: ArrayLike<number>, b: ArrayLike<number>, what: string): number {
  expect(a.length, `${what}: length`).toBe(b.length);
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i]! - b[i]!));
  return worst;
}

/** Random texts of mixed lengths from the model's vocabulary. */
function textsFor(c: Case, rand: () => number, count: number): string[] {
  const words = vocabularyWordsOf(join(dirs.get(c.name)!, 'tokenizer.json'));
  return Array.from({ length: count }, () => Array.from({ length: 1 + Math.floor(rand() ** 2 * 60) }, () => words[Math.floor(rand() * words.length)]).join(' '));
}

/** The reference's outputs for each (case, head, encodings), all in one Python process (importing torch takes seconds). */
async function referencesOf(jobs: { c: Case; head: Head | 'splade'; encodings: RustEncoding[] }[]): Promise<number[][][]> {
  const answer = await reference<{ results: { outputs: number[][] }[] }>({
    jobs: jobs.map(({ c, head, encodings }) => ({ dir: dirs.get(c.name), head, texts: encodings.map((e) => ({ ids: e.getIds(), types: e.getTypeIds() })) })),
  });
  return answer.results.map((r) => r.outputs);
}

/** For each case: random texts, their encodings by the Rust tokenizer. */
async function textsOf(cases: Case[], label: string, count: number): Promise<{ c: Case; texts: string[]; encodings: RustEncoding[] }[]> {
  const rand = makeRandom(label);
  return Promise.all(
    cases.map(async (c) => {
      const texts = textsFor(c, rand, count);
      return { c, texts, encodings: await Promise.all(texts.map((t) => tokenizers.get(c.name)!.encode(t))) };
    }),
  );
}

describe('a checkpoint folder is served from a graph built from its weights, as transformers computes it', () => {
  it('token states (/embed_all) and pooled rows (/embed) of bare models, batched with mixed lengths, equal the PyTorch reference', { timeout: 300_000 }, async () => {
    const cases = await textsOf(CASES.filter((k) => k.head === 'hidden'), 'checkpoint hidden', 12);
    const wants = await referencesOf(cases.map(({ c, encodings }) => ({ c, head: 'hidden', encodings })));
    for (const [n, { c, texts, encodings }] of cases.entries()) {
      const want = wants[n]!;
      const [all, pooled] = await sentTogether(server.testHooks, { [c.name]: 2 * texts.length }, () =>
        Promise.all([Promise.all(texts.map((t) => post('/embed_all', { model: c.name, inputs: t }))), Promise.all(texts.map((t) => post('/embed', { model: c.name, inputs: t })))]),
      );
      let worst = 0;
      for (const [i, e] of encodings.entries()) {
        const states = (all[i] as number[][][])[0]!;
        expect(states, `${c.name} text ${i}: one vector per token`).toHaveLength(e.getIds().length);
        worst = Math.max(worst, worstDiff(states.flat(), want[i]!, `${c.name} text ${i}`));
        // Mean pooling (no 1_Pooling in these folders), then L2: the test's own arithmetic on the reference.
        const T = e.getIds().length;
        const mean = Array.from({ length: H }, (_, h) => want[i]!.filter((_, k) => k % H === h).reduce((a, b) => a + b, 0) / T);
        const norm = Math.hypot(...mean);
        worst = Math.max(worst, worstDiff((pooled[i] as number[][])[0]!, mean.map((v) => v / norm), `${c.name} pooled ${i}`));
      }
      console.log(`${c.name} (${c.storage}): worst |diff| ${worst.toExponential(2)} over ${texts.length} texts`);
      expect(worst).toBeLessThan(TOLERANCE);
    }
  });
});

describe('task heads', () => {
  it('classifier logits (/predict raw_scores) equal the reference: BERT (F16 storage, gelu_new) and DistilBERT (relu, pre_classifier, a .bin in three shards)', { timeout: 300_000 }, async () => {
    const cases = await textsOf(CASES.filter((k) => k.head === 'classify' && k.labels! > 1), 'checkpoint classify', 12);
    const wants = await referencesOf(cases.map(({ c, encodings }) => ({ c, head: 'classify', encodings })));
    for (const [n, { c, texts }] of cases.entries()) {
      const got = await sentTogether(server.testHooks, { [c.name]: texts.length }, () => Promise.all(texts.map((t) => post('/predict', { model: c.name, inputs: t, raw_scores: true }))));
      const labels = Array.from({ length: c.labels! }, (_, i) => `L${i}`);
      let worst = 0;
      for (const [i, g] of got.entries()) {
        const byClass = labels.map((l) => (g as { label: string; score: number }[]).find((x) => x.label === l)!.score);
        worst = Math.max(worst, worstDiff(byClass, wants[n]![i]!, `${c.name} text ${i}`));
      }
      console.log(`${c.name} (${c.storage}): worst logit |diff| ${worst.toExponential(2)} over ${texts.length} texts`);
      expect(worst).toBeLessThan(TOLERANCE);
    }
  });

  it('reranker scores (/rerank raw_scores) equal the reference on each (query, text) pair: BERT (sharded), XLM-RoBERTa (pytorch_model.bin), ModernBERT, ELECTRA (embedding projection)', { timeout: 300_000 }, async () => {
    const rand = makeRandom('checkpoint rerank');
    const cases = await Promise.all(
      CASES.filter((k) => k.head === 'classify' && k.labels === 1).map(async (c) => {
        const [query, ...texts] = textsFor(c, rand, 11).map((t) => t.split(' ').slice(0, 25).join(' '));
        return { c, query: query!, texts, encodings: await Promise.all(texts.map((t) => tokenizers.get(c.name)!.encode(query!, t))) };
      }),
    );
    const wants = await referencesOf(cases.map(({ c, encodings }) => ({ c, head: 'classify', encodings })));
    for (const [n, { c, query, texts }] of cases.entries()) {
      const got = (await post('/rerank', { model: c.name, query, texts, raw_scores: true })) as { index: number; score: number }[];
      expect(got).toHaveLength(texts.length);
      const scores = texts.map((_, i) => got.find((g) => g.index === i)!.score);
      const worst = worstDiff(scores, wants[n]!.map((w) => w[0]!), c.name);
      console.log(`${c.name} (${c.storage}): worst score |diff| ${worst.toExponential(2)} over ${texts.length} pairs`);
      expect(worst).toBeLessThan(TOLERANCE);
    }
  });

  it("SPLADE rows (/embed_sparse) from masked-LM checkpoints (BERT's .bin with strided tensors, XLM-RoBERTa's lm_head, DistilBERT's vocab_projector, ModernBERT's head; each decoder tied to the embeddings) equal the reference's max of log(1 + relu(logits))", { timeout: 300_000 }, async () => {
    const cases = await textsOf(CASES.filter((k) => k.head === 'mlm'), 'checkpoint splade', 8);
    const wants = await referencesOf(cases.map(({ c, encodings }) => ({ c, head: 'splade', encodings })));
    for (const [n, { c, texts }] of cases.entries()) {
      const got = await sentTogether(server.testHooks, { [c.name]: texts.length }, () => Promise.all(texts.map((t) => post('/embed_sparse', { model: c.name, inputs: t }))));
      let worst = 0;
      let nonZeros = 0;
      for (const [i, want] of wants[n]!.entries()) {
        const row = new Float64Array(want.length);
        for (const e of (got[i] as { index: number; value: number }[][])[0]!) row[e.index] = e.value;
        nonZeros += want.filter((v) => v > 0).length;
        worst = Math.max(worst, worstDiff(row, want, `${c.name} text ${i}`));
      }
      console.log(`${c.name}: worst |diff| ${worst.toExponential(2)}, ${nonZeros} non-zeros over ${texts.length} texts`);
      expect(nonZeros).toBeGreaterThan(texts.length);
      expect(worst).toBeLessThan(TOLERANCE);
    }
  });
});

describe('the graph an exporter would give', () => {
  it("the same weights exported by torch.onnx.export (the graph path) and served from the checkpoint give the same token states", async () => {
    const texts = textsFor(CASES[0]!, makeRandom('checkpoint vs export'), 10);
    const [fromCheckpoint, fromExport] = await Promise.all(
      ['bert-model', 'bert-export'].map((model) => Promise.all(texts.map((t) => post('/embed_all', { model, inputs: t })))),
    );
    let worst = 0;
    for (const [i, rows] of fromCheckpoint!.entries()) worst = Math.max(worst, worstDiff((rows as number[][][])[0]!.flat(), (fromExport![i] as number[][][])[0]!.flat(), `text ${i}`));
    console.log(`checkpoint vs torch.onnx.export: worst |diff| ${worst.toExponential(2)} over ${texts.length} texts`);
    expect(worst).toBeLessThan(1e-5);
  });
});

describe('weights kept beside the graph (ONNX external data)', () => {
  it("a graph whose weights are in model.onnx_data (built so above 1 GiB, as exports of large models come) serves the same token states as the one that holds them", async () => {
    const external = join(root, 'bert-external');
    const graphBytes = statSync(join(external, 'model.onnx')).size;
    const dataBytes = statSync(join(external, 'model.onnx_data')).size;
    console.log(`graph ${graphBytes} bytes, model.onnx_data ${dataBytes} bytes`);
    expect(graphBytes).toBeLessThan(dataBytes / 10);
    const texts = textsFor(CASES[0]!, makeRandom('external data'), 8);
    const [held, beside] = await Promise.all(['bert-model', 'bert-external'].map((model) => Promise.all(texts.map((t) => post('/embed_all', { model, inputs: t })))));
    let worst = 0;
    for (const [i, rows] of held!.entries()) worst = Math.max(worst, worstDiff((rows as number[][][])[0]!.flat(), (beside![i] as number[][][])[0]!.flat(), `text ${i}`));
    expect(worst).toBeLessThan(1e-6);
  });
});

describe("the built graph is in onnxruntime's fused ops, as the rewriter makes an export", () => {
  it("every built graph runs one Attention per layer and its LayerNormalizations as SkipLayerNormalization (MPNet's with its relative bias; ModernBERT's as MultiHeadAttention after RotaryEmbedding)", async () => {
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    const gauge = (name: string, model: string) => Number(new RegExp(`^${name}\\{[^}]*model="${model}"[^}]*\\} (\\S+)$`, 'm').exec(metrics)?.[1]);
    for (const c of CASES) {
      const model = c.name;
      const modern = c.family === 'modernbert';
      expect(gauge('slabserve_model_fused_attentions', model), model).toBe(modern ? MODERNBERT_LAYERS : LAYERS);
      // Two residual LayerNorms a layer; BERT's family also the embeddings' (after the sum of the tables' rows), ModernBERT's the final norm.
      expect(gauge('slabserve_model_fused_layer_norms', model), model).toBe(modern ? 2 * MODERNBERT_LAYERS : 2 * LAYERS + 1);
    }
  });
});

describe('--dtype fp16: the graph built to compute in float16 (what CUDA serves by default)', () => {
  /** The largest |a - b| over the largest |b|: float16's error is relative to the values' scale. */
  const relativeDiff = (a: ArrayLike<number>, b: ArrayLike<number>, what: string) => worstDiff(a, b, what) / Math.max(...Array.from(b, Math.abs));
  const FP16 = ['bert-model', 'mpnet-model', 'modernbert-model', 'bert-intent'];

  it("stores every weight in float16, fused as the float32 graph is, and its token states and logits are the reference's within 1e-2 of their scale", { timeout: 300_000 }, async () => {
    const cacheDir = join(root, 'fp16-graphs');
    for (const name of ['bert-model', 'modernbert-model']) {
      const built = checkpointGraph(name, dirs.get(name)!, 'hidden', { cacheDir, dtype: 'fp16', log: () => {} })!;
      const graph = onnx.ModelProto.decode(readFileSync(built.path)).graph!;
      // The checkpoint's tensors (named as transformers names them); the rotary frequencies stay float32, as transformers keeps them.
      const floats = graph.initializer!.filter((t) => !t.name!.startsWith('/') && t.dataType !== onnx.TensorProto.DataType.INT64);
      expect(floats.length, name).toBeGreaterThan(10);
      expect(floats.filter((t) => t.dataType !== onnx.TensorProto.DataType.FLOAT16).map((t) => t.name), name).toEqual([]);
      expect(graph.output!.map((o) => o.type!.tensorType!.elemType), name).toEqual([onnx.TensorProto.DataType.FLOAT]);
    }
    const srv = await startServer(testServerConfig({ models: FP16.map((n) => dirs.get(n)!), dtype: 'fp16', graphCacheDir: cacheDir, maxInputLength: 128 }));
    try {
      await srv.ready;
      const metrics = await (await fetch(`${srv.url}/metrics`)).text();
      const attentions = (model: string) => Number(new RegExp(`^slabserve_model_fused_attentions\\{[^}]*model="${model}"[^}]*\\} (\\S+)$`, 'm').exec(metrics)?.[1]);
      expect(attentions('bert-model')).toBe(LAYERS);
      const at = (path: string, body: object) => fetch(`${srv.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }).then((r) => r.json());
      const hidden = await textsOf(CASES.filter((c) => FP16.includes(c.name) && c.head === 'hidden'), 'checkpoint fp16 hidden', 6);
      const hiddenWants = await referencesOf(hidden.map(({ c, encodings }) => ({ c, head: 'hidden', encodings })));
      for (const [n, { c, texts }] of hidden.entries()) {
        let worst = 0;
        let fromFp32 = 0;
        for (const [i, t] of texts.entries()) {
          const [half, full] = (await Promise.all([at('/embed_all', { model: c.name, inputs: t }), post('/embed_all', { model: c.name, inputs: t })])) as number[][][][];
          worst = Math.max(worst, relativeDiff(half![0]!.flat(), hiddenWants[n]![i]!, `${c.name} text ${i}`));
          fromFp32 = Math.max(fromFp32, worstDiff(half![0]!.flat(), full![0]!.flat(), `${c.name} text ${i}`));
        }
        console.log(`${c.name} in float16: worst |diff| / scale ${worst.toExponential(2)}; from the float32 graph's ${fromFp32.toExponential(2)}`);
        expect(worst).toBeLessThan(1e-2);
        expect(fromFp32, `${c.name}: float16 arithmetic shows`).toBeGreaterThan(1e-5);
      }
      const heads = await textsOf(CASES.filter((c) => FP16.includes(c.name) && c.head === 'classify'), 'checkpoint fp16 classify', 6);
      const headWants = await referencesOf(heads.map(({ c, encodings }) => ({ c, head: 'classify', encodings })));
      for (const [n, { c, texts }] of heads.entries()) {
        const labels = Array.from({ length: c.labels! }, (_, i) => `L${i}`);
        let worst = 0;
        for (const [i, t] of texts.entries()) {
          const got = (await at('/predict', { model: c.name, inputs: t, raw_scores: true })) as { label: string; score: number }[];
          worst = Math.max(worst, relativeDiff(labels.map((l) => got.find((x) => x.label === l)!.score), headWants[n]![i]!, `${c.name} text ${i}`));
        }
        console.log(`${c.name} in float16: worst logit |diff| / scale ${worst.toExponential(2)}`);
        expect(worst).toBeLessThan(1e-2);
      }
    } finally {
      await srv.close();
    }
  });
});

describe("--weights: which of a folder's graph and checkpoint serves", () => {
  it('auto: the graph where there is one, else the checkpoint; checkpoint: the checkpoint beside a graph; graph: never the checkpoint', () => {
    const both = join(root, 'both');
    cpSync(join(root, 'bert-export'), both, { recursive: true });
    cpSync(join(dirs.get('bert-model')!, 'model.safetensors'), join(both, 'model.safetensors'));
    const cacheDir = join(root, 'weights-graphs');
    const spec = (dir: string, weights?: 'auto' | 'graph' | 'checkpoint', dtype?: Dtype) =>
      loadModelSpec(dir, 'x', { ...(weights ? { weights } : {}), ...(dtype ? { dtype } : {}) }, {}, (head, dtype) => checkpointGraph('x', dir, head, { cacheDir, dtype, log: () => {} }));
    expect(spec(both).onnxPath).toBe(join(both, 'model.onnx'));
    expect(spec(both, 'graph').onnxPath).toBe(join(both, 'model.onnx'));
    const built = spec(both, 'checkpoint');
    expect(built.onnxPath.startsWith(cacheDir)).toBe(true);
    expect([built.dtype, built.sources.dtype]).toEqual(['fp32', 'built from model.safetensors (BertModel), fp32: default']);
    expect(spec(dirs.get('bert-model')!).onnxPath.startsWith(cacheDir)).toBe(true);
    expect(() => spec(dirs.get('bert-model')!, 'graph')).toThrow(/no model\.onnx or onnx\/model\.onnx/);
    expect(() => spec(join(root, 'bert-export'), 'checkpoint')).toThrow(/--weights checkpoint, but .* has no checkpoint/);
    expect(() => spec(dirs.get('bert-model')!, undefined, 'int8')).toThrow(/--dtype int8: a graph built from a checkpoint \(model\.safetensors\) computes in fp32 or fp16/);
    const empty = join(root, 'no-weights');
    cpSync(dirs.get('bert-model')!, empty, { recursive: true });
    rmSync(join(empty, 'model.safetensors'));
    expect(() => spec(empty)).toThrow(/has no ONNX graph \(model\.onnx, onnx\/model\.onnx, \.\.\.\) and no checkpoint/);
  });
});

describe("MPNet's relative position buckets", () => {
  it("are transformers' (its float32 computation in torch) at every distance from -600 to 600", async () => {
    const want = (await reference<{ buckets: number[] }>({ buckets: 600 })).buckets;
    expect(want.map((_, k) => relativeBucket(k - 600))).toEqual(want);
  });
});

describe('the graph cache', () => {
  it('builds a checkpoint once: the next load opens the cached graph; a changed config or checkpoint builds again', () => {
    const dir = join(root, 'cache-case');
    cpSync(dirs.get('bert-model')!, dir, { recursive: true });
    const cacheDir = join(root, 'cache-of-its-own');
    const lines: string[] = [];
    const build = () => checkpointGraph('cache-case', dir, 'hidden', { cacheDir, log: (l) => lines.push(l) })!;
    const first = build();
    const second = build();
    expect(second.path).toBe(first.path);
    expect(lines.map((l) => (/built its graph/.test(l) ? 'built' : /before/.test(l) ? 'cached' : l))).toEqual(['built', 'cached']);
    expect(first.source).toBe('built from model.safetensors (BertModel)');
    // Another head is another graph; a changed config (or weights) another key.
    expect(checkpointGraph('cache-case', dir, 'hidden', { cacheDir, log: () => {} })!.path).toBe(first.path);
    const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...config, layer_norm_eps: 1e-6 }));
    expect(build().path).not.toBe(first.path);
    const weights = readFileSync(join(dir, 'model.safetensors'));
    weights[weights.length - 1] ^= 1;
    writeFileSync(join(dir, 'model.safetensors'), weights);
    const third = build();
    expect(lines.filter((l) => /built its graph/.test(l))).toHaveLength(3);
    expect(existsSync(third.path)).toBe(true);
  });

  it('is hashed and built on a thread of its own: the main thread runs its callbacks before the build has finished', async () => {
    /** `start`'s build, with how many main-thread callbacks (setImmediate) had run when it logged that it built the graph. */
    const ticksBefore = async <T>(start: (log: (line: string) => void) => Promise<T>) => {
      let ticks = 0;
      let building = true;
      const tick = () => {
        ticks++;
        if (building) setImmediate(tick);
      };
      setImmediate(tick);
      let builtAt: number | undefined;
      const result = await start((line) => {
        if (/built its graph/.test(line)) builtAt = ticks;
      }).finally(() => (building = false));
      return { result, builtAt };
    };
    const opts = { cacheDir: join(root, 'off-thread-graphs'), dtype: 'fp32' as const, log: () => {} };
    const built = await ticksBefore((log) => checkpointGraphOffThread('off-thread', dirs.get('bert-model')!, 'hidden', { ...opts, log }));
    expect(built.builtAt).toBeGreaterThan(0);
    expect(existsSync(built.result!.path)).toBe(true);
    // As a load plans it (the server's and the repository's path), into a cache of its own so it builds again.
    const planning = { overrides: {}, slotsPerModel: 4, owners: 1, graphCacheDir: join(root, 'off-thread-planned') };
    const planned = await ticksBefore((warn) => planModel({ name: 'planned', dir: dirs.get('bert-model')! }, 0, { ...planning, warn }));
    expect(planned.builtAt).toBeGreaterThan(0);
    expect(planned.result.spec.onnxPath.startsWith(planning.graphCacheDir)).toBe(true);
    // Its refusals are checkpointGraph's, word for word.
    const wider = join(root, 'off-thread-wider');
    cpSync(dirs.get('bert-model')!, wider, { recursive: true });
    writeFileSync(join(wider, 'config.json'), JSON.stringify({ ...(JSON.parse(readFileSync(join(wider, 'config.json'), 'utf8')) as object), intermediate_size: 96 }));
    let reason = '';
    try {
      checkpointGraph('wider', wider, 'hidden', opts);
    } catch (err) {
      reason = (err as Error).message;
    }
    expect(reason).toMatch(/intermediate\.dense\.weight has shape \[128, 64\], the config needs \[96, 64\]/);
    await expect(checkpointGraphOffThread('wider', wider, 'hidden', opts)).rejects.toThrow(reason);
  });
});

describe('refusals, each naming the file and what is wrong', () => {
  /** A copy of bert-model (or `from`) changed by `change`, loaded as the server loads it. */
  const broken = (name: string, change: (dir: string) => void, from = 'bert-model') => {
    const dir = join(root, 'bad', name);
    cpSync(dirs.get(from)!, dir, { recursive: true });
    change(dir);
    return () => loadModelSpec(dir, name, {}, {}, (head, dtype) => checkpointGraph(name, dir, head, { cacheDir: join(root, 'bad-graphs'), dtype, log: () => {} }));
  };
  const editConfig = (dir: string, edit: (c: Record<string, unknown>) => Record<string, unknown>) =>
    writeFileSync(join(dir, 'config.json'), JSON.stringify(edit(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>)));
  const weightsOf = (dir: string) => join(dir, 'model.safetensors');

  it('a config without a size the builder needs, or with one the weights do not have', () => {
    expect(broken('no-heads', (d) => editConfig(d, ({ num_attention_heads: _, ...c }) => c))).toThrow(/config\.json: num_attention_heads is missing/);
    expect(broken('wider', (d) => editConfig(d, (c) => ({ ...c, intermediate_size: 96 })))).toThrow(
      /model\.safetensors: tensor encoder\.layer\.0\.intermediate\.dense\.weight has shape \[128, 64\], the config needs \[96, 64\]/,
    );
    expect(broken('relative', (d) => editConfig(d, (c) => ({ ...c, position_embedding_type: 'relative_key' })))).toThrow(/position_embedding_type "relative_key" is not built/);
    expect(broken('gpt2', (d) => editConfig(d, (c) => ({ ...c, architectures: ['GPT2Model'] })))).toThrow(/architecture GPT2Model is not one slabserve builds from a checkpoint; it builds BertModel, .*ElectraForSequenceClassification/);
    expect(broken('act', (d) => editConfig(d, (c) => ({ ...c, hidden_act: 'quick_gelu' })))).toThrow(/hidden_act "quick_gelu" is not an activation slabserve builds/);
  });

  it('a missing tensor, a truncated file, a weight type it does not read', () => {
    const without = (name: string) => (d: string) => {
      const sd = tensorsOf(readFileSync(weightsOf(d)));
      delete sd[name];
      writeFileSync(weightsOf(d), encodeSafetensors(sd));
    };
    expect(broken('missing', without('encoder.layer.1.output.LayerNorm.weight'))).toThrow(/the checkpoint has no tensor encoder\.layer\.1\.output\.LayerNorm\.weight/);
    expect(broken('truncated', (d) => writeFileSync(weightsOf(d), readFileSync(weightsOf(d)).subarray(0, 100_000)))).toThrow(/model\.safetensors: tensor .* lie past the end of the file \(truncated\?\)/);
    expect(broken('float64', (d) => writeFileSync(weightsOf(d), withDtype(readFileSync(weightsOf(d)), 'embeddings.LayerNorm.bias', 'F64')))).toThrow(/tensor embeddings\.LayerNorm\.bias is F64; F32, F16 and BF16 weights are read/);
    expect(broken('bin-truncated', (d) => writeFileSync(join(d, 'pytorch_model.bin'), readFileSync(join(d, 'pytorch_model.bin')).subarray(0, 5000)), 'xlmr-rerank')).toThrow(/pytorch_model\.bin: not a zip archive/);
  });

  it("a pickle that names anything but a state dict's parts (here os.system) is refused before anything is built, and never run", async () => {
    const evil = join(root, 'evil.bin');
    await reference({ save_evil: evil });
    expect(
      broken('evil', (d) => {
        rmSync(weightsOf(d));
        cpSync(evil, join(d, 'pytorch_model.bin'));
      }),
    ).toThrow(/pytorch_model\.bin: not a plain state dict: it names posix\.system, which a state dict never does/);
  });

  it('while serving: a load of a broken checkpoint leaves the model UNAVAILABLE with the reason, and the others serving', async () => {
    const repo = join(root, 'repo');
    for (const [name, from] of [['good', 'bert-model'], ['intent', 'bert-intent']] as const) cpSync(dirs.get(from)!, join(repo, name), { recursive: true });
    cpSync(join(root, 'bad', 'wider'), join(repo, 'wider'), { recursive: true });
    // At start, the server refuses with the reason.
    await expect(startServer(testServerConfig({ modelsDir: repo, models: ['wider'], graphCacheDir: join(root, 'graphs') }))).rejects.toThrow(/intermediate\.dense\.weight has shape \[128, 64\], the config needs \[96, 64\]/);
    const srv = await startServer(testServerConfig({ modelsDir: repo, models: ['good'], modelControlMode: 'explicit', graphCacheDir: join(root, 'graphs') }));
    try {
      await srv.ready;
      const load = async (name: string) => fetch(`${srv.url}/v2/repository/models/${name}/load`, { method: 'POST' });
      const bad = await load('wider');
      expect(bad.status).toBe(400);
      expect(((await bad.json()) as { error: string }).error).toMatch(/intermediate\.dense\.weight has shape \[128, 64\], the config needs \[96, 64\]/);
      const index = (await (await fetch(`${srv.url}/v2/repository/index`, { method: 'POST' })).json()) as { name: string; state: string; reason: string }[];
      expect(index.find((e) => e.name === 'wider')).toMatchObject({ state: 'UNAVAILABLE', reason: expect.stringMatching(/intermediate\.dense\.weight/) });
      expect((await load('intent')).status).toBe(200);
      const embed = await fetch(`${srv.url}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'good', inputs: 'where is my parcel' }) });
      expect(embed.status).toBe(200);
      const predict = await fetch(`${srv.url}/predict`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'intent', inputs: 'where is my parcel' }) });
      expect(predict.status).toBe(200);
    } finally {
      await srv.close();
    }
  });
});

/** Every tensor of a safetensors file of F32 tensors (the test's own reading: header and bytes). */
function tensorsOf(bytes: Buffer): Record<string, F32Tensor> {
  const n = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + n).toString('utf8')) as Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;
  const out: Record<string, F32Tensor> = {};
  for (const [name, t] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const raw = bytes.subarray(8 + n + t.data_offsets[0], 8 + n + t.data_offsets[1]);
    out[name] = { shape: t.shape, data: new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength)) };
  }
  return out;
}

/** The file with one F32 tensor rewritten as `dtype` (F64: each value widened), the header's offsets moved to fit. */
function withDtype(bytes: Buffer, name: string, dtype: 'F64'): Buffer {
  const sd = tensorsOf(bytes);
  const header: Record<string, unknown> = {};
  const parts: Buffer[] = [];
  let at = 0;
  for (const [k, t] of Object.entries(sd)) {
    const data = k === name ? Buffer.from(Float64Array.from(t.data).buffer) : Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    header[k] = { dtype: k === name ? dtype : 'F32', shape: t.shape, data_offsets: [at, at + data.length] };
    parts.push(data);
    at += data.length;
  }
  const json = Buffer.from(JSON.stringify(header));
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(json.length));
  return Buffer.concat([length, json, ...parts]);
}
