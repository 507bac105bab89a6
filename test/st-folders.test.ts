/**
 * sentence-transformers folders, served as sentence-transformers computes
 * them: the pooling its 1_Pooling/config.json names, the Normalize module
 * or its absence, sentence_bert_config.json's max_seq_length, a folder path
 * as --model. Each folder is the generated tiny-embed graph (random weights)
 * with the files a sentence-transformers export carries.
 *
 * The reference is independent of the server's graph: a plain onnxruntime
 * session of the unmodified model.onnx, one input at a time, unpadded, whose
 * last_hidden_state is pooled and normalised here, by this file's own code.
 * The server answers the same inputs sent all at once (batched and padded;
 * queued before the inference loop takes them in, so the batches they make
 * can be counted: test/fixtures/queued-together.ts).
 */
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULTS } from '../dist/src/shared/options.js';

const INLINE_TOKENIZE_CHARS = DEFAULTS.inlineTokenizeChars;
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { createEngine } from '../dist/src/main/engine.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { loadModelSpec, type Pooling } from '../dist/src/shared/model-format/model-config.js';
import { decodeModel, encodeModel, makeTensor } from '../dist/src/shared/model-format/onnx-graph.js';
import { parseMetrics } from './fixtures/http-client.js';
import { batchesOfQueued, sentTogether, servedBatching } from './fixtures/queued-together.js';
import { makeRandom, maxAbsDiff, modelsDir, randomTexts, testServerConfig, vocabularyWords } from './helpers.js';

// Read by startServer: the batched checks hold the inference loop while they queue their requests (sentTogether).
process.env.SLABSERVE_TEST_HOOKS = '1';

const TOLERANCE = 1e-5;
const HIDDEN = 128;
const MAX_SEQ_LENGTH = 48;
const POOLINGS: Pooling[] = ['cls', 'mean', 'max', 'mean_sqrt_len', 'weightedmean', 'lasttoken'];
const POOLING_KEYS: Record<Pooling, string> = {
  cls: 'pooling_mode_cls_token',
  mean: 'pooling_mode_mean_tokens',
  max: 'pooling_mode_max_tokens',
  mean_sqrt_len: 'pooling_mode_mean_sqrt_len_tokens',
  weightedmean: 'pooling_mode_weightedmean_tokens',
  lasttoken: 'pooling_mode_lasttoken',
};
const MODULE = (kind: string, idx: number, path: string) => ({ idx, name: String(idx), path, type: `sentence_transformers.models.${kind}` });

let root: string;
/** What the tests use of a Rust `tokenizers` Tokenizer that truncates. */
interface RustTruncating {
  setTruncation(maxLength: number, options: { direction: 'right' | 'left' }): void;
  encode(text: string): Promise<{ getIds(): number[] }>;
}
const E5_PROMPTS = { query: 'query: ', passage: 'passage: ' };
/** The folders with include_prompt false: [CLS] (which ignores it) and modes that read the mask. */
const INSTRUCT_POOLINGS: Pooling[] = ['mean', 'max', 'weightedmean', 'cls'];
/** A folder with a tokenizer that keeps case, and sentence_bert_config.json's do_lower_case `lower`. */
function casedFolder(name: string, lower: boolean): string {
  const tokenizer = JSON.parse(readFileSync(join(modelsDir, 'tiny-embed', 'tokenizer.json'), 'utf8')) as { normalizer: Record<string, unknown> };
  const casedTokenizer = { ...tokenizer, normalizer: { ...tokenizer.normalizer, lowercase: false, strip_accents: false } };
  return stFolder(name, { pooling: 'mean', files: { 'sentence_bert_config.json': { do_lower_case: lower }, 'tokenizer.json': casedTokenizer } });
}
/** Folders served with a Normalize module: all but mean_sqrt_len, which normalised is mean's direction. */
const NORMALIZED = (p: Pooling) => p !== 'mean_sqrt_len';

/** A sentence-transformers folder around tiny-embed's graph and tokenizer; `files` add to or replace its files. */
function stFolder(name: string, opts: { pooling?: Pooling | Pooling[]; normalize?: boolean; includePrompt?: boolean; files?: Record<string, unknown> } = {}): string {
  const dir = join(root, name);
  mkdirSync(join(dir, '1_Pooling'), { recursive: true });
  for (const f of ['config.json', 'model.onnx', 'tokenizer.json', 'tokenizer_config.json']) cpSync(join(modelsDir, 'tiny-embed', f), join(dir, f));
  const modules = [MODULE('Transformer', 0, ''), MODULE('Pooling', 1, '1_Pooling')];
  if (opts.normalize !== false) modules.push(MODULE('Normalize', 2, '2_Normalize'));
  writeFileSync(join(dir, 'modules.json'), JSON.stringify(modules));
  const on = opts.pooling === undefined ? [] : Array.isArray(opts.pooling) ? opts.pooling : [opts.pooling];
  if (opts.pooling !== undefined) {
    const config: Record<string, unknown> = { word_embedding_dimension: HIDDEN, include_prompt: opts.includePrompt ?? true };
    for (const p of POOLINGS) config[POOLING_KEYS[p]] = on.includes(p);
    writeFileSync(join(dir, '1_Pooling', 'config.json'), JSON.stringify(config));
  } else {
    rmSync(join(dir, '1_Pooling'), { recursive: true });
    writeFileSync(join(dir, 'modules.json'), JSON.stringify(modules.filter((m) => !m.type.endsWith('Pooling'))));
  }
  for (const [file, content] of Object.entries(opts.files ?? {})) {
    mkdirSync(join(dir, file, '..'), { recursive: true });
    writeFileSync(join(dir, file), typeof content === 'string' ? content : JSON.stringify(content));
  }
  return dir;
}

/**
 * tiny-embed's graph without a token_type_ids input (as DistilBERT and most
 * XLM-RoBERTa exports are): its uses read zeros made from input_ids instead,
 * so its token states are tiny-embed's with type ids 0.
 */
function withoutTokenTypes(onnxPath: string): Uint8Array {
  const model = decodeModel(readFileSync(onnxPath));
  const g = model.graph!;
  g.input = g.input!.filter((i) => i.name !== 'token_type_ids');
  g.initializer!.push(makeTensor('test_zero', 'int64', [0], []));
  g.node!.unshift({ name: 'test_zero_types', opType: 'Mul', input: ['input_ids', 'test_zero'], output: ['test_token_type_ids'] });
  for (const n of g.node!) n.input = n.input!.map((x) => (x === 'token_type_ids' ? 'test_token_type_ids' : x));
  return encodeModel(model);
}

/**
 * tiny-embed's graph taking position_ids as an input (as decoders and some
 * exports do) instead of computing arange(T): fed 0..n-1, its token states
 * are tiny-embed's.
 */
function withPositionIdsInput(onnxPath: string): Uint8Array {
  const model = decodeModel(readFileSync(onnxPath));
  const g = model.graph!;
  const range = g.node!.find((n) => n.opType === 'Range')!;
  const computed = range.output![0]!;
  const ids = g.input!.find((i) => i.name === 'input_ids')!;
  g.input!.push({ ...ids, name: 'position_ids' });
  for (const n of g.node!) n.input = n.input!.map((x) => (x === computed ? 'position_ids' : x));
  return encodeModel(model);
}

/** The graph with its output `name` cast to float16 (what an fp16 export's output is), as onnx/model_fp16.onnx. */
function withFp16Output(onnxPath: string, name: string): Uint8Array {
  const model = decodeModel(readFileSync(onnxPath));
  const g = model.graph!;
  for (const n of g.node!) n.output = n.output!.map((x) => (x === name ? `${name}_float` : x));
  g.node!.push({ name: 'test_to_fp16', opType: 'Cast', input: [`${name}_float`], output: [name], attribute: [{ name: 'to', type: 2, i: 10 }] });
  g.output!.find((o) => o.name === name)!.type!.tensorType!.elemType = 10; // FLOAT16
  return encodeModel(model);
}

// ------------------------------------------------------------------ the independent reference

let plain: ort.InferenceSession;
let tok: TextTokenizer;

/** last_hidden_state of one input alone ([T, H] rows), from the unmodified graph. */
async function tokenStates(ids: Int32Array): Promise<Float32Array[]> {
  const n = ids.length;
  const i64 = (f: (i: number) => number) => new ort.Tensor('int64', BigInt64Array.from({ length: n }, (_, i) => BigInt(f(i))), [1, n]);
  const out = await plain.run({ input_ids: i64((i) => ids[i]!), attention_mask: i64(() => 1), token_type_ids: i64(() => 0) });
  const data = out.last_hidden_state!.data as Float32Array;
  return Array.from({ length: n }, (_, t) => data.slice(t * HIDDEN, (t + 1) * HIDDEN));
}

/**
 * sentence-transformers' Pooling module over the tokens of one unpadded input
 * from token `from` on (include_prompt false leaves the first ones out; [CLS]
 * pooling takes token 0 regardless), then Normalize if asked.
 */
function pooled(states: Float32Array[], mode: Pooling, normalize: boolean, from = 0): Float32Array {
  const out = new Float32Array(HIDDEN);
  const n = states.length;
  const kept = n - from;
  for (let h = 0; h < HIDDEN; h++) {
    const col = states.map((s) => s[h]!).slice(from);
    const sum = col.reduce((a, v) => a + v, 0);
    if (mode === 'cls') out[h] = states[0]![h]!;
    else if (mode === 'lasttoken') out[h] = col[kept - 1]!;
    else if (mode === 'mean') out[h] = sum / kept;
    else if (mode === 'mean_sqrt_len') out[h] = sum / Math.sqrt(kept);
    else if (mode === 'max') out[h] = Math.max(...col);
    else {
      // weightedmean: weight t + 1 at position t, over the kept positions
      let weights = 0;
      for (let t = from; t < n; t++) weights += t + 1;
      out[h] = col.reduce((a, v, k) => a + v * (from + k + 1), 0) / weights;
    }
  }
  if (!normalize) return out;
  const norm = Math.hypot(...out);
  return out.map((v) => v / Math.max(norm, 1e-12));
}

// ------------------------------------------------------------------ the server

let server: Server;
const logs: string[] = [];
const base = () => `http://127.0.0.1:${server.port}`;

async function post(path: string, body: unknown): Promise<{ status: number; body: any }> {
  const r = await fetch(base() + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), 'slabserve-st-'));
  for (const p of POOLINGS) stFolder(`st-${p}`, { pooling: p, normalize: NORMALIZED(p) });
  stFolder('st-mean-unnormalised', { pooling: 'mean', normalize: false });
  stFolder('st-short', { pooling: 'cls', files: { 'sentence_bert_config.json': { max_seq_length: MAX_SEQ_LENGTH, do_lower_case: false } } });
  stFolder('st-no-pooling');
  writeFileSync(join(stFolder('st-no-types', { pooling: 'mean' }), 'model.onnx'), withoutTokenTypes(join(modelsDir, 'tiny-embed', 'model.onnx')));
  writeFileSync(join(stFolder('st-positions', { pooling: 'mean' }), 'model.onnx'), withPositionIdsInput(join(modelsDir, 'tiny-embed', 'model.onnx')));
  stFolder('st-e5', { pooling: 'mean', files: { 'config_sentence_transformers.json': { prompts: E5_PROMPTS, default_prompt_name: 'query' } } });
  casedFolder('cased-lowered', true);
  casedFolder('cased-as-is', false);
  for (const mode of INSTRUCT_POOLINGS) {
    stFolder(`st-instruct-${mode}`, { pooling: mode, includePrompt: false, files: { 'config_sentence_transformers.json': { prompts: E5_PROMPTS, default_prompt_name: 'query' } } });
  }
  const spec = loadModelSpec(join(modelsDir, 'tiny-embed'), 'tiny-embed');
  plain = await ort.InferenceSession.create(readFileSync(spec.onnxPath), { executionProviders: ['cpu'], intraOpNumThreads: 1 });
  tok = await loadTokenizer(spec.tokenizerPath);
  const models = [
    ...POOLINGS.map((p) => `st-${p}`),
    ...['st-mean-unnormalised', 'st-short', 'st-no-pooling', 'st-e5', 'st-no-types', 'st-positions'],
    ...INSTRUCT_POOLINGS.map((p) => `st-instruct-${p}`),
    'cased-lowered',
  ].map((m) => join(root, m));
  server = await startServer(testServerConfig({ models, batching: { maxBatchTokens: 4096 }, log: (l) => logs.push(l) }));
  await server.ready;
}, 120_000);

afterAll(async () => {
  await server?.close();
  await plain?.release();
  if (root) rmSync(root, { recursive: true, force: true });
});

describe('a sentence-transformers folder is served with its own pooling and normalisation', () => {
  it('every pooling mode: batched rows equal the unmodified graph pooled by hand, one input at a time', async () => {
    const rand = makeRandom('st pooling');
    const texts = randomTexts(rand, vocabularyWords(loadModelSpec(join(root, 'st-mean'))), 24, 40);
    const before = parseMetrics(await (await fetch(base() + '/metrics')).text());
    const refs = await Promise.all(texts.map(async (t) => tokenStates(tok.encode(t, { maxLength: 512, truncate: false }).ids)));
    const cases = [...POOLINGS.map((p) => ({ model: `st-${p}`, mode: p, normalize: NORMALIZED(p) })), { model: 'st-mean-unnormalised', mode: 'mean' as Pooling, normalize: false }];
    // All queued at once, every model: the server batches and pads them.
    const answers = await sentTogether(server.testHooks, Object.fromEntries(cases.map((c) => [c.model, texts.length])), () =>
      Promise.all(cases.flatMap((c) => texts.map((t) => post('/embed', { model: c.model, inputs: t })))),
    );
    const lengths = texts.map((t) => tok.encode(t, { maxLength: 512, truncate: false }).ids.length);
    const after = parseMetrics(await (await fetch(base() + '/metrics')).text());
    for (const [ci, c] of cases.entries()) {
      let worst = 0;
      for (const [i, t] of texts.entries()) {
        const a = answers[ci * texts.length + i]!;
        expect(a.status, `${c.model} ${t}: ${JSON.stringify(a.body)}`).toBe(200);
        worst = Math.max(worst, maxAbsDiff(a.body[0], pooled(refs[i]!, c.mode, c.normalize)));
      }
      expect(worst, c.model).toBeLessThan(TOLERANCE);
      // Batched: exactly the batches their buckets make, fewer than requests for this model.
      const d = (name: string) => after.sum(name, { model: c.model }) - before.sum(name, { model: c.model });
      expect(d('slabserve_batch_size_sum')).toBe(texts.length);
      expect(d('slabserve_batch_size_count'), c.model).toBe(batchesOfQueued(lengths, await servedBatching(base(), c.model)));
      expect(d('slabserve_batch_size_count')).toBeLessThan(texts.length);
    }
  });

  it('the comparison is sharp: the rows of every two of those folders are far apart', async () => {
    const states = await tokenStates(tok.encode('where is my parcel it was due yesterday', { maxLength: 512, truncate: false }).ids);
    const served = POOLINGS.map((p) => ({ p, row: pooled(states, p, NORMALIZED(p)) }));
    for (const a of served) for (const b of served) if (a.p < b.p) expect(maxAbsDiff(a.row, b.row), `${a.p} vs ${b.p}`).toBeGreaterThan(1e-3);
    expect(maxAbsDiff(pooled(states, 'mean', true), pooled(states, 'mean', false))).toBeGreaterThan(1e-3);
  });

  it('/info and the start-up lines say what was chosen and from which file', async () => {
    const info = (await (await fetch(base() + '/info')).json()) as { models: { name: string; pooling?: string; normalize?: boolean; maxLength: number; sources: Record<string, string> }[] };
    const m = (name: string) => info.models.find((x) => x.name === name)!;
    expect(m('st-lasttoken')).toMatchObject({ pooling: 'lasttoken', normalize: true, maxLength: 512, sources: { pooling: '1_Pooling/config.json', normalize: 'modules.json', maxLength: 'config.json' } });
    expect(m('st-mean-unnormalised')).toMatchObject({ pooling: 'mean', normalize: false, sources: { normalize: 'modules.json' } });
    expect(m('st-short')).toMatchObject({ pooling: 'cls', maxLength: MAX_SEQ_LENGTH, sources: { maxLength: 'sentence_bert_config.json' } });
    expect(m('st-no-pooling')).toMatchObject({ pooling: 'mean', sources: { pooling: 'default' } });
    expect(logs.some((l) => /model st-max .*pooling=max \(1_Pooling\/config\.json\)/.test(l))).toBe(true);
    expect(logs.filter((l) => /warning: model st-no-pooling: the folder names no pooling/.test(l))).toHaveLength(1);
    expect(logs.filter((l) => /warning/.test(l) && !l.includes('st-no-pooling'))).toEqual([]);
  });
});

describe('a graph without token_type_ids (the DistilBERT / XLM-RoBERTa layout)', () => {
  it('is fed only the inputs it has: batched rows equal the reference; /info and KServe metadata list its real inputs', async () => {
    const rand = makeRandom('st no token types');
    const texts = randomTexts(rand, vocabularyWords(loadModelSpec(join(root, 'st-no-types'))), 16, 40);
    const answers = await Promise.all(texts.map((t) => post('/embed', { model: 'st-no-types', inputs: t })));
    for (const [i, t] of texts.entries()) {
      expect(answers[i]!.status, JSON.stringify(answers[i]!.body)).toBe(200);
      expect(maxAbsDiff(answers[i]!.body[0], pooled(await tokenStates(tok.encode(t, { maxLength: 512, truncate: false }).ids), 'mean', true))).toBeLessThan(TOLERANCE);
    }
    const info = (await (await fetch(base() + '/info')).json()) as { models: { name: string; inputs: string[] }[] };
    expect(info.models.find((m) => m.name === 'st-no-types')!.inputs).toEqual(['input_ids', 'attention_mask']);
    expect(info.models.find((m) => m.name === 'st-mean')!.inputs).toEqual(['input_ids', 'attention_mask', 'token_type_ids']);
    const meta = (await (await fetch(base() + '/v2/models/st-no-types')).json()) as { inputs: { name: string }[] };
    expect(meta.inputs.map((i) => i.name)).toEqual(['input_ids', 'attention_mask', 'text']);
  });

  it('a graph that takes position_ids is fed 0..n-1 on each right-padded row: batched rows equal the reference', async () => {
    const rand = makeRandom('st position ids');
    const texts = randomTexts(rand, vocabularyWords(loadModelSpec(join(root, 'st-positions'))), 16, 60);
    const answers = await Promise.all(texts.map((t) => post('/embed', { model: 'st-positions', inputs: t })));
    for (const [i, t] of texts.entries()) {
      expect(answers[i]!.status, JSON.stringify(answers[i]!.body)).toBe(200);
      expect(maxAbsDiff(answers[i]!.body[0], pooled(await tokenStates(tok.encode(t, { maxLength: 512, truncate: false }).ids), 'mean', true))).toBeLessThan(TOLERANCE);
    }
    const info = (await (await fetch(base() + '/info')).json()) as { models: { name: string; inputs: string[] }[] };
    expect(info.models.find((m) => m.name === 'st-positions')!.inputs).toEqual(['input_ids', 'attention_mask', 'token_type_ids', 'position_ids']);
  });

  it('a graph without input_ids, or a file that is not ONNX, is refused at start naming what is wrong', () => {
    const model = decodeModel(readFileSync(join(modelsDir, 'tiny-embed', 'model.onnx')));
    const rename = (from: string, to: string) => {
      const copy = decodeModel(encodeModel(model));
      for (const i of copy.graph!.input!) if (i.name === from) i.name = to;
      for (const n of copy.graph!.node!) n.input = n.input!.map((x) => (x === from ? to : x));
      return encodeModel(copy);
    };
    const noIds = stFolder('no-ids', { pooling: 'mean' });
    writeFileSync(join(noIds, 'model.onnx'), rename('input_ids', 'ids'));
    expect(() => loadModelSpec(noIds)).toThrow(/the graph has no input "input_ids" \(its inputs: ids, attention_mask, token_type_ids\)/);
    const notOnnx = stFolder('not-onnx', { pooling: 'mean' });
    writeFileSync(join(notOnnx, 'model.onnx'), 'this is not a model');
    expect(() => loadModelSpec(notOnnx)).toThrow(/model\.onnx: an unknown protobuf wire type \d: not an ONNX model/);
  });
});

describe('--dtype: which of the folder\'s graphs', () => {
  it('fp16 (onnx/model_fp16.onnx) is served with float32 rows, embeddings and logits; auto on CPU and fp32 take model.onnx; a missing one is named', async () => {
    const embedDir = stFolder('st-dtypes', { pooling: 'mean' });
    mkdirSync(join(embedDir, 'onnx'));
    writeFileSync(join(embedDir, 'onnx', 'model_fp16.onnx'), withFp16Output(join(modelsDir, 'tiny-embed', 'model.onnx'), 'last_hidden_state'));
    const intentDir = join(root, 'intent-dtypes');
    cpSync(join(modelsDir, 'tiny-intent'), intentDir, { recursive: true });
    writeFileSync(join(intentDir, 'model_fp16.onnx'), withFp16Output(join(modelsDir, 'tiny-intent', 'model.onnx'), 'logits'));
    expect(loadModelSpec(embedDir)).toMatchObject({ dtype: 'fp32', sources: { dtype: 'default' } }); // auto, not on CUDA
    expect(loadModelSpec(embedDir, undefined, { onCuda: true })).toMatchObject({ dtype: 'fp16', sources: { dtype: 'default (CUDA)' } });
    expect(loadModelSpec(embedDir, undefined, { dtype: 'fp16' }).onnxPath).toBe(join(embedDir, 'onnx', 'model_fp16.onnx'));
    expect(() => loadModelSpec(embedDir, undefined, { dtype: 'int8' })).toThrow(/--dtype int8 but .* has no model_int8\.onnx or model_quantized\.onnx .*; it has: fp32, fp16/);

    const engine = await createEngine({ device: 'cpu', models: [embedDir, intentDir], dtype: 'fp16', log: () => {} });
    const plainIntent = await ort.InferenceSession.create(readFileSync(join(modelsDir, 'tiny-intent', 'model.onnx')), { executionProviders: ['cpu'], intraOpNumThreads: 1 });
    const intentTok = await loadTokenizer(join(modelsDir, 'tiny-intent', 'tokenizer.json'));
    try {
      expect(engine.info().map((m) => m.dtype)).toEqual(['fp16', 'fp16']);
      const rand = makeRandom('st fp16');
      const texts = randomTexts(rand, vocabularyWords(loadModelSpec(embedDir)), 12, 40);
      const rows = await Promise.all(texts.map((t) => engine.embed(t)));
      let worst = 0;
      for (const [i, t] of texts.entries()) {
        expect(rows[i]![0]).toBeInstanceOf(Float32Array);
        worst = Math.max(worst, maxAbsDiff(rows[i]![0]!, pooled(await tokenStates(tok.encode(t, { maxLength: 512, truncate: false }).ids), 'mean', true)));
      }
      // float16 keeps about 3 decimal digits of each token state
      expect(worst).toBeLessThan(2e-3);
      const classes = await engine.classify(texts);
      for (const c of classes) {
        expect(c.probabilities.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 5);
        expect(Math.max(...c.logits.map((l, k) => Math.abs(Math.log(c.probabilities[k]!) - (l - Math.log(c.logits.reduce((a, x) => a + Math.exp(x), 0))))))).toBeLessThan(1e-4);
      }
      // The logits against the unmodified fp32 graph's, run here on each text alone: this graph differs from it
      // only in its output cast to float16, so each logit is within half a float16 step of the fp32 one
      // (2^-11 of its size), plus the float32 noise of running batched.
      let worstLogit = 0;
      for (const [i, t] of texts.entries()) {
        const ids = intentTok.encode(t, { maxLength: 512, truncate: false }).ids;
        const i64 = (f: (k: number) => number) => new ort.Tensor('int64', BigInt64Array.from({ length: ids.length }, (_, k) => BigInt(f(k))), [1, ids.length]);
        const want = (await plainIntent.run({ input_ids: i64((k) => ids[k]!), attention_mask: i64(() => 1), token_type_ids: i64(() => 0) })).logits!.data as Float32Array;
        expect(classes[i]!.logits).toHaveLength(want.length);
        want.forEach((w, k) => {
          const diff = Math.abs(classes[i]!.logits[k]! - w);
          worstLogit = Math.max(worstLogit, diff / (Math.abs(w) * 2 ** -11 + TOLERANCE));
          expect(diff, `text ${i} logit ${k}: ${classes[i]!.logits[k]} against ${w}`).toBeLessThan(Math.abs(w) * 2 ** -11 + TOLERANCE);
        });
      }
      console.log(`fp16 logits vs the fp32 graph: worst difference ${worstLogit.toFixed(3)} of the bound (half a float16 step + ${TOLERANCE}) over ${texts.length} texts`);
    } finally {
      await engine.close();
      await plainIntent.release();
    }
  });
});

describe("sentence_bert_config.json's max_seq_length is the limit", () => {
  it('longer inputs: 413 without truncate; with it, cut to max_seq_length on the side asked ([CLS] and [SEP] kept)', async () => {
    const rand = makeRandom('st max_seq_length');
    const words = vocabularyWords(loadModelSpec(join(root, 'st-short')));
    // 250-330 words each (under 512 tokens): six of them are past --inline-tokenize-chars at the ASCII pace (checked below).
    const long = Array.from({ length: 6 }, () => Array.from({ length: 250 + Math.floor(rand() * 80) }, () => words[Math.floor(rand() * words.length)]).join(' '));
    // The reference ids: the Rust tokenizers library's for the folder's tokenizer.json, truncated to max_seq_length.
    const rustCutting = (direction: 'right' | 'left') => {
      const t = (createRequire(import.meta.url)('tokenizers') as { Tokenizer: { fromFile(p: string): RustTruncating } }).Tokenizer.fromFile(join(root, 'st-short', 'tokenizer.json'));
      t.setTruncation(MAX_SEQ_LENGTH, { direction });
      return t;
    };
    const [rustRight, rustLeft] = [rustCutting('right'), rustCutting('left')];
    for (const text of long) {
      const full = tok.encode(text, { maxLength: 512, truncate: false }).ids;
      expect(full.length).toBeGreaterThan(MAX_SEQ_LENGTH);
      const refused = await post('/embed', { model: 'st-short', inputs: text });
      expect(refused.status, JSON.stringify(refused.body)).toBe(413);
      const cut = await post('/embed', { model: 'st-short', inputs: text, truncate: true });
      expect(cut.status).toBe(200);
      const ids = Int32Array.from((await rustRight.encode(text)).getIds());
      expect(ids.length).toBe(MAX_SEQ_LENGTH);
      expect(ids[ids.length - 1]).toBe(full[full.length - 1]); // [SEP] kept
      expect(maxAbsDiff(cut.body[0], pooled(await tokenStates(ids), 'cls', true))).toBeLessThan(TOLERANCE);
    }
    // truncation_direction left (TEI's "Left" too): the last tokens stay, [CLS] and [SEP] around them;
    // a client batch over --inline-tokenize-chars goes through the tokenizer pool, the same way.
    const fromLeft = (text: string) => {
      const body = tok.encode(text, { maxLength: 512, truncate: false }).ids;
      return Int32Array.from([body[0]!, ...body.subarray(body.length - (MAX_SEQ_LENGTH - 1), body.length - 1), body[body.length - 1]!]);
    };
    const left = await post('/embed', { model: 'st-short', inputs: long, truncate: true, truncation_direction: 'Left' });
    expect(long.reduce((n, t) => n + tok.paceChars(t), 0)).toBeGreaterThan(INLINE_TOKENIZE_CHARS);
    expect(left.status, JSON.stringify(left.body)).toBe(200);
    for (const [i, text] of long.entries()) {
      const ids = fromLeft(text);
      expect(Array.from(ids), 'the Rust library cuts the same tokens').toEqual((await rustLeft.encode(text)).getIds());
      expect(tok.encode(text, { maxLength: MAX_SEQ_LENGTH, truncate: true, direction: 'left' }).ids).toEqual(ids);
      expect(maxAbsDiff(left.body[i], pooled(await tokenStates(ids), 'cls', true))).toBeLessThan(TOLERANCE);
      const one = await post('/embed', { model: 'st-short', inputs: text, truncate: true, truncation_direction: 'left' });
      expect(maxAbsDiff(one.body[0], left.body[i])).toBeLessThan(TOLERANCE);
    }
    // Token ids cut from the left are the last ones sent.
    const sent = Array.from(tok.encode(long[0]!, { maxLength: 512, truncate: false }).ids);
    const idsLeft = await post('/embed', { model: 'st-short', inputs: sent, truncate: true, truncation_direction: 'left' });
    expect(maxAbsDiff(idsLeft.body[0], pooled(await tokenStates(Int32Array.from(sent.slice(-MAX_SEQ_LENGTH))), 'cls', true))).toBeLessThan(TOLERANCE);
    const bad = await post('/embed', { model: 'st-short', inputs: 'x', truncation_direction: 'middle' });
    expect(bad.status).toBe(422);
    expect(bad.body.error).toMatch(/truncation_direction: must be "right" or "left"/);
    // At the limit exactly: answered.
    const fits = words.slice(0, MAX_SEQ_LENGTH - 2).join(' ');
    expect(tok.encode(fits, { maxLength: 512, truncate: false }).ids.length).toBeLessThanOrEqual(MAX_SEQ_LENGTH);
    expect((await post('/embed', { model: 'st-short', inputs: fits })).status).toBe(200);
  });
});

describe("prompts (config_sentence_transformers.json's, or the request's own)", () => {
  /** The reference row of `text` as the tokenizer sees it (the prompt is part of the string). */
  const ref = async (text: string) => pooled(await tokenStates(tok.encode(text, { maxLength: 512, truncate: false }).ids), 'mean', true);

  it('prompt_name gives the prompt put before the text by hand; with none named, the default prompt; prompt gives its own text', async () => {
    const rand = makeRandom('st prompts');
    const texts = randomTexts(rand, vocabularyWords(loadModelSpec(join(root, 'st-e5'))), 8, 30);
    for (const t of texts) {
      const [named, plain, literal, viaOpenAI] = await Promise.all([
        post('/embed', { model: 'st-e5', inputs: t, prompt_name: 'passage' }),
        post('/embed', { model: 'st-e5', inputs: [t, t] }),
        post('/embed', { model: 'st-e5', inputs: t, prompt: 'search_document: ' }),
        post('/v1/embeddings', { model: 'st-e5', input: t, prompt_name: 'passage' }),
      ]);
      expect(maxAbsDiff(named.body[0], await ref(`passage: ${t}`))).toBeLessThan(TOLERANCE);
      expect(maxAbsDiff(plain.body[1], await ref(`query: ${t}`))).toBeLessThan(TOLERANCE); // the default: query
      expect(maxAbsDiff(literal.body[0], await ref(`search_document: ${t}`))).toBeLessThan(TOLERANCE);
      expect(maxAbsDiff(viaOpenAI.body.data[0].embedding, await ref(`passage: ${t}`))).toBeLessThan(TOLERANCE);
      // Sharp: the prompt changes the row.
      expect(maxAbsDiff(named.body[0], plain.body[0])).toBeGreaterThan(1e-3);
    }
    // An empty prompt turns the default off; a model without prompts takes a literal one.
    const t = texts[0]!;
    expect(maxAbsDiff((await post('/embed', { model: 'st-e5', inputs: t, prompt: '' })).body[0], await ref(t))).toBeLessThan(TOLERANCE);
    expect(maxAbsDiff((await post('/embed', { model: 'st-mean', inputs: t, prompt: 'query: ' })).body[0], await ref(`query: ${t}`))).toBeLessThan(TOLERANCE);
  });

  it('over WebSocket too: {op: "embed", prompt_name}', async () => {
    const { WebSocket } = await import('ws');
    const { pack, unpack } = await import('msgpackr');
    const ws = new WebSocket(`ws://127.0.0.1:${server.port}/ws`);
    await new Promise((res, rej) => (ws.once('open', res), ws.once('error', rej)));
    const answer = new Promise<{ id: string; result: number[][] }>((res) => ws.on('message', (d: Buffer) => res(unpack(d) as { id: string; result: number[][] })));
    ws.send(pack({ id: 'p1', op: 'embed', model: 'st-e5', inputs: 'where is my parcel', prompt_name: 'passage' }));
    const frame = await answer;
    ws.close();
    expect(frame.id).toBe('p1');
    expect(maxAbsDiff(frame.result[0]!, await ref('passage: where is my parcel'))).toBeLessThan(TOLERANCE);
  });

  it('an unknown prompt name is a 422 naming the known ones; both fields, or a prompt with token ids, are 422s too', async () => {
    const unknown = await post('/embed', { model: 'st-e5', inputs: 'x', prompt_name: 'document' });
    expect(unknown.status).toBe(422);
    expect(unknown.body.error).toMatch(/no prompt "document" \(its prompts: query, passage\)/);
    expect((await post('/embed', { model: 'st-mean', inputs: 'x', prompt_name: 'query' })).body.error).toMatch(/has no prompt "query" \(it has no prompts\)/);
    expect((await post('/embed', { model: 'st-e5', inputs: 'x', prompt_name: 'query', prompt: 'q: ' })).status).toBe(422);
    const ids = await post('/embed', { model: 'st-e5', inputs: [101, 2000, 102], prompt_name: 'query' });
    expect(ids.status).toBe(422);
    expect(ids.body.error).toMatch(/token ids are taken as they are sent/);
    // Token ids with only the default prompt: taken as sent.
    const asSent = await post('/embed', { model: 'st-e5', inputs: [101, 2000, 102] });
    expect(maxAbsDiff(asSent.body[0], pooled(await tokenStates(Int32Array.from([101, 2000, 102])), 'mean', true))).toBeLessThan(TOLERANCE);
  });

  it('/info lists the prompts and the default; the flags choose another default; a default the model lacks stops it at start', async () => {
    const info = (await (await fetch(base() + '/info')).json()) as { models: { name: string; prompts?: object; defaultPrompt?: object; sources: Record<string, string> }[] };
    expect(info.models.find((m) => m.name === 'st-e5')).toMatchObject({ prompts: E5_PROMPTS, defaultPrompt: { name: 'query', text: 'query: ' }, sources: { defaultPrompt: 'config_sentence_transformers.json' } });
    const dir = join(root, 'st-e5');
    expect(loadModelSpec(dir, undefined, { defaultPromptName: 'passage' })).toMatchObject({ defaultPrompt: { name: 'passage', text: 'passage: ' }, sources: { defaultPrompt: 'flag' } });
    expect(loadModelSpec(dir, undefined, { defaultPrompt: 'q: ' })).toMatchObject({ defaultPrompt: { text: 'q: ' }, sources: { defaultPrompt: 'flag' } });
    expect(() => loadModelSpec(dir, undefined, { defaultPromptName: 'document' })).toThrow(/default prompt name "document" \(flag\) is not one of its prompts \(query, passage\)/);
  });
});

describe("include_prompt false: the prompt's tokens are left out of the pooling, as sentence-transformers does", () => {
  /** The reference row: prompt and text one string to the model; pooled from the prompt's token count on (the prompt alone, less its [SEP]). */
  const ref = async (prompt: string, text: string, mode: Pooling) => {
    const from = prompt === '' ? 0 : tok.encode(prompt, { maxLength: 512, truncate: false }).ids.length - 1;
    return pooled(await tokenStates(tok.encode(prompt + text, { maxLength: 512, truncate: false }).ids), mode, true, from);
  };

  it('every mode: batched rows (named, default and literal prompts, mixed lengths) equal the graph run alone and pooled without the prompt', async () => {
    const rand = makeRandom('st include_prompt');
    const texts = randomTexts(rand, vocabularyWords(loadModelSpec(join(root, 'st-mean'))), 16, 40);
    const before = parseMetrics(await (await fetch(base() + '/metrics')).text());
    const send = () =>
      INSTRUCT_POOLINGS.flatMap((mode) =>
        texts.map((t, i) => {
          // Turn about: the default prompt (query), a named one, a literal one.
          const [field, prompt] = [[{}, E5_PROMPTS.query], [{ prompt_name: 'passage' }, E5_PROMPTS.passage], [{ prompt: 'represent the text: ' }, 'represent the text: ']][i % 3]!;
          return { mode, t, prompt, answer: post('/embed', { model: `st-instruct-${mode}`, inputs: t, ...(field as object) }) };
        }),
      );
    // All queued at once (sentTogether), so the batches they make can be counted.
    let asked: ReturnType<typeof send> = [];
    await sentTogether(server.testHooks, Object.fromEntries(INSTRUCT_POOLINGS.map((mode) => [`st-instruct-${mode}`, texts.length])), () => {
      asked = send();
      return Promise.all(asked.map((a) => a.answer));
    });
    const after = parseMetrics(await (await fetch(base() + '/metrics')).text());
    for (const mode of INSTRUCT_POOLINGS) {
      let worst = 0;
      let apart = 0;
      for (const a of asked.filter((x) => x.mode === mode)) {
        const got = await a.answer;
        expect(got.status, JSON.stringify(got.body)).toBe(200);
        worst = Math.max(worst, maxAbsDiff(got.body[0], await ref(a.prompt, a.t, mode)));
        // Sharp: pooling the prompt too (include_prompt true) is another row, except for [CLS].
        apart = Math.max(apart, maxAbsDiff(got.body[0], pooled(await tokenStates(tok.encode(a.prompt + a.t, { maxLength: 512, truncate: false }).ids), mode, true)));
      }
      expect(worst, mode).toBeLessThan(TOLERANCE);
      if (mode === 'cls') expect(apart).toBeLessThan(TOLERANCE);
      else expect(apart, mode).toBeGreaterThan(1e-3);
      const d = (name: string) => after.sum(name, { model: `st-instruct-${mode}` }) - before.sum(name, { model: `st-instruct-${mode}` });
      const lengths = asked.filter((x) => x.mode === mode).map((a) => tok.encode(a.prompt + a.t, { maxLength: 512, truncate: false }).ids.length);
      expect(d('slabserve_batch_size_sum')).toBe(texts.length);
      expect(d('slabserve_batch_size_count'), mode).toBe(batchesOfQueued(lengths, await servedBatching(base(), `st-instruct-${mode}`)));
      expect(d('slabserve_batch_size_count')).toBeLessThan(texts.length);
    }
  });

  it('the same over OpenAI\'s route, the WebSocket op and the in-process engine; token ids are pooled whole; a left cut through the prompt is a 422', async () => {
    const t = 'where is my parcel';
    const want = await ref(E5_PROMPTS.passage, t, 'mean');
    const openai = await post('/v1/embeddings', { model: 'st-instruct-mean', input: t, prompt_name: 'passage' });
    expect(maxAbsDiff(openai.body.data[0].embedding, want)).toBeLessThan(TOLERANCE);
    const { WebSocket } = await import('ws');
    const { pack, unpack } = await import('msgpackr');
    const ws = new WebSocket(`ws://127.0.0.1:${server.port}/ws`);
    await new Promise((res, rej) => (ws.once('open', res), ws.once('error', rej)));
    const frame = new Promise<{ result: number[][] }>((res) => ws.on('message', (d: Buffer) => res(unpack(d) as { result: number[][] })));
    ws.send(pack({ id: 'i1', op: 'embed', model: 'st-instruct-mean', inputs: t, prompt_name: 'passage' }));
    expect(maxAbsDiff((await frame).result[0]!, want)).toBeLessThan(TOLERANCE);
    ws.close();
    const engine = await createEngine({ device: 'cpu', models: [join(root, 'st-instruct-mean')], log: () => {} });
    try {
      const [named] = await engine.embed(t, { promptName: 'passage' });
      const [byDefault] = await engine.embed(t);
      expect(maxAbsDiff(named!, want)).toBeLessThan(TOLERANCE);
      expect(maxAbsDiff(byDefault!, await ref(E5_PROMPTS.query, t, 'mean'))).toBeLessThan(TOLERANCE);
    } finally {
      await engine.close();
    }
    // Token ids are taken as sent, the default prompt not added: every token pooled.
    const ids = [101, 2000, 2001, 102];
    const asSent = await post('/embed', { model: 'st-instruct-mean', inputs: [ids] });
    expect(maxAbsDiff(asSent.body[0], pooled(await tokenStates(Int32Array.from(ids)), 'mean', true))).toBeLessThan(TOLERANCE);
    // Cut on the right, the prompt stays whole; cut on the left, it would not.
    const long = Array.from({ length: 600 }, () => 'parcel').join(' ');
    const right = await post('/embed', { model: 'st-instruct-mean', inputs: long, truncate: true });
    expect(right.status).toBe(200);
    const left = await post('/embed', { model: 'st-instruct-mean', inputs: long, truncate: true, truncation_direction: 'left' });
    expect(left.status).toBe(422);
    expect(left.body.error).toMatch(/would cut the prompt this model pools without/);
    // /info and KServe metadata say so.
    const info = (await (await fetch(base() + '/info')).json()) as { models: { name: string; includePrompt?: boolean }[] };
    expect(info.models.find((m) => m.name === 'st-instruct-mean')?.includePrompt).toBe(false);
    expect(info.models.find((m) => m.name === 'st-mean')?.includePrompt).toBe(true);
    expect(logs.some((l) => l.includes('st-instruct-mean') && l.includes('include_prompt=false'))).toBe(true);
  });
});

describe("sentence_bert_config.json's do_lower_case", () => {
  it('lowercases the texts before a tokenizer that does not, as sentence-transformers does', async () => {
    const lowered = join(root, 'cased-lowered');
    const asIs = join(root, 'cased-as-is');
    expect(loadModelSpec(lowered).lowercase).toBe(true);
    expect(loadModelSpec(asIs).lowercase).toBe(false);
    // With a tokenizer that lowercases itself (the generated one) there is nothing to do.
    expect(loadModelSpec(stFolder('uncased', { pooling: 'mean', files: { 'sentence_bert_config.json': { do_lower_case: true } } })).lowercase).toBe(false);

    const casedTok = await loadTokenizer(join(asIs, 'tokenizer.json'));
    const engine = await createEngine({ device: 'cpu', models: [lowered, asIs], log: () => {} });
    try {
      const rand = makeRandom('st do_lower_case');
      const words = vocabularyWords(loadModelSpec(lowered));
      const texts = randomTexts(rand, words, 8, 20).map((t) => t.replace(/\b\w/g, (c) => c.toUpperCase())); // Title Case
      for (const t of texts) {
        const ref = async (text: string) => pooled(await tokenStates(casedTok.encode(text, { maxLength: 512, truncate: false }).ids), 'mean', true);
        const [low] = await engine.embed(t, { model: 'cased-lowered' });
        const [kept] = await engine.embed(t, { model: 'cased-as-is' });
        expect(maxAbsDiff(low!, await ref(t.toLowerCase()))).toBeLessThan(TOLERANCE);
        expect(maxAbsDiff(kept!, await ref(t))).toBeLessThan(TOLERANCE);
        expect(maxAbsDiff(low!, kept!)).toBeGreaterThan(1e-3); // the case reaches this tokenizer
      }
    } finally {
      await engine.close();
    }
  });
  it('on every path of a server: texts tokenized on the gateway or its tokenizer pool, a prompt with them, /tokenize', async () => {
    const casedTok = await loadTokenizer(join(root, 'cased-as-is', 'tokenizer.json'));
    const ref = async (text: string) => pooled(await tokenStates(casedTok.encode(text, { maxLength: 512, truncate: false }).ids), 'mean', true);
    const rand = makeRandom('st do_lower_case server');
    const texts = randomTexts(rand, vocabularyWords(loadModelSpec(join(root, 'cased-lowered'))), 48, 80).map((t) => t.toUpperCase());
    // past --inline-tokenize-chars (at the pace the server counts them): the pool thread tokenizes them
    expect(texts.reduce((n, t) => n + casedTok.paceChars(t), 0)).toBeGreaterThan(INLINE_TOKENIZE_CHARS);
    const [alone, many, prompted] = await Promise.all([
      post('/embed', { model: 'cased-lowered', inputs: texts[0] }),
      post('/embed', { model: 'cased-lowered', inputs: texts }),
      post('/embed', { model: 'cased-lowered', inputs: texts[1], prompt: 'QUERY: ' }),
    ]);
    expect(maxAbsDiff(alone.body[0], await ref(texts[0]!.toLowerCase()))).toBeLessThan(TOLERANCE);
    for (const [i, t] of texts.entries()) expect(maxAbsDiff(many.body[i], await ref(t.toLowerCase())), t).toBeLessThan(TOLERANCE);
    expect(maxAbsDiff(prompted.body[0], await ref(`query: ${texts[1]!.toLowerCase()}`))).toBeLessThan(TOLERANCE);
    // /tokenize: the lowercased text's tokens, each shown as the text sent has it, at the same offsets.
    const word = texts[0]!.split(' ')[0]!;
    const spans = (await post('/tokenize', { model: 'cased-lowered', inputs: `${word} ${word}`, add_special_tokens: false })).body[0] as { id: number; text: string; start: number }[];
    const lowerIds = casedTok.encode(`${word} ${word}`.toLowerCase(), { maxLength: 512, truncate: false }).ids;
    expect(spans.map((x) => x.id)).toEqual(Array.from(lowerIds.slice(1, -1)));
    expect(spans.map((x) => x.text).join('')).toBe(`${word}${word}`);
    expect(spans[0]!.start).toBe(0);
  });
});

describe('reading a folder: precedence, limits, and what is refused', () => {
  const spec = (dir: string, overrides = {}) => loadModelSpec(dir, undefined, overrides);

  it('flags over serve.json over the folder over the defaults', () => {
    const dir = stFolder('prec', { pooling: 'cls', files: { 'sentence_bert_config.json': { max_seq_length: 64 } } });
    expect(spec(dir)).toMatchObject({ pooling: 'cls', maxLength: 64, sources: { pooling: '1_Pooling/config.json', maxLength: 'sentence_bert_config.json' } });
    writeFileSync(join(dir, 'serve.json'), JSON.stringify({ pooling: 'max', maxLength: 100, normalize: false }));
    expect(spec(dir)).toMatchObject({ pooling: 'max', maxLength: 100, normalize: false, sources: { pooling: 'serve.json', maxLength: 'serve.json', normalize: 'serve.json' } });
    expect(spec(dir, { pooling: 'lasttoken', maxLength: 32 })).toMatchObject({ pooling: 'lasttoken', maxLength: 32, sources: { pooling: 'flag', maxLength: 'flag' } });
    expect(() => spec(dir, { maxLength: 600 })).toThrow(/max input length 600 \(flag\) exceeds the model's 512 positions \(config\.json\)/);
  });

  it("the max input length: the RoBERTa family's position offset, the tokenizer's model_max_length", () => {
    const config = JSON.parse(readFileSync(join(modelsDir, 'tiny-embed', 'config.json'), 'utf8')) as Record<string, unknown>;
    const noLimit = { 'tokenizer_config.json': { model_max_length: 1e30 } }; // transformers' "unset"
    const xlmr = stFolder('xlmr', { pooling: 'mean', files: { ...noLimit, 'config.json': { ...config, model_type: 'xlm-roberta', max_position_embeddings: 514, pad_token_id: 1 } } });
    expect(spec(xlmr)).toMatchObject({ maxLength: 512, sources: { maxLength: 'config.json' } });
    const bert = stFolder('bert-514', { pooling: 'mean', files: { ...noLimit, 'config.json': { ...config, model_type: 'bert', max_position_embeddings: 514 } } });
    expect(spec(bert)).toMatchObject({ maxLength: 514, sources: { maxLength: 'config.json' } }); // no offset outside the RoBERTa family
    const capped = stFolder('capped', { pooling: 'mean', files: { 'tokenizer_config.json': { model_max_length: 256 } } });
    expect(spec(capped)).toMatchObject({ maxLength: 256, sources: { maxLength: 'tokenizer_config.json' } });
    const unset = stFolder('unset', { pooling: 'mean', files: noLimit });
    expect(spec(unset)).toMatchObject({ maxLength: 512, sources: { maxLength: 'config.json' } });
  });

  it('refuses, naming the file, what it cannot serve as the folder asks', () => {
    const dense = stFolder('dense', { pooling: 'mean' });
    const modules = JSON.parse(readFileSync(join(dense, 'modules.json'), 'utf8')) as unknown[];
    writeFileSync(join(dense, 'modules.json'), JSON.stringify([...modules, MODULE('Dense', 3, '2_Dense')]));
    expect(() => spec(dense)).toThrow(/modules\.json: module 2_Dense \(sentence_transformers\.models\.Dense\) is not supported/);
    expect(() => spec(stFolder('two', { pooling: ['cls', 'mean'] }))).toThrow(/1_Pooling\/config\.json: cls and mean pooling together .* not supported/);
    const none = stFolder('none', { pooling: 'mean' });
    writeFileSync(join(none, '1_Pooling', 'config.json'), JSON.stringify({ word_embedding_dimension: HIDDEN, pooling_mode_mean_tokens: false }));
    expect(() => spec(none)).toThrow(/no pooling mode is on/);
  });

  it('a --model folder that is missing, or has no config.json, is reported before anything starts', async () => {
    await expect(startServer(testServerConfig({ models: [join(root, 'nowhere')] }))).rejects.toThrow(/model folder .*nowhere does not exist/);
    mkdirSync(join(root, 'empty-folder'));
    await expect(startServer(testServerConfig({ models: [join(root, 'empty-folder')] }))).rejects.toThrow(/model folder .*empty-folder has no config\.json/);
    await expect(startServer(testServerConfig({ models: [join(root, 'st-cls'), join(root, 'prec', '..', 'st-cls')] }))).rejects.toThrow(/two models named "st-cls"/);
  });
});
