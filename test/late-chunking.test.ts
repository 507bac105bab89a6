/**
 * Late chunking: /embed with `chunks` ([start, end) code-point spans of the one
 * text) answers a row per chunk, pooled over the chunk's tokens of the whole
 * text's token states (issue 25, item 4; Jina, arXiv 2409.04701).
 *
 * The reference is independent of the server's graph and of its offsets: a
 * plain onnxruntime session of the unmodified model.onnx, the one input alone
 * and unpadded, its last_hidden_state pooled here by this file's own code over
 * the tokens of each chunk. Texts are whole words of the vocabulary joined by
 * single spaces, so word k is token k after [CLS] (and the prompt's tokens),
 * and it starts where this file put it: which tokens a chunk holds is known
 * without the server's tokenizer offsets (checked: the token count is the
 * word count plus the special tokens). Chunk ends fall at word ends or just
 * after the space, at random: the space belongs to no token either way.
 */
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { unpack } from 'msgpackr';
import * as ort from 'onnxruntime-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { writePreset } from '../dist/models/generator/presets.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { loadModelSpec, type Pooling } from '../dist/src/shared/model-format/model-config.js';
import { sentTogether } from './fixtures/queued-together.js';
import { makeRandom, testServerConfig, vocabularyWords, wsRequest } from './helpers.js';

process.env.SLABSERVE_TEST_HOOKS = '1';

const TOLERANCE = 1e-5;
const MAX_LENGTH = 64;
const HIDDEN = 128;
/** The poolings other than tiny-embed's mean, each served from a copy of its folder. */
const OTHER_POOLINGS: Pooling[] = ['max', 'mean_sqrt_len', 'weightedmean', 'cls', 'lasttoken'];

let root: string;
let server: Server;
let plain: ort.InferenceSession;
let tok: TextTokenizer;
let words: string[];

// ------------------------------------------------------------------ texts and chunks, by words

/** A text of whole vocabulary words joined by single spaces; `starts[k]`: where word k starts (code points). */
interface Doc {
  words: string[];
  text: string;
  starts: number[];
}

function docOf(ws: string[]): Doc {
  const starts: number[] = [];
  let at = 0;
  for (const w of ws) {
    starts.push(at);
    at += w.length + 1;
  }
  return { words: ws, text: ws.join(' '), starts };
}

function randomDoc(rand: () => number, min: number, max: number): Doc {
  const n = min + Math.floor(rand() * (max - min + 1));
  return docOf(Array.from({ length: n }, () => words[Math.floor(rand() * words.length)]!));
}

/** Chunks as words [first, end) of the doc, with their spans. */
interface Chunks {
  spans: [number, number][];
  words: [number, number][];
}

/** The span of words [a, b): from word a's start to word b-1's end, or (`space`) through the space after it. */
function spanOf(doc: Doc, a: number, b: number, space: boolean): [number, number] {
  const end = doc.starts[b - 1]! + doc.words[b - 1]!.length;
  return [doc.starts[a]!, space && b < doc.words.length ? end + 1 : end];
}

/** Random chunks at word boundaries over words [from, to): a partition, some parts left out (never all). */
function randomChunks(rand: () => number, doc: Doc, from = 0, to = doc.words.length): Chunks {
  const out: Chunks = { spans: [], words: [] };
  for (let a = from; a < to; ) {
    const b = Math.min(to, a + 1 + Math.floor(rand() * 8));
    if (rand() > 0.2 || (out.words.length === 0 && b === to)) {
      out.words.push([a, b]);
      out.spans.push(spanOf(doc, a, b, rand() < 0.5));
    }
    a = b;
  }
  return out;
}

/** A text of 3 or 4 sentences of 10 to 15 words, a chunk each: what late chunking splits a document into. */
function sentencesDoc(rand: () => number): { doc: Doc; chunks: Chunks } {
  const sizes = Array.from({ length: 3 + Math.floor(rand() * 2) }, () => 10 + Math.floor(rand() * 6));
  const doc = randomDoc(rand, sizes.reduce((a, b) => a + b), sizes.reduce((a, b) => a + b));
  const chunks: Chunks = { spans: [], words: [] };
  let a = 0;
  for (const n of sizes) {
    chunks.words.push([a, a + n]);
    chunks.spans.push(spanOf(doc, a, a + n, true));
    a += n;
  }
  return { doc, chunks };
}

// ------------------------------------------------------------------ the independent reference

/** The unmodified graph's token states of one input alone: [n][hidden]. */
async function tokenStates(ids: ArrayLike<number>): Promise<Float32Array[]> {
  const n = ids.length;
  const i64 = (f: (i: number) => number) => new ort.Tensor('int64', BigInt64Array.from({ length: n }, (_, i) => BigInt(f(i))), [1, n]);
  const out = await plain.run({ input_ids: i64((i) => ids[i]!), attention_mask: i64(() => 1), token_type_ids: i64(() => 0) });
  const data = out.last_hidden_state!.data as Float32Array;
  return Array.from({ length: n }, (_, t) => data.slice(t * HIDDEN, (t + 1) * HIDDEN));
}

/**
 * sentence-transformers' pooling `mode` over the token positions `rows` of one
 * input's states, in float64: weightedmean weighs position t (from 0, [CLS]
 * and prompt counted) t + 1; cls and lasttoken take the span's first and last token.
 */
function spanPooled(states: Float32Array[], rows: number[], mode: Pooling, normalize: boolean): Float64Array {
  const out = new Float64Array(HIDDEN);
  const weight = (t: number) => (mode === 'weightedmean' ? t + 1 : 1);
  for (let h = 0; h < HIDDEN; h++) {
    const col = rows.map((t) => states[t]![h]!);
    if (mode === 'cls') out[h] = col[0]!;
    else if (mode === 'lasttoken') out[h] = col[col.length - 1]!;
    else if (mode === 'max') out[h] = Math.max(...col);
    else {
      const sum = rows.reduce((a, t, k) => a + weight(t) * col[k]!, 0);
      out[h] = mode === 'mean_sqrt_len' ? sum / Math.sqrt(rows.length) : sum / rows.reduce((a, t) => a + weight(t), 0);
    }
  }
  if (!normalize) return out;
  const norm = Math.hypot(...out);
  return out.map((v) => v / Math.max(norm, 1e-12));
}

function cosine(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i]! * b[i]!;
    na += a[i]! * a[i]!;
    nb += b[i]! * b[i]!;
  }
  return dot / Math.sqrt(na * nb);
}

/** How a request's text runs: the prompt before it, cut as asked. */
interface Run {
  prompt?: string;
  truncate?: boolean;
  direction?: 'right' | 'left';
}

/**
 * The reference rows of `chunks` of `doc` run as `run` says. What runs is
 * [CLS], a slice of the prompt's tokens then the words (one token each),
 * [SEP]: all of them, or with truncation the first (right) or last (left)
 * MAX_LENGTH - 2, so a left cut takes the prompt first.
 */
async function referenceRows(doc: Doc, chunks: Chunks, mode: Pooling, normalize: boolean, run: Run = {}): Promise<Float64Array[]> {
  const prompt = run.prompt ?? '';
  const ids = tok.encode(prompt + doc.text, { maxLength: MAX_LENGTH, truncate: run.truncate ?? false, direction: run.direction }).ids;
  const promptTokens = prompt === '' ? 0 : tok.encode(prompt, { maxLength: MAX_LENGTH, truncate: false }).ids.length - 2;
  const n = doc.words.length;
  const body = ids.length - 2;
  // Every word one token: the positions below hold only if the tokenizer agrees.
  expect(body, 'tokens between [CLS] and [SEP]').toBe(run.truncate ? Math.min(promptTokens + n, MAX_LENGTH - 2) : promptTokens + n);
  const left = run.direction === 'left';
  const wordsKept = left ? Math.min(n, body) : Math.max(0, body - promptTokens);
  const firstWord = left ? n - wordsKept : 0;
  const promptKept = body - wordsKept;
  const states = await tokenStates(ids);
  return chunks.words.map(([a, b]) => {
    const rows = Array.from({ length: b - a }, (_, k) => 1 + promptKept + a + k - firstWord);
    return spanPooled(states, rows, mode, normalize);
  });
}

/** Fails unless `got` holds a row per reference row, each within TOLERANCE; returns the worst difference. */
function expectRows(got: unknown, want: Float64Array[], what: string): number {
  const rows = got as number[][];
  expect(rows, `${what}: ${JSON.stringify(got).slice(0, 300)}`).toHaveLength(want.length);
  let worst = 0;
  for (let i = 0; i < want.length; i++) {
    expect(rows[i], `${what}: row ${i}`).toHaveLength(HIDDEN);
    for (let h = 0; h < HIDDEN; h++) worst = Math.max(worst, Math.abs(rows[i]![h]! - want[i]![h]!));
  }
  expect(worst, `${what}: the values`).toBeLessThan(TOLERANCE);
  return worst;
}

// ------------------------------------------------------------------ the server

async function post(path: string, body: unknown): Promise<{ status: number; body: any }> {
  const r = await fetch(`${server.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

/** A copy of the tiny-embed folder named `name`, its serve.json saying `serve` too. */
function variant(embedDir: string, name: string, serve: Record<string, unknown>): string {
  const dir = join(root, name);
  cpSync(embedDir, dir, { recursive: true });
  writeFileSync(join(dir, 'serve.json'), JSON.stringify({ task: 'embed', pooling: 'mean', normalize: true, maxLength: MAX_LENGTH, ...serve }));
  return dir;
}

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), 'slabserve-late-chunking-'));
  const embedDir = writePreset('tiny-embed', root, { maxLength: MAX_LENGTH }).dir;
  const spladeDir = writePreset('tiny-splade', root, { maxLength: MAX_LENGTH }).dir;
  const variants = OTHER_POOLINGS.map((p) => variant(embedDir, `tiny-embed-${p}`, { pooling: p }));
  variants.push(variant(embedDir, 'tiny-embed-passage', { defaultPrompt: 'passage: ' }));
  plain = await ort.InferenceSession.create(readFileSync(join(embedDir, 'model.onnx')), { executionProviders: ['cpu'], intraOpNumThreads: 1 });
  const spec = loadModelSpec(embedDir);
  tok = await loadTokenizer(spec.tokenizerPath);
  words = vocabularyWords(spec);
  const models = [embedDir, ...variants, spladeDir, 'tiny-intent'];
  server = await startServer(testServerConfig({ models, slotsPerModel: 64, tokenOutputMb: 1, batching: { maxBatchTokens: 2048 } }));
  await server.ready;
}, 120_000);

afterAll(async () => {
  await server?.close();
  await plain?.release();
  if (root) rmSync(root, { recursive: true, force: true });
});

// ------------------------------------------------------------------ the rows

describe('/embed with chunks: a row per chunk, pooled over its tokens of the whole text', () => {
  it('mean (tiny-embed), batched and padded with other texts: each row is the unmodified graph\'s states pooled over the chunk, within 1e-5, normalized and not', async () => {
    const rand = makeRandom('late chunking mean');
    const docs = Array.from({ length: 6 }, () => randomDoc(rand, 3, 50));
    const chunks = docs.map((d) => randomChunks(rand, d));
    let worst = 0;
    for (const normalize of [true, false]) {
      const answers = await sentTogether(server.testHooks, { 'tiny-embed': docs.length }, () =>
        Promise.all(docs.map((d, i) => post('/embed', { inputs: d.text, chunks: chunks[i]!.spans, normalize }))),
      );
      for (const [i, d] of docs.entries()) {
        expect(answers[i]!.status, JSON.stringify(answers[i]!.body).slice(0, 300)).toBe(200);
        worst = Math.max(worst, expectRows(answers[i]!.body, await referenceRows(d, chunks[i]!, 'mean', normalize), `"${d.text}" ${JSON.stringify(chunks[i]!.spans)} normalize ${normalize}`));
      }
    }
    const rows = chunks.reduce((n, c) => n + c.spans.length, 0);
    console.log(`late chunking mean: ${docs.length} texts of ${new Set(docs.map((d) => d.words.length)).size} lengths, ${rows} chunks, worst |diff| ${worst.toExponential(2)}`);
  });

  it('every other pooling (max, mean_sqrt_len, weightedmean, cls, lasttoken): the model\'s own mode over the chunk\'s tokens', async () => {
    const rand = makeRandom('late chunking poolings');
    for (const mode of OTHER_POOLINGS) {
      const doc = randomDoc(rand, 10, 50);
      const chunks = randomChunks(rand, doc);
      for (const normalize of [true, false]) {
        const r = await post(`/models/tiny-embed-${mode}/embed`, { inputs: doc.text, chunks: chunks.spans, normalize });
        expect(r.status, JSON.stringify(r.body).slice(0, 300)).toBe(200);
        const worst = expectRows(r.body, await referenceRows(doc, chunks, mode, normalize), `${mode} normalize ${normalize}`);
        if (normalize) console.log(`late chunking ${mode}: ${chunks.spans.length} chunks, worst |diff| ${worst.toExponential(2)}`);
      }
    }
  });

  it('a list of one text is that text; the body\'s model and POST / name the model as for any /embed', async () => {
    const rand = makeRandom('late chunking forms');
    const doc = randomDoc(rand, 5, 30);
    const chunks = randomChunks(rand, doc);
    const want = await referenceRows(doc, chunks, 'max', true);
    expectRows((await post('/embed', { inputs: [doc.text], chunks: chunks.spans, model: 'tiny-embed-max' })).body, want, 'a list of one, body model');
    expectRows((await post('/', { inputs: doc.text, chunks: chunks.spans, model: 'tiny-embed-max' })).body, want, 'POST /');
  });

  it('a prompt (the request\'s, or the model\'s default) is put before the text: chunk offsets are of the text as sent, the prompt\'s tokens in no chunk (but in the context)', async () => {
    const rand = makeRandom('late chunking prompt');
    const doc = randomDoc(rand, 5, 40);
    const chunks = randomChunks(rand, doc);
    const r = await post('/embed', { inputs: doc.text, chunks: chunks.spans, prompt: 'query: ' });
    expect(r.status, JSON.stringify(r.body).slice(0, 300)).toBe(200);
    expectRows(r.body, await referenceRows(doc, chunks, 'mean', true, { prompt: 'query: ' }), 'prompt');
    // the prompt is context: the same chunks without it are other rows
    const bare = await referenceRows(doc, chunks, 'mean', true);
    expect(Math.min(...bare.map((b, i) => cosine(b, r.body[i])))).toBeLessThan(0.99999);
    // a model's default prompt, when the request names none
    const byDefault = await post('/models/tiny-embed-passage/embed', { inputs: doc.text, chunks: chunks.spans });
    expectRows(byDefault.body, await referenceRows(doc, chunks, 'mean', true, { prompt: 'passage: ' }), 'the default prompt');
  });

  it('too long: 413 without truncate; with it, chunks in the kept part, right (the start kept) and left (the end kept); a chunk cut off is a 422', async () => {
    const rand = makeRandom('late chunking truncation');
    const doc = randomDoc(rand, MAX_LENGTH + 10, MAX_LENGTH + 40);
    const tooLong = await post('/embed', { inputs: doc.text, chunks: [[0, 5]] });
    expect([tooLong.status, tooLong.body.code]).toEqual([413, 'SLABSERVE_INPUT_TOO_LONG']);
    const kept = MAX_LENGTH - 2;
    const n = doc.words.length;
    for (const [direction, from, to] of [
      ['right', 0, kept],
      ['left', n - kept, n],
    ] as const) {
      const chunks = randomChunks(rand, doc, from, to);
      const r = await post('/embed', { inputs: doc.text, chunks: chunks.spans, truncate: true, truncation_direction: direction });
      expect(r.status, JSON.stringify(r.body).slice(0, 300)).toBe(200);
      expectRows(r.body, await referenceRows(doc, chunks, 'mean', true, { truncate: true, direction }), `truncate ${direction}`);
      // a prompt: cut right, it takes the place of the last words; cut left, it goes first
      const prompted = await post('/embed', { inputs: doc.text, chunks: chunks.spans.slice(0, 1), truncate: true, truncation_direction: direction, prompt: 'query: ' });
      expect(prompted.status, JSON.stringify(prompted.body).slice(0, 300)).toBe(200);
      const first = { spans: chunks.spans.slice(0, 1), words: chunks.words.slice(0, 1) };
      expectRows(prompted.body, await referenceRows(doc, first, 'mean', true, { truncate: true, direction, prompt: 'query: ' }), `truncate ${direction}, a prompt`);
      // a chunk of words the cut dropped
      const lost = direction === 'right' ? spanOf(doc, kept, n, false) : spanOf(doc, 0, n - kept, false);
      const spans = direction === 'right' ? [...chunks.spans, lost] : [lost, ...chunks.spans];
      const cut = await post('/embed', { inputs: doc.text, chunks: spans, truncate: true, truncation_direction: direction });
      const index = direction === 'right' ? spans.length - 1 : 0;
      expect([cut.status, cut.body.code]).toEqual([422, 'SLABSERVE_INVALID_INPUT']);
      expect(cut.body.error).toMatch(new RegExp(`chunk ${index} \\[.*holds no token: truncation cut its tokens off`));
    }
  });

  it('over WebSocket (op embed with chunks): the same rows, as numbers and as f32 bytes', async () => {
    const rand = makeRandom('late chunking ws');
    const doc = randomDoc(rand, 5, 40);
    const chunks = randomChunks(rand, doc);
    const want = await referenceRows(doc, chunks, 'mean', true);
    const frame = await wsRequest(server.port, { id: 'a', op: 'embed', inputs: doc.text, chunks: chunks.spans });
    expect(frame.error).toBeUndefined();
    expectRows(frame.result, want, 'WebSocket');
    const f32 = await wsRequest(server.port, { id: 'b', op: 'embed', inputs: doc.text, chunks: chunks.spans, encoding: 'f32' });
    const rows = (f32.result as Uint8Array[]).map((b) => Array.from(new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength))));
    expectRows(rows, want, 'WebSocket f32');
    const bad = await wsRequest(server.port, { id: 'c', op: 'embed', inputs: doc.text, chunks: [[0, 1], [0, 10_000]] });
    expect(bad.error?.code).toBe('SLABSERVE_INVALID_INPUT');
    expect(bad.error?.message).toMatch(/chunk 1 \[0, 10000\)/);
  });

  it('quantized embedding_type: the chunk rows quantized as any row (int8 of the float row, ubinary its signs)', async () => {
    const rand = makeRandom('late chunking int8');
    const doc = randomDoc(rand, 5, 40);
    const chunks = randomChunks(rand, doc);
    const want = await referenceRows(doc, chunks, 'mean', true);
    const int8 = await post('/embed', { inputs: doc.text, chunks: chunks.spans, embedding_type: 'int8' });
    expect(int8.status, JSON.stringify(int8.body).slice(0, 300)).toBe(200);
    expect(int8.body).toHaveLength(want.length);
    for (const [i, row] of want.entries()) {
      const q = (int8.body[i] as number[]).map((v, h) => Math.abs(v - Math.round(row[h]! * 127)));
      expect(Math.max(...q), `int8 row ${i}`).toBeLessThanOrEqual(1);
    }
    const msgpack = await fetch(`${server.url}/embed`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/msgpack' },
      body: JSON.stringify({ inputs: doc.text, chunks: chunks.spans, embedding_type: 'ubinary' }),
    });
    const bits = unpack(new Uint8Array(await msgpack.arrayBuffer())) as Uint8Array[];
    for (const [i, row] of want.entries()) {
      const signs = Array.from({ length: HIDDEN }, (_, h) => (bits[i]![h >> 3]! >> (7 - (h & 7))) & 1);
      const close = row.map((v, h) => (Math.abs(v) < 1e-6 ? signs[h]! : v > 0 ? 1 : 0));
      expect(signs, `ubinary row ${i}`).toEqual(Array.from(close));
    }
  });
});

describe('the rules of a chunk', () => {
  it('offsets count code points: a chunk ends at the text\'s length in code points, one past it is a 422; a tight chunk finds its token', async () => {
    const [a, b] = [words[0]!, words[1]!];
    const text = `😀😀 ${a} ${b}`; // two code points, two UTF-16 units each, before the words
    const length = Array.from(text).length;
    const bStart = length - b.length;
    const ids = tok.encode(text, { maxLength: MAX_LENGTH, truncate: false }).ids;
    expect(ids.length).toBe(5); // [CLS] [UNK] a b [SEP]
    const states = await tokenStates(ids);
    const ok = await post('/embed', { inputs: text, chunks: [[0, 3], [3, bStart], [bStart, bStart + 1], [bStart, length]] });
    expect(ok.status, JSON.stringify(ok.body)).toBe(200);
    expectRows(ok.body, [[1], [2], [3], [3]].map((rows) => spanPooled(states, rows, 'mean', true)), 'code points');
    const past = await post('/embed', { inputs: text, chunks: [[0, 3], [bStart, length + 1]] });
    expect([past.status, past.body.code]).toEqual([422, 'SLABSERVE_INVALID_INPUT']);
    expect(past.body.error).toMatch(new RegExp(`chunk 1 \\[${bStart}, ${length + 1}\\): end is past the text's end \\(${length} code points\\)`));
  });

  it('a token straddling a boundary counts once, in the chunk it starts in; chunks may overlap and need not cover the text', async () => {
    const doc = docOf([words[2]!, words[3]!, words[4]!]);
    const ids = tok.encode(doc.text, { maxLength: MAX_LENGTH, truncate: false }).ids;
    const states = await tokenStates(ids);
    const mid = (k: number) => doc.starts[k]! + 1; // inside word k
    const chunks = [
      [0, mid(0)], // word 0 starts in it
      [mid(0), mid(1)], // word 1
      [doc.starts[1]!, doc.text.length], // words 1 and 2, overlapping the one before
    ];
    const r = await post('/embed', { inputs: doc.text, chunks, normalize: false });
    expectRows(r.body, [[1], [2], [2, 3]].map((rows) => spanPooled(states, rows, 'mean', false)), 'straddling');
  });

  it('each refusal is a 422 (SLABSERVE_INVALID_INPUT) naming the chunk; a model without token states is a 424', async () => {
    const doc = docOf([words[5]!, words[6]!, words[7]!]);
    const text = doc.text;
    const len = text.length;
    const refused = async (body: Record<string, unknown>, pattern: RegExp, path = '/embed') => {
      const r = await post(path, { inputs: text, ...body });
      expect([r.status, r.body.code], `${JSON.stringify(body).slice(0, 100)}: ${JSON.stringify(r.body)}`).toEqual([422, 'SLABSERVE_INVALID_INPUT']);
      expect(r.body.error).toMatch(pattern);
    };
    await refused({ inputs: [text, text], chunks: [[0, 3]] }, /chunks are spans of one text: give one input, not 2/);
    await refused({ inputs: [101, 2000, 102], chunks: [[0, 3]] }, /token ids have no character offsets/);
    await refused({ chunks: [] }, /chunks must not be an empty list/);
    await refused({ chunks: 'all' }, /chunks: must be a list of \[start, end\] spans/);
    await refused({ chunks: [[0, 3], [1.5, 4]] }, /chunk 1 \(\[1\.5,4\]\) must be \[start, end\]: two integers/);
    await refused({ chunks: [[0, 3], [4]] }, /chunk 1 \(\[4\]\) must be \[start, end\]/);
    await refused({ chunks: [[0, 3], '4-5'] }, /chunk 1 \("4-5"\) must be \[start, end\]/);
    await refused({ chunks: [[0, 3], [-1, 2]] }, /chunk 1 \[-1, 2\): start must not be negative/);
    await refused({ chunks: [[0, 3], [4, len + 1]] }, new RegExp(`chunk 1 \\[4, ${len + 1}\\): end is past the text's end \\(${len} code points\\)`));
    await refused({ chunks: [[0, 3], [4, 4]] }, /chunk 1 \[4, 4\): start must be before end/);
    await refused({ chunks: [[0, 3], [5, 9], [2, 4]] }, /chunk 2 \[2, 4\) is unordered: it starts before chunk 1 \(at 5\)/);
    // the space between words 0 and 1: no token starts in it
    const space = doc.starts[1]! - 1;
    await refused({ chunks: [[0, space], [space, space + 1]] }, new RegExp(`chunk 1 \\[${space}, ${space + 1}\\) holds no token: no token starts in it`));
    await refused({ chunks: Array.from({ length: 1025 }, () => [0, 1]) }, /1025 chunks exceed the limit of 1024 per request/);
    await refused({ inputs: 'a '.repeat(40_000), chunks: [[0, 1]], truncate: true }, /80000 characters with chunks; at most 65536/);
    await refused({ chunks: [[0, 3]], normalize: false, embedding_type: 'int8' }, /normalize/);
    await refused({ chunks: [[0, 3]], model: 'tiny-intent' }, /tiny-intent" is a classify model/);
    for (const [path, body] of [
      ['/embed', { model: 'tiny-splade' }],
      ['/models/tiny-splade/embed', {}],
    ] as const) {
      const r = await post(path, { inputs: text, chunks: [[0, 3]], ...body });
      expect([r.status, r.body.code]).toEqual([424, 'SLABSERVE_OUTPUT_UNAVAILABLE']);
      expect(r.body.error).toMatch(/"tiny-splade" has no token states to pool chunks from: it gives dense and sparse/);
    }
  });
});

describe('what late chunking is for', () => {
  // Sentence-sized chunks: a one-word text alone is mostly [CLS] and [SEP] in its own mean, and on this
  // generated model (random weights, context-heavy) its late row was seen as far as cosine 0.25 from it.
  // Over 600 chunks of 10 to 15 words the cosine ranged from 0.60 to 0.92.
  it('a chunk\'s row has seen the whole text: it differs from the chunk\'s text embedded alone, yet stays closest to it', async () => {
    const rand = makeRandom('late chunking context');
    const cosines: number[] = [];
    const nearestOwn: boolean[] = [];
    for (let d = 0; d < 4; d++) {
      const { doc, chunks } = sentencesDoc(rand);
      const late = await post('/embed', { inputs: doc.text, chunks: chunks.spans });
      expect(late.status).toBe(200);
      const alone = await post('/embed', { inputs: chunks.words.map(([a, b]) => doc.words.slice(a, b).join(' ')) });
      expect(alone.status).toBe(200);
      for (let i = 0; i < chunks.words.length; i++) {
        cosines.push(cosine(late.body[i], alone.body[i]));
        // and it is its own chunk's: nearer its text alone than any other chunk's of the document
        const others = alone.body.filter((_: unknown, j: number) => j !== i).map((row: number[]) => cosine(late.body[i], row));
        nearestOwn.push(cosines[cosines.length - 1]! > Math.max(...others));
      }
    }
    const [lo, hi] = [Math.min(...cosines), Math.max(...cosines)];
    console.log(`late chunking: cosine of a chunk's late row to its text alone over ${cosines.length} chunks: ${lo.toFixed(4)} to ${hi.toFixed(4)}`);
    console.log(`late chunking: nearest its own chunk's text alone in ${nearestOwn.filter(Boolean).length} of ${nearestOwn.length}`);
    expect(hi).toBeLessThan(0.9999);
    expect(lo).toBeGreaterThan(0.5);
    // Rows of the whole document's mean, or of the wrong spans, are nearer other chunks; the right ones are
    // nearest their own (every chunk in 11 runs here: one miss is allowed).
    expect(nearestOwn.filter(Boolean).length).toBeGreaterThanOrEqual(nearestOwn.length - 1);
  });
});
