/**
 * Long inputs (docs/long-inputs.md): an input longer than the model takes,
 * chunked into windows of the model's length that run in the batches like
 * any input, their rows combined; a long document reranked by its best window.
 *
 * The reference is independent of the server's graph and of its windowing:
 * a plain onnxruntime session of the unmodified model.onnx, each window run
 * alone and unpadded, windowed and pooled by this file's own code. Texts are
 * whole vocabulary words joined by spaces, so word k is token k after [CLS]
 * (checked: the token count is the word count plus the special tokens).
 */
import { cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SlabHttpClient } from '../dist/src/client/index.js';
import { splitTokens } from '../dist/src/core/long-inputs.js';
import { windowStarts } from '../dist/src/core/tokenizer/windows.js';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { writePreset } from '../dist/models/generator/presets.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { loadModelSpec, type Pooling } from '../dist/src/shared/model-format/model-config.js';
import { parseMetrics } from './fixtures/http-client.js';
import { eventually, makeRandom, PlainReference, sigmoid, testServerConfig, vocabularyWords, wsRequest } from './helpers.js';

process.env.SLABSERVE_TEST_HOOKS = '1';

const TOLERANCE = 1e-5;
const MAX_LENGTH = 64;
/** Text tokens in a window of one input: [CLS] and [SEP] take two. */
const BODY = MAX_LENGTH - 2;
const HIDDEN = 128;
const MAX_INPUT_TOKENS = 4 * MAX_LENGTH;
const OVERLAP = 10;
const POOLINGS: Pooling[] = ['mean', 'cls', 'lasttoken'];

let root: string;
/** --long-inputs chunk, --max-input-tokens 4 model lengths. */
let chunking: Server;
/** The defaults (error), --chunk-overlap-tokens 10, batches of 4 windows at most: requests ask for chunks themselves. */
let overlapping: Server;
let embedRef: PlainReference;
let rerankRef: PlainReference;
let spladeRef: PlainReference;
let tok: TextTokenizer;
let words: string[];

// ------------------------------------------------------------------ the reference

function randomWords(rand: () => number, n: number): string[] {
  return Array.from({ length: n }, () => words[Math.floor(rand() * words.length)]!);
}

/** The ids of a text as one input, never cut (every word one token: checked). */
function idsOf(text: string, wordCount: number): Int32Array {
  const ids = tok.encode(text, { maxLength: 100_000, truncate: false }).ids;
  expect(ids.length, 'tokens of the text').toBe(wordCount + 2);
  return ids;
}

/** This file's windows of a text's ids: [CLS], `body` text tokens from each start, [SEP]; the starts `body - overlap` apart. */
function windowsOf(ids: Int32Array, body: number, overlap: number): Int32Array[] {
  const text = ids.subarray(1, ids.length - 1);
  const out: Int32Array[] = [];
  for (let s = 0; ; s += body - overlap) {
    const slice = text.subarray(s, Math.min(s + body, text.length));
    out.push(Int32Array.from([ids[0]!, ...slice, ids[ids.length - 1]!]));
    if (s + body >= text.length) return out;
  }
}

/** One window's pooled vector (not normalised), as `mode` pools its token states. */
async function pooled(ids: Int32Array, mode: Pooling): Promise<Float64Array> {
  const states = await embedRef.raw(ids);
  const n = ids.length;
  const out = new Float64Array(HIDDEN);
  if (mode === 'mean') {
    for (let t = 0; t < n; t++) for (let h = 0; h < HIDDEN; h++) out[h]! += states[t * HIDDEN + h]!;
    return out.map((v) => v / n);
  }
  const t = mode === 'cls' ? 0 : n - 1;
  for (let h = 0; h < HIDDEN; h++) out[h] = states[t * HIDDEN + h]!;
  return out;
}

/** The windows' vectors averaged, each weighing its token count, then normalised (or not). */
async function chunkedReference(windows: Int32Array[], mode: Pooling, normalize: boolean): Promise<Float64Array> {
  const sum = new Float64Array(HIDDEN);
  let weights = 0;
  for (const w of windows) {
    const v = await pooled(w, mode);
    for (let h = 0; h < HIDDEN; h++) sum[h]! += w.length * v[h]!;
    weights += w.length;
  }
  const mean = sum.map((v) => v / weights);
  if (!normalize) return mean;
  const norm = Math.hypot(...mean);
  return mean.map((v) => v / norm);
}

function worstDiff(got: number[], want: Float64Array): number {
  expect(got).toHaveLength(want.length);
  let worst = 0;
  for (let h = 0; h < want.length; h++) worst = Math.max(worst, Math.abs(got[h]! - want[h]!));
  return worst;
}

// ------------------------------------------------------------------ the servers

async function post(server: Server, path: string, body: unknown, signal?: AbortSignal): Promise<{ status: number; body: any; headers: Headers }> {
  const r = await fetch(`${server.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal });
  return { status: r.status, body: await r.json(), headers: r.headers };
}

function variant(embedDir: string, pooling: Pooling): string {
  const dir = join(root, `tiny-embed-${pooling}`);
  cpSync(embedDir, dir, { recursive: true });
  writeFileSync(join(dir, 'serve.json'), JSON.stringify({ task: 'embed', pooling, normalize: true, maxLength: MAX_LENGTH }));
  return dir;
}

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), 'slabserve-long-inputs-'));
  const embedDir = writePreset('tiny-embed', root, { maxLength: MAX_LENGTH }).dir;
  const rerankDir = writePreset('tiny-rerank', root, { maxLength: MAX_LENGTH }).dir;
  const spladeDir = writePreset('tiny-splade', root, { maxLength: MAX_LENGTH }).dir;
  const variants = (['cls', 'lasttoken'] as Pooling[]).map((p) => variant(embedDir, p));
  embedRef = await PlainReference.open(embedDir);
  rerankRef = await PlainReference.open(rerankDir);
  spladeRef = await PlainReference.open(spladeDir);
  tok = await loadTokenizer(loadModelSpec(embedDir).tokenizerPath);
  words = vocabularyWords(loadModelSpec(embedDir));
  const batching = { maxBatchTokens: 4096 };
  chunking = await startServer(testServerConfig({ models: [embedDir, ...variants, rerankDir, spladeDir], slotsPerModel: 64, longInputs: 'chunk', maxInputTokens: MAX_INPUT_TOKENS, batching }));
  // Batches of at most 4 windows of the model's length: a chunked request's windows take batches of their own.
  overlapping = await startServer(testServerConfig({ models: [embedDir], slotsPerModel: 64, modelInstances: 1, chunkOverlapTokens: OVERLAP, batching: { maxBatchTokens: 4 * MAX_LENGTH } }));
  await Promise.all([chunking.ready, overlapping.ready]);
}, 120_000);

afterAll(async () => {
  await Promise.all([chunking?.close(), overlapping?.close()]);
  await Promise.all([embedRef?.close(), rerankRef?.close(), spladeRef?.close()]);
  if (root) rmSync(root, { recursive: true, force: true });
});

const modelOf = (mode: Pooling) => (mode === 'mean' ? 'tiny-embed' : `tiny-embed-${mode}`);

// ------------------------------------------------------------------ embeddings

describe('embeddings of a text longer than the model takes, chunked', () => {
  it('a text of 3.5 model lengths, mean, CLS and last-token pooling: the length-weighted mean of the windows\' rows run alone, within 1e-5, normalised and not', async () => {
    const rand = makeRandom('long inputs poolings');
    const n = Math.round(3.5 * MAX_LENGTH) - 2;
    let worst = 0;
    for (const mode of POOLINGS) {
      const ws = randomWords(rand, n);
      const text = ws.join(' ');
      const windows = windowsOf(idsOf(text, n), BODY, 0);
      expect(windows).toHaveLength(4);
      for (const normalize of [true, false]) {
        const r = await post(chunking, '/embed', { model: modelOf(mode), inputs: [text, 'a short one'], normalize });
        expect(r.status, JSON.stringify(r.body).slice(0, 300)).toBe(200);
        worst = Math.max(worst, worstDiff(r.body[0], await chunkedReference(windows, mode, normalize)));
        expect(r.headers.get('x-windows'), 'the windows the request ran').toBe(String(windows.length + 1));
      }
    }
    expect(worst).toBeLessThan(TOLERANCE);
    console.log(`long inputs: ${POOLINGS.join(', ')}, worst |diff| ${worst.toExponential(2)}`);
  });

  it('with --chunk-overlap-tokens: each window repeats the last tokens of the one before; asked for by long_inputs on a server whose default is a 413', async () => {
    const rand = makeRandom('long inputs overlap');
    const n = Math.round(3.5 * MAX_LENGTH) - 2;
    const text = randomWords(rand, n).join(' ');
    const windows = windowsOf(idsOf(text, n), BODY, OVERLAP);
    expect(windows).toHaveLength(5);
    expect((await post(overlapping, '/embed', { inputs: text })).status).toBe(413);
    const r = await post(overlapping, '/embed', { inputs: text, long_inputs: 'chunk' });
    expect(r.status, JSON.stringify(r.body).slice(0, 300)).toBe(200);
    expect(worstDiff(r.body[0], await chunkedReference(windows, 'mean', true))).toBeLessThan(TOLERANCE);
    // OpenAI's body takes the field too; truncate: true still cuts.
    const openai = await post(overlapping, '/v1/embeddings', { model: 'tiny-embed', input: text, long_inputs: 'chunk' });
    expect(openai.status, JSON.stringify(openai.body).slice(0, 300)).toBe(200);
    expect(worstDiff(openai.body.data[0].embedding, await chunkedReference(windows, 'mean', true))).toBeLessThan(TOLERANCE);
    expect(openai.body.usage, 'usage counts every window\'s tokens').toEqual({ prompt_tokens: windows.reduce((n, w) => n + w.length, 0), total_tokens: expect.any(Number), windows: windows.length });
    // The WebSocket's embed op is /embed's endpoint: the same field.
    const frame = await wsRequest(overlapping.port, { id: 'w', op: 'embed', inputs: text, long_inputs: 'chunk' });
    expect(frame.error, JSON.stringify(frame).slice(0, 300)).toBeUndefined();
    expect(worstDiff(frame.result[0], await chunkedReference(windows, 'mean', true))).toBeLessThan(TOLERANCE);
    // The TypeScript client's option.
    const client = await new SlabHttpClient(overlapping.url).embed([text], { longInputs: 'chunk' });
    expect(worstDiff(Array.from(client[0]!), await chunkedReference(windows, 'mean', true))).toBeLessThan(TOLERANCE);
    const cut = await post(overlapping, '/embed', { inputs: text, truncate: true });
    expect(worstDiff(cut.body[0], await chunkedReference(windows.slice(0, 1), 'mean', true))).toBeLessThan(TOLERANCE);
  });

  it("the windows a request ran, in the answer where the dialect has room: KServe's parameters, vLLM's usage (beside every answer's x-windows)", async () => {
    const rand = makeRandom('long inputs window counts');
    const text = randomWords(rand, Math.round(2.5 * MAX_LENGTH)).join(' ');
    const tei = await post(chunking, '/embed', { inputs: text });
    const windows = Number(tei.headers.get('x-windows'));
    expect(windows).toBeGreaterThan(1);
    const kserve = await post(chunking, '/v2/models/tiny-embed/infer', { inputs: [{ name: 'text', shape: [1], datatype: 'BYTES', data: [text] }] });
    expect(kserve.status, JSON.stringify(kserve.body).slice(0, 300)).toBe(200);
    expect(kserve.body.parameters).toEqual({ windows });
    expect(worstDiff(kserve.body.outputs[0].data, tei.body[0])).toBeLessThan(TOLERANCE);
    const short = await post(chunking, '/v2/models/tiny-embed/infer', { inputs: [{ name: 'text', shape: [1], datatype: 'BYTES', data: ['where is my parcel'] }] });
    expect(short.body.parameters, 'an answer that needed no windows says nothing of them').toBeUndefined();
    const score = await post(chunking, '/score', { model: 'tiny-rerank', text_1: 'where', text_2: text });
    expect(score.status, JSON.stringify(score.body).slice(0, 300)).toBe(200);
    expect(score.body.usage.windows).toBe(Number(score.headers.get('x-windows')));
    expect(score.body.usage.windows).toBeGreaterThan(1);
  });

  it('--max-input-tokens: a longer input is refused in each dialect\'s error shape (413, or the 400 the dialect answers a too-long input with)', async () => {
    const rand = makeRandom('long inputs bound');
    const text = randomWords(rand, MAX_INPUT_TOKENS).join(' '); // two tokens past the bound
    const tei = await post(chunking, '/embed', { inputs: text });
    expect(tei.status).toBe(413);
    expect(tei.body).toMatchObject({ error: expect.stringMatching(/--max-input-tokens/), error_type: 'Validation', code: 'SLABSERVE_INPUT_TOO_LONG' });
    const openai = await post(chunking, '/v1/embeddings', { model: 'tiny-embed', input: text });
    expect(openai.status).toBe(400);
    expect(openai.body.error).toMatchObject({ type: 'invalid_request_error', code: 'context_length_exceeded', message: expect.stringMatching(/--max-input-tokens/) });
    const cohere = await post(chunking, '/v2/embed', { model: 'tiny-embed', texts: [text], input_type: 'search_document' });
    expect(cohere.status).toBe(400);
    expect(cohere.body).toMatchObject({ id: expect.any(String), message: expect.stringMatching(/--max-input-tokens/), code: 'SLABSERVE_INPUT_TOO_LONG' });
    const rerank = await post(chunking, '/v2/rerank', { model: 'tiny-rerank', query: 'where', documents: [text] });
    expect(rerank.status).toBe(400);
    expect(rerank.body).toMatchObject({ message: expect.stringMatching(/--max-input-tokens/), code: 'SLABSERVE_INPUT_TOO_LONG' });
    const kserve = await post(chunking, '/v2/models/tiny-embed/infer', { inputs: [{ name: 'text', shape: [1], datatype: 'BYTES', data: [text] }] });
    expect(kserve.status).toBe(413);
    expect(Object.keys(kserve.body)).toEqual(['error']);
    expect(kserve.body.error).toMatch(/--max-input-tokens/);
    const vllm = await post(chunking, '/score', { model: 'tiny-rerank', text_1: 'where', text_2: text });
    expect(vllm.body.error, JSON.stringify(vllm.body)).toMatchObject({ message: expect.stringMatching(/--max-input-tokens/) });
    // One token fewer than the bound is chunked.
    const within = randomWords(rand, MAX_INPUT_TOKENS - 2).join(' ');
    expect((await post(chunking, '/embed', { inputs: within })).status).toBe(200);
  });
});

// ------------------------------------------------------------------ token vectors

/** The windows' token states run alone, joined: [CLS] of the first, each window's text tokens less the `overlap` it repeats, [SEP] of the last. */
async function joinedStates(windows: Int32Array[], overlap: number): Promise<Float32Array[]> {
  const out: Float32Array[] = [];
  for (const [k, w] of windows.entries()) {
    const states = await embedRef.raw(w);
    const from = k === 0 ? 0 : 1 + overlap;
    const to = k === windows.length - 1 ? w.length : w.length - 1;
    for (let t = from; t < to; t++) out.push(states.subarray(t * HIDDEN, (t + 1) * HIDDEN));
  }
  return out;
}

describe('token vectors of a text longer than the model takes', () => {
  it('/embed_all: the windows\' token states in order, each text token once (the overlap from the earlier window), [CLS] first and [SEP] last', async () => {
    const rand = makeRandom('long inputs token vectors');
    const n = Math.round(3.5 * MAX_LENGTH) - 2;
    const text = randomWords(rand, n).join(' ');
    const want = await joinedStates(windowsOf(idsOf(text, n), BODY, OVERLAP), OVERLAP);
    expect(want).toHaveLength(n + 2);
    const r = await post(overlapping, '/embed_all', { inputs: [text, 'a short one'], long_inputs: 'chunk' });
    expect(r.status, JSON.stringify(r.body).slice(0, 300)).toBe(200);
    expect(r.body[0]).toHaveLength(n + 2);
    expect(r.body[1]).toHaveLength(5);
    let worst = 0;
    want.forEach((v, t) => (worst = Math.max(worst, worstDiff(r.body[0][t], Float64Array.from(v)))));
    expect(worst).toBeLessThan(TOLERANCE);
  });
});

describe('late chunking of a text longer than the model takes', () => {
  it('/embed with chunks: each chunk is the mean of its tokens\' states joined from the windows, chunks spanning a window boundary included', async () => {
    const rand = makeRandom('long inputs late chunking');
    const n = Math.round(3.5 * MAX_LENGTH) - 2;
    const ws = randomWords(rand, n);
    const text = ws.join(' ');
    const states = await joinedStates(windowsOf(idsOf(text, n), BODY, 0), 0);
    const starts: number[] = [];
    ws.reduce((at, w) => (starts.push(at), at + w.length + 1), 0);
    // Words [a, b), ordered by start: chunks within a window, across a boundary, over most of the text.
    const words: [number, number][] = [[0, 30], [10 + Math.floor(rand() * 20), n - 10], [50, 70], [BODY - 5, BODY + 5], [2 * BODY - 1, 2 * BODY + 1]];
    const spans = words.map(([a, b]) => [starts[a]!, starts[b - 1]! + ws[b - 1]!.length]);
    const r = await post(chunking, '/embed', { inputs: text, chunks: spans });
    expect(r.status, JSON.stringify(r.body).slice(0, 300)).toBe(200);
    let worst = 0;
    words.forEach(([a, b], i) => {
      const mean = new Float64Array(HIDDEN);
      for (let k = a; k < b; k++) for (let h = 0; h < HIDDEN; h++) mean[h]! += states[k + 1]![h]! / (b - a);
      const norm = Math.hypot(...mean);
      worst = Math.max(worst, worstDiff(r.body[i], mean.map((v) => v / norm)));
    });
    expect(worst).toBeLessThan(TOLERANCE);
  });
});

describe('sparse weights of a text longer than the model takes', () => {
  it('/embed_sparse (SPLADE, max of relu): each id\'s weight is its max over the windows run alone, every non-zero id and value within 1e-5', async () => {
    const rand = makeRandom('long inputs sparse');
    const n = Math.round(3.5 * MAX_LENGTH) - 2;
    const text = randomWords(rand, n).join(' ');
    const want = new Map<number, number>();
    for (const w of windowsOf(idsOf(text, n), BODY, 0)) {
      const logits = await spladeRef.raw(w);
      const vocab = logits.length / w.length;
      for (let t = 0; t < w.length; t++) {
        for (let v = 0; v < vocab; v++) {
          const x = Math.log1p(Math.max(0, logits[t * vocab + v]!));
          if (x > 0 && x > (want.get(v) ?? 0)) want.set(v, x);
        }
      }
    }
    const r = await post(chunking, '/embed_sparse', { model: 'tiny-splade', inputs: text });
    expect(r.status, JSON.stringify(r.body).slice(0, 300)).toBe(200);
    const got = r.body[0] as { index: number; value: number }[];
    expect(got.map((e) => e.index)).toEqual([...want.keys()].sort((a, b) => a - b));
    let worst = 0;
    for (const e of got) worst = Math.max(worst, Math.abs(e.value - want.get(e.index)!));
    expect(worst).toBeLessThan(TOLERANCE);
    expect(want.size).toBeGreaterThan(10);
  });
});

// ------------------------------------------------------------------ rerank

/** The reference windows of a (query, document) pair: [CLS] query [SEP] document slice [SEP], as many document tokens as fit beside the query. */
function pairWindows(query: Int32Array, doc: Int32Array, maxWindows = Infinity): { ids: Int32Array; typeIds: Int32Array }[] {
  const [cls, sep] = [doc[0]!, doc[doc.length - 1]!];
  const q = query.subarray(1, query.length - 1);
  const body = MAX_LENGTH - 3 - q.length;
  return windowsOf(doc, body, 0)
    .slice(0, maxWindows)
    .map((w) => {
      const ids = Int32Array.from([cls, ...q, sep, ...w.subarray(1)]);
      return { ids, typeIds: Int32Array.from(ids, (_, i) => (i < q.length + 2 ? 0 : 1)) };
    });
}

async function windowLogits(query: Int32Array, doc: Int32Array, maxWindows?: number): Promise<number[]> {
  const out: number[] = [];
  for (const w of pairWindows(query, doc, maxWindows)) out.push((await rerankRef.rerank(w.ids, w.typeIds)).logit);
  return out;
}

describe('rerank of a document longer than the model takes: its best window', () => {
  it('/rerank, /v1/rerank and /v2/rerank: each document scores as its best window run alone (every pair scored), max_chunks_per_doc bounds the windows, the text comes back whole', async () => {
    const rand = makeRandom('long inputs rerank');
    const query = randomWords(rand, 5).join(' ');
    const qIds = idsOf(query, 5);
    const docs = Array.from({ length: 4 }, () => randomWords(rand, 150 + Math.floor(rand() * 60)));
    const texts = docs.map((d) => d.join(' '));
    const logits = await Promise.all(texts.map((t, i) => windowLogits(qIds, idsOf(t, docs[i]!.length))));
    // The best window is not always the first: a rule that kept the first would fail here.
    expect(logits.some((l) => l.indexOf(Math.max(...l)) > 0), JSON.stringify(logits)).toBe(true);
    const best = logits.map((l) => Math.max(...l));
    const tei = await post(chunking, '/rerank', { query, texts, raw_scores: true, return_text: true });
    expect(tei.status, JSON.stringify(tei.body).slice(0, 300)).toBe(200);
    for (const r of tei.body) {
      expect(Math.abs(r.score - best[r.index]!), `text ${r.index}`).toBeLessThan(TOLERANCE);
      expect(r.text).toBe(texts[r.index]);
    }
    expect(tei.headers.get('x-windows')).toBe(String(logits.reduce((n, l) => n + l.length, 0)));
    const two = await Promise.all(texts.map((t, i) => windowLogits(qIds, idsOf(t, docs[i]!.length), 2)));
    const v1 = await post(chunking, '/v1/rerank', { query, documents: texts, max_chunks_per_doc: 2 });
    expect(v1.status, JSON.stringify(v1.body).slice(0, 300)).toBe(200);
    for (const r of v1.body.results) {
      expect(Math.abs(r.relevance_score - sigmoid(Math.max(...two[r.index]!))), `document ${r.index}`).toBeLessThan(TOLERANCE);
      expect(r.document.text).toBe(texts[r.index]);
    }
    // The TypeScript client's maxChunksPerDoc: 1, the first window only.
    const first = await Promise.all(texts.map((t, i) => windowLogits(qIds, idsOf(t, docs[i]!.length), 1)));
    for (const hit of await new SlabHttpClient(chunking.url).rerank(query, texts, { maxChunksPerDoc: 1, rawScores: true })) {
      expect(Math.abs(hit.score - first[hit.index]![0]!), `text ${hit.index}, first window`).toBeLessThan(TOLERANCE);
    }
    const v2 = await post(chunking, '/v2/rerank', { model: 'tiny-rerank', query, documents: texts });
    expect(v2.status, JSON.stringify(v2.body).slice(0, 300)).toBe(200);
    for (const r of v2.body.results) expect(Math.abs(r.relevance_score - sigmoid(best[r.index]!)), `document ${r.index}`).toBeLessThan(TOLERANCE);
  });
});

// ------------------------------------------------------------------ slots

const slotsInUse = async (server: Server) => parseMetrics(await (await fetch(`${server.url}/metrics`)).text()).sum('slabserve_slots_in_use', { model: 'tiny-embed' });

describe('a chunked request holds its windows as one request', () => {
  it('cancelled while its windows wait for the device (the client goes away): every slot it held comes back', async () => {
    const rand = makeRandom('long inputs cancel');
    const n = Math.round(3.5 * MAX_LENGTH) - 2;
    const text = randomWords(rand, n).join(' ');
    const hooks = chunking.testHooks!;
    expect(await slotsInUse(chunking)).toBe(0);
    await hooks.holdInference();
    const ac = new AbortController();
    let sent: Promise<unknown> | undefined;
    try {
      sent = post(chunking, '/embed', { inputs: text }, ac.signal).catch((e: Error) => e);
      await eventually('its 4 windows queued', async () => hooks.inputsWaiting('tiny-embed'), (w) => w >= 4);
      expect(await slotsInUse(chunking), 'one slot a window').toBe(4);
      ac.abort();
      await sent;
    } finally {
      hooks.releaseInference();
    }
    await eventually('every slot back', () => slotsInUse(chunking), (s) => s === 0);
  });
});

describe('admission sees a chunked request whole', () => {
  it('its predicted wait counts every window: refused (429) where the same text truncated, one input, is admitted', async () => {
    const rand = makeRandom('long inputs admission');
    const text = randomWords(rand, Math.round(3.5 * MAX_LENGTH) - 2).join(' '); // 4 windows
    // Each input costs 10 s by the cost model; a deadline of 20 s admits a predicted wait of 15 s: one input, not four.
    const perRowMs = 10_000;
    const body = (long_inputs: string) => ({ inputs: text, long_inputs, timeout: 20_000 });
    const restore = chunking.testHooks!.setCost('tiny-embed', { fixedMs: 0, perRowMs });
    try {
      const chunked = await post(chunking, '/embed', body('chunk'));
      expect([chunked.status, chunked.body.code], JSON.stringify(chunked.body)).toEqual([429, 'SLABSERVE_OVERLOADED']);
      expect(Number(/predicted wait (\d+) ms/.exec(chunked.body.error)?.[1]), chunked.body.error).toBeGreaterThanOrEqual(4 * perRowMs);
      const truncated = await post(chunking, '/embed', body('truncate'));
      expect(truncated.status, JSON.stringify(truncated.body).slice(0, 300)).toBe(200);
    } finally {
      restore();
    }
    const measured = await post(chunking, '/embed', body('chunk'));
    expect([measured.status, measured.headers.get('x-windows')]).toEqual([200, '4']);
  });
});

describe('chunked requests among short ones', () => {
  it("a chunked request's windows run in the batches like any inputs: short requests queued after one chunked request and before two more are answered before the later two", async () => {
    const rand = makeRandom('long inputs among short ones');
    const hooks = overlapping.testHooks!;
    const n = BODY + 3 * (BODY - OVERLAP); // 4 windows with the overlap: a batch of them
    const longBody = () => ({ inputs: randomWords(rand, n).join(' '), long_inputs: 'chunk' });
    const order: string[] = [];
    const send = (name: string, body: unknown) => post(overlapping, '/embed', body).then((r) => (order.push(name), r.status));
    const queued = (count: number) => eventually(`${count} inputs queued`, async () => hooks.inputsWaiting('tiny-embed'), (w) => w >= count);
    await hooks.holdInference();
    const sent: Promise<number>[] = [];
    try {
      sent.push(send('long 1', longBody()));
      await queued(4);
      for (let i = 0; i < 6; i++) sent.push(send(`short ${i}`, { inputs: randomWords(rand, 3).join(' ') }));
      await queued(10);
      sent.push(send('long 2', longBody()));
      await queued(14);
      sent.push(send('long 3', longBody()));
      await queued(18);
    } finally {
      hooks.releaseInference();
    }
    expect(await Promise.all(sent)).toEqual(Array(sent.length).fill(200));
    const at = (name: string) => order.indexOf(name);
    const lastShort = Math.max(...Array.from({ length: 6 }, (_, i) => at(`short ${i}`)));
    expect(lastShort, order.join(', ')).toBeLessThan(Math.min(at('long 2'), at('long 3')));
    expect(at('long 1'), order.join(', ')).toBeLessThan(lastShort);
  });
});

describe('windows at their edges (long-inputs.ts)', () => {
  const around = { lead: 1, trail: 1 };
  const tokensOf = (n: number) => ({ ids: Int32Array.from({ length: n }, (_, i) => (i === 0 ? 101 : i === n - 1 ? 102 : 1000 + i)), typeIds: new Int32Array(n) });
  const policy = (overlap: number) => ({ maxInputTokens: 1000, overlap });

  it('a text that fits is one window, itself; one token more takes a second window of that one token', () => {
    const fits = tokensOf(MAX_LENGTH);
    expect(splitTokens(fits, MAX_LENGTH, around, policy(0))).toEqual([fits]);
    const over = splitTokens(tokensOf(MAX_LENGTH + 1), MAX_LENGTH, around, policy(0));
    expect(over.map((w) => w.ids.length)).toEqual([MAX_LENGTH, 3]);
    expect(Array.from(over[1]!.ids)).toEqual([101, 1000 + BODY + 1, 102]);
  });

  it('every text token is in a window, in order, each window repeating `overlap` of the one before; an overlap past half a window is half of it', () => {
    for (const [n, overlap, used] of [
      [500, 0, 0],
      [500, 10, 10],
      [BODY * 3 + 2, 0, 0],
      [BODY + (BODY - 10) + 2, 10, 10], // the last window ends at the text's end: no window of repeats only
      [500, 50, BODY / 2],
    ] as const) {
      const windows = splitTokens(tokensOf(n), MAX_LENGTH, around, policy(overlap));
      const joined: number[] = [];
      windows.forEach((w, k) => {
        expect([w.ids[0], w.ids[w.ids.length - 1]]).toEqual([101, 102]);
        expect(w.ids.length).toBeLessThanOrEqual(MAX_LENGTH);
        joined.push(...w.ids.subarray(1 + (k === 0 ? 0 : used), w.ids.length - 1));
      });
      expect(joined, `${n} tokens, overlap ${overlap}`).toEqual(Array.from({ length: n - 2 }, (_, i) => 1001 + i));
      // The fewest windows that hold the text: each after the first adds BODY - used new tokens.
      expect(windows, `${n} tokens, overlap ${overlap}`).toHaveLength(Math.ceil((n - 2 - used) / (BODY - used)));
      expect(windowStarts(n - 2, BODY, used)).toHaveLength(windows.length);
    }
  });
});
