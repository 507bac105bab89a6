/**
 * The compatible HTTP dialects on a real server (port 0, real sockets, real
 * onnxruntime on CPU): OpenAI's embeddings through the official `openai`
 * client, KServe v2 / Triton's infer protocol, and the rest of
 * text-embeddings-inference's API (rerank, tokenize, decode, pre-tokenized
 * inputs). Each dialect's rows are checked against the independent
 * reference: the model's unmodified model.onnx run by a plain onnxruntime
 * session on each input (or pair) alone, unpadded, its output pooled and
 * normalised, or put through softmax or sigmoid, by the test's own code
 * (PlainReference); the batched checks run on a second server that pads to
 * the bucket too, hold the inference loop until all their requests are
 * queued (test/fixtures/queued-together.ts), and read /metrics to show they
 * ran in exactly the batches their buckets make. Token
 * offsets are checked against the Rust `tokenizers` library.
 */
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI, { BadRequestError, NotFoundError } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { prepareModel } from '../dist/src/gpu-worker/graph.js';
import { SERVER_DEFAULTS, startServer, type Server } from '../dist/src/main/server.js';
import { DEFAULT_PRESETS } from '../dist/models/generator/presets.js';
import { loadModelSpec } from '../dist/src/shared/model-format/model-config.js';
import { parseMetrics, type Metrics } from './fixtures/http-client.js';
import { batchesOfQueued, sentTogether, servedBatching } from './fixtures/queued-together.js';
import { makeRandom, maxAbsDiff, modelsDir, PlainReference, randomTexts, scoresByClassId, sigmoid, testServerConfig, vocabularyWords } from './helpers.js';

// Read by startServer: the batched checks hold the inference loop while they queue their requests (sentTogether).
process.env.SLABSERVE_TEST_HOOKS = '1';

const TOLERANCE = 1e-5;
const MODELS = ['tiny-embed', 'tiny-intent', 'tiny-rerank'];
// short buckets: a quicker warm-up; nothing here needs long inputs
const BUCKETS = [8, 16, 32, 64, 128];

/** Padded to the longest input of each run (padTo 'auto' on CPU). */
let server: Server;
/** The same buckets, every row padded to its bucket's length (padTo 'bucket', as on a GPU). */
let bucketServer: Server;
let openai: OpenAI;
// The independent references: the unmodified model.onnx, one input at a time, finished by the test's code.
let embedRef: PlainReference;
let intentRef: PlainReference;
let rerankRef: PlainReference;
let tok: TextTokenizer;
let words: string[];

beforeAll(async () => {
  server = await startServer(testServerConfig({ models: MODELS, batching: { buckets: BUCKETS, maxBatchSize: 32 } }));
  bucketServer = await startServer(testServerConfig({ models: ['tiny-intent', 'tiny-rerank'], batching: { buckets: BUCKETS, maxBatchSize: 32, padTo: 'bucket' } }));
  await Promise.all([server.ready, bucketServer.ready]);
  openai = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
  [embedRef, intentRef, rerankRef] = await Promise.all(['tiny-embed', 'tiny-intent', 'tiny-rerank'].map((m) => PlainReference.open(m)));
  tok = await loadTokenizer(rerankRef.spec.tokenizerPath);
  words = vocabularyWords(rerankRef.spec);
}, 120_000);

afterAll(async () => {
  await Promise.all([embedRef?.close(), intentRef?.close(), rerankRef?.close()]);
  await Promise.all([server?.close(), bucketServer?.close()]);
});

// ------------------------------------------------------------ helpers

interface Reply {
  status: number;
  body: any; // eslint-disable-line @typescript-eslint/no-explicit-any
  headers: Headers;
}

async function call(method: string, path: string, body?: unknown, raw?: string): Promise<Reply> {
  const res = await fetch(server.url + path, {
    method,
    headers: body !== undefined || raw !== undefined ? { 'content-type': 'application/json' } : {},
    ...(body !== undefined ? { body: JSON.stringify(body) } : raw !== undefined ? { body: raw } : {}),
  });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // not JSON: keep the text
  }
  return { status: res.status, body: parsed, headers: res.headers };
}
const post = (path: string, body: unknown) => call('POST', path, body);
const get = (path: string) => call('GET', path);

/** tiny-embed's unmodified graph on each text alone, mean-pooled and normalised by the test: what every dialect must answer. */
async function refEmbeddings(texts: string[]): Promise<Float64Array[]> {
  return Promise.all(texts.map((t) => embedRef.embedding(tok.encode(t, { maxLength: 128, truncate: false }).ids)));
}

/** Slots in use per model, from /metrics (the owner frees a slot after reading it, so poll briefly). */
async function expectNoSlotsInUse(): Promise<void> {
  let last = '';
  for (let attempt = 0; attempt < 100; attempt++) {
    const text = (await get('/metrics')).body as string;
    const lines = text.split('\n').filter((l) => l.startsWith('slabserve_slots_in_use{'));
    last = lines.join('\n');
    if (lines.length === MODELS.length && lines.every((l) => Number(l.split(' ').pop()) === 0)) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  expect.fail(`slots still in use:\n${last}`);
}

async function metricsOf(srv: Server): Promise<Metrics> {
  return parseMetrics(await (await fetch(srv.url + '/metrics')).text());
}

/** What `work` made `srv` run for `model`, from /metrics before and after: rows, batches, real and padded tokens. */
async function ranFor<T>(srv: Server, model: string, work: () => Promise<T>): Promise<{ result: T; rows: number; batches: number; real: number; padded: number }> {
  const before = await metricsOf(srv);
  const result = await work();
  const after = await metricsOf(srv);
  const d = (name: string, labels: Record<string, string> = {}) => after.sum(name, { model, ...labels }) - before.sum(name, { model, ...labels });
  return {
    result,
    rows: d('slabserve_batch_size_sum'),
    batches: d('slabserve_batch_size_count'),
    real: d('slabserve_tokens_total', { kind: 'real' }),
    padded: d('slabserve_tokens_total', { kind: 'padded' }),
  };
}

/**
 * What ranFor measured for requests all queued at once (sentTogether): every row ran once, in
 * exactly the batches their buckets make and so fewer than requests, the real tokens the test
 * counted, padded as asked (to each row's bucket, or to no more than that: the longest of each run).
 */
function expectBatchedAsPadded(ran: { rows: number; batches: number; real: number; padded: number }, want: { rows: number; requests: number; batches: number; real: number; bucketed: number; padTo: string }): void {
  expect(ran.rows).toBe(want.rows);
  expect(ran.batches).toBe(want.batches);
  expect(ran.batches).toBeLessThan(want.requests);
  expect(ran.real).toBe(want.real);
  if (want.padTo === 'bucket') expect(ran.padded).toBe(want.bucketed);
  else expect(ran.padded).toBeLessThan(want.bucketed);
}

/** The length of the bucket an input of `length` tokens is padded to with padTo 'bucket'. */
const bucketLength = (length: number) => BUCKETS.find((b) => length <= b)!;

async function postTo(srv: Server, path: string, body: unknown): Promise<{ status: number; body: any }> {
  const r = await fetch(srv.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.text();
  try {
    return { status: r.status, body: JSON.parse(text) };
  } catch {
    return { status: r.status, body: text };
  }
}

/** The two servers, by what they pad a batch to. */
const PADDINGS = [
  { padTo: 'longest', srv: () => server },
  { padTo: 'bucket', srv: () => bucketServer },
] as const;

/** The BERT normaliser of the generated models: lowercase, accents stripped. */
const normalise = (s: string) => s.toLowerCase().normalize('NFD').replace(/\p{Mn}/gu, '');

/** Random texts with capitals, accents and punctuation, whose decode is their normalised form. */
function messyTexts(rand: () => number, count: number): string[] {
  const accent: Record<string, string> = { a: 'à', e: 'é', i: 'î', o: 'ö', u: 'ü', c: 'ç', n: 'ñ' };
  return randomTexts(rand, words, count, 12).map((t) =>
    t
      .split(' ')
      .map((w) => {
        let x = w;
        if (rand() < 0.3) x = x[0]!.toUpperCase() + x.slice(1);
        if (rand() < 0.2) x = x.toUpperCase();
        if (rand() < 0.3) x = x.replace(/[aeiocn]/, (c) => accent[c]!);
        if (rand() < 0.2) x += ['.', ',', '!', '?'][Math.floor(rand() * 4)]!;
        return x;
      })
      .join(' '),
  );
}

/** `text` with emoji, CJK (in and outside the BMP), control and zero-width characters, whitespace runs and [UNK] words put between its words. */
function stressed(rand: () => number, text: string): string {
  const pick = <T>(xs: readonly T[]) => xs[Math.floor(rand() * xs.length)]!;
  const extras = ['😀', '👍🏽', '❤️', '𠀋', '你好', '\u0000', '\u200b', '\u00ad', '\u3000', 'x'.repeat(120), '∑x', 'e\u0301te\u0301', '[MASK]'];
  return text
    .split(' ')
    .map((w) => (rand() < 0.3 ? `${pick(extras)} ${w}` : w))
    .join(pick([' ', '  ', '\t', ' \n ']));
}

// ------------------------------------------------------------ OpenAI

describe('OpenAI /v1 through the official client', () => {
  it("a string, a list, and the model's token arrays: each the unmodified graph's embedding of that input alone", async () => {
    const rand = makeRandom('openai embeddings');
    const texts = randomTexts(rand, words, 6, 20);
    const expected = await refEmbeddings(texts);

    const one = await openai.embeddings.create({ model: 'tiny-embed', input: texts[0]! });
    expect(one.object).toBe('list');
    expect(one.model).toBe('tiny-embed');
    expect(one.data).toHaveLength(1);
    expect(one.data[0]!.object).toBe('embedding');
    expect(one.data[0]!.index).toBe(0);
    expect(maxAbsDiff(one.data[0]!.embedding, expected[0]!)).toBeLessThan(TOLERANCE);
    const ids0 = Array.from(tok.encode(texts[0]!, { maxLength: 128, truncate: false }).ids);
    expect(one.usage).toEqual({ prompt_tokens: ids0.length, total_tokens: ids0.length });

    const list = await openai.embeddings.create({ model: 'tiny-embed', input: texts });
    expect(list.data.map((d) => d.index)).toEqual(texts.map((_, i) => i));
    list.data.forEach((d, i) => expect(maxAbsDiff(d.embedding, expected[i]!)).toBeLessThan(TOLERANCE));

    // the model's own token ids with the special tokens, as TEI takes them, when asked (`token_encoding`;
    // integer inputs are cl100k_base's otherwise: cl100k.test.ts): one list, and a list of lists
    const ids = texts.map((t) => Array.from(tok.encode(t, { maxLength: 128, truncate: false }).ids));
    const single = await openai.embeddings.create({ model: 'tiny-embed', input: ids[0]!, token_encoding: 'model' } as never);
    expect(single.data).toHaveLength(1);
    expect(maxAbsDiff(single.data[0]!.embedding, expected[0]!)).toBeLessThan(TOLERANCE);
    const many = await openai.embeddings.create({ model: 'tiny-embed', input: ids, token_encoding: 'model' } as never);
    many.data.forEach((d, i) => expect(maxAbsDiff(d.embedding, expected[i]!)).toBeLessThan(TOLERANCE));
    expect(many.usage.prompt_tokens).toBe(ids.reduce((s, x) => s + x.length, 0));

    // explicit float: plain number arrays
    const floats = await openai.embeddings.create({ model: 'tiny-embed', input: texts[1]!, encoding_format: 'float' });
    expect(Array.isArray(floats.data[0]!.embedding)).toBe(true);
    expect(maxAbsDiff(floats.data[0]!.embedding, expected[1]!)).toBeLessThan(TOLERANCE);
  });

  it('base64 is the little-endian float32 bytes of the same vector', async () => {
    const [text] = randomTexts(makeRandom('openai base64'), words, 1, 20);
    const [expected] = await refEmbeddings([text!]);
    // the client asks for base64 by default and decodes it; asked explicitly, it hands the string over
    const viaClient = await openai.embeddings.create({ model: 'tiny-embed', input: text!, encoding_format: 'base64' });
    const fromClient = viaClient.data[0]!.embedding as unknown as string;
    expect(typeof fromClient).toBe('string');

    const decode = (b64: string) => {
      const bytes = Buffer.from(b64, 'base64');
      expect(bytes.length).toBe(128 * 4);
      return Array.from({ length: 128 }, (_, i) => bytes.readFloatLE(i * 4));
    };
    expect(maxAbsDiff(decode(fromClient), expected!)).toBeLessThan(TOLERANCE);

    const raw = await post('/v1/embeddings', { model: 'tiny-embed', input: [text, text], encoding_format: 'base64' });
    expect(raw.status).toBe(200);
    for (const d of raw.body.data) {
      expect(typeof d.embedding).toBe('string');
      expect(maxAbsDiff(decode(d.embedding as string), expected!)).toBeLessThan(TOLERANCE);
    }
    // by default the client asks for base64 itself and decodes it to numbers
    const decoded = await openai.embeddings.create({ model: 'tiny-embed', input: text! });
    expect(maxAbsDiff(decoded.data[0]!.embedding, expected!)).toBeLessThan(TOLERANCE);
  });

  it('dimensions keeps the first N components, normalised again; more than the model has is refused', async () => {
    const [text] = randomTexts(makeRandom('openai dimensions'), words, 1, 20);
    const [full] = await refEmbeddings([text!]);
    const r = await openai.embeddings.create({ model: 'tiny-embed', input: text!, dimensions: 16 });
    const v = r.data[0]!.embedding;
    expect(v).toHaveLength(16);
    const head = full!.slice(0, 16);
    const norm = Math.hypot(...head);
    expect(maxAbsDiff(v, head.map((x) => x / norm))).toBeLessThan(TOLERANCE);
    expect(maxAbsDiff(v, full!.slice(0, 16))).toBeGreaterThan(1e-3); // normalised again: not merely cut
    expect(Math.hypot(...v)).toBeCloseTo(1, 5);

    const err = await openai.embeddings.create({ model: 'tiny-embed', input: text, dimensions: 129 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BadRequestError);
    expect((err as BadRequestError).status).toBe(400);
    expect((err as BadRequestError).param).toBe('dimensions');
  });

  it('lists the models; an unknown model is a NotFoundError; a classifier is a bad request', async () => {
    const ids: string[] = [];
    for await (const m of openai.models.list()) {
      expect(m.object).toBe('model');
      expect(m.owned_by).toBe('slabserve');
      expect(Number.isInteger(m.created)).toBe(true);
      ids.push(m.id);
    }
    expect(ids.sort()).toEqual([...MODELS].sort());
    expect((await openai.models.retrieve('tiny-embed')).id).toBe('tiny-embed');

    const missing = await openai.embeddings.create({ model: 'no-such-model', input: 'hi' }).catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(NotFoundError);
    expect((missing as NotFoundError).code).toBe('model_not_found');
    expect((missing as NotFoundError).param).toBe('model');
    expect(await openai.models.retrieve('no-such-model').catch((e: unknown) => e)).toBeInstanceOf(NotFoundError);

    const wrongTask = await openai.embeddings.create({ model: 'tiny-intent', input: 'hi' }).catch((e: unknown) => e);
    expect(wrongTask).toBeInstanceOf(BadRequestError);
  });

  it('errors come in OpenAI shape with OpenAI statuses, and leave no slot behind', async () => {
    const cases: [unknown, number, string | null][] = [
      [{ input: 'hi' }, 400, 'model'],
      [{ model: 'tiny-embed' }, 400, 'input'],
      [{ model: 'tiny-embed', input: '' }, 400, 'input'],
      [{ model: 'tiny-embed', input: [] }, 400, 'input'],
      [{ model: 'tiny-embed', input: [101, 99_999, 102], token_encoding: 'model' }, 400, 'input'],
      [{ model: 'tiny-embed', input: [101, 100_256, 102] }, 400, 'input'],
      [{ model: 'tiny-embed', input: [[101, 102], [-1]] }, 400, 'input'],
      [{ model: 'tiny-embed', input: 'hi', encoding_format: 'hex' }, 400, 'encoding_format'],
      [{ model: 'tiny-embed', input: 'hi', dimensions: 0 }, 400, 'dimensions'],
      [{ model: 'tiny-embed', input: 'parcel '.repeat(200) }, 400, 'input'],
      [{ model: 'nope', input: 'hi' }, 404, 'model'],
    ];
    for (const [body, status, param] of cases) {
      const r = await post('/v1/embeddings', body);
      expect(r.status, JSON.stringify(body).slice(0, 80)).toBe(status);
      expect(r.body.error).toMatchObject({ type: 'invalid_request_error', param });
      expect(typeof r.body.error.message).toBe('string');
      expect(typeof r.body.error.code).toBe('string');
    }
    const tooLong = await post('/v1/embeddings', { model: 'tiny-embed', input: 'parcel '.repeat(200) });
    expect(tooLong.body.error.code).toBe('context_length_exceeded');
    const malformed = await call('POST', '/v1/embeddings', undefined, '{"model": ');
    expect(malformed.status).toBe(400);
    expect(malformed.body.error.type).toBe('invalid_request_error');
    await expectNoSlotsInUse();
  });
});

// ------------------------------------------------------------ KServe v2

/** A right-padded [B, T] batch of token tensors for `texts`. */
function tokenTensors(texts: string[], datatype: 'INT64' | 'INT32' = 'INT64') {
  const encs = texts.map((t) => tok.encode(t, { maxLength: 10_000, truncate: false }));
  const T = Math.max(...encs.map((e) => e.ids.length)) + 3; // some padding on every row
  const ids: number[] = [];
  const mask: number[] = [];
  const types: number[] = [];
  for (const e of encs) {
    for (let j = 0; j < T; j++) {
      const real = j < e.ids.length;
      ids.push(real ? e.ids[j]! : 0);
      mask.push(real ? 1 : 0);
      types.push(0);
    }
  }
  const shape = [texts.length, T];
  return [
    { name: 'input_ids', shape, datatype, data: ids },
    { name: 'attention_mask', shape, datatype, data: mask },
    { name: 'token_type_ids', shape, datatype, data: types },
  ];
}

describe('one rounding on every path', () => {
  /** The numbers of a JSON array as written (the text, not the parsed double). */
  const numberTexts = (json: string, key: string) => {
    const at = json.indexOf(`"${key}":[`) + key.length + 4;
    return json.slice(at, json.indexOf(']', at)).split(',');
  };

  it('/embed, OpenAI float and base64, KServe: the same float32 values, written as the same shortest text that reads back to them', async () => {
    const rand = makeRandom('one rounding');
    for (const t of randomTexts(rand, words, 6, 20)) {
      // One at a time: the same row (batchmates could move the last bit), seen through every dialect.
      const embed = await (await fetch(server.url + '/embed', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: t }) })).text();
      const openaiText = await (await fetch(server.url + '/v1/embeddings', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ input: t, model: 'tiny-embed' }) })).text();
      const b64 = (await post('/v1/embeddings', { input: t, model: 'tiny-embed', encoding_format: 'base64' })).body.data[0].embedding as string;
      const kserveText = await (await fetch(server.url + '/v2/models/tiny-embed/infer', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: [{ name: 'text', datatype: 'BYTES', shape: [1], data: [t] }] }) })).text();
      const bytes = Buffer.from(b64, 'base64');
      const exact = Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4));
      const embedNumbers = embed.slice(2, -2).split(',');
      expect(numberTexts(openaiText, 'embedding')).toEqual(embedNumbers);
      expect(numberTexts(kserveText, 'data')).toEqual(embedNumbers);
      // Each text reads back to the float32 value exactly, and is no longer than needed: shortest.
      for (const [i, text] of embedNumbers.entries()) {
        expect(Math.fround(Number(text))).toBe(exact[i]);
        if (text.replace(/^-|e.*$|\./g, '').replace(/^0+/, '').length > 1) {
          const shorter = Number(Number(text).toPrecision(text.replace(/^-|e.*$|\./g, '').replace(/^0+/, '').length - 1));
          expect(Math.fround(shorter)).not.toBe(exact[i]);
        }
      }
    }
  });
});

describe('KServe v2 / Triton', () => {
  it('health, server and model metadata', async () => {
    expect(await get('/v2/health/live')).toMatchObject({ status: 200, body: { live: true } });
    expect(await get('/v2/health/ready')).toMatchObject({ status: 200, body: { ready: true } });
    const meta = await get('/v2');
    expect(meta.status).toBe(200);
    expect(meta.body).toMatchObject({ name: 'slabserve', extensions: [] });
    expect(typeof meta.body.version).toBe('string');

    const m = await get('/v2/models/tiny-embed');
    expect(m.status).toBe(200);
    expect(m.body).toMatchObject({ name: 'tiny-embed', versions: ['1'], platform: 'onnxruntime_onnx' });
    expect(m.body.inputs).toContainEqual({ name: 'input_ids', datatype: 'INT64', shape: [-1, -1] });
    expect(m.body.inputs).toContainEqual({ name: 'attention_mask', datatype: 'INT64', shape: [-1, -1] });
    expect(m.body.inputs).toContainEqual({ name: 'text', datatype: 'BYTES', shape: [-1] });
    expect(m.body.outputs).toEqual([{ name: 'embedding', datatype: 'FP32', shape: [-1, 128] }]);
    // How it is served, and from where (an extension: KServe v2 has no field for it).
    expect(m.body.parameters).toEqual({
      task: 'embed',
      dtype: 'fp32',
      max_input_length: 128, // this server's buckets end at 128
      pooling: 'mean',
      normalize: true,
      include_prompt: true,
      prompts: {},
      graph_inputs: ['input_ids', 'attention_mask', 'token_type_ids'],
      sources: { task: 'serve.json', dtype: 'default', pooling: 'serve.json', normalize: 'serve.json', maxLength: 'buckets' },
    });
    expect((await get('/v2/models/tiny-intent')).body.parameters).toMatchObject({ task: 'classify', max_input_length: 128 });
    expect((await get('/v2/models/tiny-intent')).body.parameters.pooling).toBeUndefined();
    expect((await get('/v2/models/tiny-intent')).body.outputs.map((o: { name: string }) => o.name)).toEqual(['probabilities', 'logits']);
    expect((await get('/v2/models/tiny-rerank')).body.outputs).toEqual([
      { name: 'score', datatype: 'FP32', shape: [-1, 1] },
      { name: 'logits', datatype: 'FP32', shape: [-1, 1] },
    ]);
    expect((await get('/v2/models/tiny-embed/versions/1')).status).toBe(200);
    expect(await get('/v2/models/tiny-embed/ready')).toMatchObject({ status: 200, body: { name: 'tiny-embed', ready: true } });

    const unknown = await get('/v2/models/nope');
    expect(unknown.status).toBe(404);
    expect(typeof unknown.body.error).toBe('string');
    expect((await get('/v2/models/nope/ready')).status).toBe(404);
    expect((await get('/v2/models/tiny-embed/versions/7')).status).toBe(404);
  });

  it('INT64 and INT32 token tensors (right-padded): each row the unmodified graph\'s embedding of that text alone', async () => {
    const rand = makeRandom('kserve tokens');
    const texts = randomTexts(rand, words, 5, 25);
    const expected = await refEmbeddings(texts);
    for (const datatype of ['INT64', 'INT32'] as const) {
      const r = await post('/v2/models/tiny-embed/infer', { id: 'req-1', inputs: tokenTensors(texts, datatype) });
      expect(r.status).toBe(200);
      expect(r.body).toMatchObject({ model_name: 'tiny-embed', model_version: '1', id: 'req-1' });
      expect(r.body.outputs).toHaveLength(1);
      const out = r.body.outputs[0];
      expect(out).toMatchObject({ name: 'embedding', datatype: 'FP32', shape: [5, 128] });
      texts.forEach((_, i) => expect(maxAbsDiff(out.data.slice(i * 128, i * 128 + 128), expected[i]!)).toBeLessThan(TOLERANCE));
    }
    // no mask and no type ids: every position is a real token
    const enc = tok.encode(texts[0]!, { maxLength: 128, truncate: false });
    const bare = await post('/v2/models/tiny-embed/infer', { inputs: [{ name: 'input_ids', shape: [1, enc.ids.length], datatype: 'INT64', data: Array.from(enc.ids) }] });
    expect(maxAbsDiff(bare.body.outputs[0].data, expected[0]!)).toBeLessThan(TOLERANCE);
    // nested data is flattened
    const nested = tokenTensors(texts.slice(0, 2)).map((t) => ({ ...t, data: [t.data.slice(0, t.shape[1]), t.data.slice(t.shape[1])] }));
    const n = await post('/v2/models/tiny-embed/infer', { inputs: nested });
    expect(maxAbsDiff(n.body.outputs[0].data.slice(0, 128), expected[0]!)).toBeLessThan(TOLERANCE);
  });

  it('BYTES text input, classifier outputs picked by `outputs`, rerank scores: each the unmodified graph\'s on that input alone', async () => {
    const rand = makeRandom('kserve bytes');
    const texts = randomTexts(rand, words, 3, 25);
    const expected = await refEmbeddings(texts);
    const r = await post('/v2/models/tiny-embed/infer', { inputs: [{ name: 'text', shape: [3], datatype: 'BYTES', data: texts }] });
    expect(r.status).toBe(200);
    texts.forEach((_, i) => expect(maxAbsDiff(r.body.outputs[0].data.slice(i * 128, i * 128 + 128), expected[i]!)).toBeLessThan(TOLERANCE));

    const classes = await Promise.all(texts.map((t) => intentRef.classification(tok.encode(t, { maxLength: 128, truncate: false }).ids)));
    const byText = await post('/v2/models/tiny-intent/infer', { inputs: [{ name: 'text', shape: [3, 1], datatype: 'BYTES', data: texts }] });
    expect(byText.body.outputs.map((o: { name: string }) => o.name)).toEqual(['probabilities', 'logits']);
    expect(byText.body.outputs[0].shape).toEqual([3, 8]);
    const byTokens = await post('/v2/models/tiny-intent/infer', { inputs: tokenTensors(texts), outputs: [{ name: 'logits' }] });
    expect(byTokens.body.outputs.map((o: { name: string }) => o.name)).toEqual(['logits']);
    texts.forEach((_, i) => {
      const row = (o: { data: number[] }) => o.data.slice(i * 8, i * 8 + 8);
      expect(maxAbsDiff(row(byText.body.outputs[0]), classes[i]!.probabilities), `probabilities ${i}`).toBeLessThan(TOLERANCE);
      expect(maxAbsDiff(row(byText.body.outputs[1]), classes[i]!.logits), `logits ${i}`).toBeLessThan(TOLERANCE);
      expect(maxAbsDiff(row(byTokens.body.outputs[0]), classes[i]!.logits), `logits from tokens ${i}`).toBeLessThan(TOLERANCE);
    });
    const predicted = await post('/predict', { inputs: texts[0], model: 'tiny-intent' });
    expect(Math.abs(predicted.body[0].score - Math.max(...classes[0]!.probabilities))).toBeLessThan(TOLERANCE);

    const query = randomTexts(rand, words, 1, 8)[0]!;
    const docs = randomTexts(rand, words, 3, 20);
    const pairs = docs.map((d) => tok.encodePair!(query, d, { maxLength: 128, truncate: false }));
    const want = await Promise.all(pairs.map((p) => rerankRef.rerank(p.ids, p.typeIds)));
    const ranked = await post('/v2/models/tiny-rerank/infer', {
      inputs: [
        { name: 'query', shape: [1], datatype: 'BYTES', data: [query] },
        { name: 'text', shape: [3], datatype: 'BYTES', data: docs },
      ],
    });
    expect(ranked.status).toBe(200);
    docs.forEach((_, i) => {
      expect(Math.abs(ranked.body.outputs[0].data[i] - want[i]!.score), `score ${i}`).toBeLessThan(TOLERANCE);
      expect(Math.abs(ranked.body.outputs[1].data[i] - want[i]!.logit), `logit ${i}`).toBeLessThan(TOLERANCE);
    });
    // the same pairs as token tensors, type ids 0 then 1, unpadded one by one
    for (const [i, pair] of pairs.entries()) {
      const shape = [1, pair.ids.length];
      const r = await post('/v2/models/tiny-rerank/infer', {
        inputs: [
          { name: 'input_ids', shape, datatype: 'INT64', data: Array.from(pair.ids) },
          { name: 'token_type_ids', shape, datatype: 'INT64', data: Array.from(pair.typeIds) },
        ],
        outputs: [{ name: 'score' }],
      });
      expect(r.body.outputs[0].shape).toEqual([1, 1]);
      expect(Math.abs(r.body.outputs[0].data[0] - want[i]!.score), `score from tokens ${i}`).toBeLessThan(TOLERANCE);
    }
  });

  it('bad requests get 4xx in KServe shape and leave no slot behind', async () => {
    const good = tokenTensors(['hello world', 'a longer text with several words']);
    const [ids, mask] = good;
    const cases: [string, unknown, number][] = [
      ['/v2/models/tiny-embed/infer', { inputs: [] }, 422],
      ['/v2/models/tiny-embed/infer', { inputs: [{ ...ids, datatype: 'FP32' }] }, 422],
      ['/v2/models/tiny-embed/infer', { inputs: [{ ...ids, shape: [2, 3] }] }, 422],
      ['/v2/models/tiny-embed/infer', { inputs: [{ ...ids, data: ids!.data.map((x, i) => (i === 1 ? 99_999 : x)) }] }, 422],
      ['/v2/models/tiny-embed/infer', { inputs: [ids, { ...mask, data: [...mask!.data].reverse() }] }, 422], // left padding
      ['/v2/models/tiny-embed/infer', { inputs: [ids, { ...mask, data: mask!.data.map(() => 0) }] }, 422],
      ['/v2/models/tiny-embed/infer', { inputs: [ids, { ...mask, shape: [1, mask!.data.length] }] }, 422],
      ['/v2/models/tiny-embed/infer', { inputs: [ids, { ...ids, name: 'pixels' }] }, 422],
      ['/v2/models/tiny-embed/infer', { inputs: good, outputs: [{ name: 'logits' }] }, 422],
      ['/v2/models/tiny-embed/infer', { inputs: [{ name: 'text', shape: [1], datatype: 'BYTES', data: [42] }] }, 422],
      ['/v2/models/tiny-embed/infer', { inputs: [{ name: 'text', shape: [1], datatype: 'BYTES', data: ['parcel '.repeat(200)] }] }, 413],
      ['/v2/models/tiny-rerank/infer', { inputs: [{ name: 'text', shape: [1], datatype: 'BYTES', data: ['no query'] }] }, 422],
      ['/v2/models/nope/infer', { inputs: good }, 404],
      ['/v2/models/tiny-embed/versions/2/infer', { inputs: good }, 404],
    ];
    for (const [path, body, status] of cases) {
      const r = await post(path, body);
      expect(r.status, `${path} ${JSON.stringify(body).slice(0, 120)}`).toBe(status);
      expect(Object.keys(r.body)).toEqual(['error']);
      expect(typeof r.body.error).toBe('string');
    }
    const tooLong = tokenTensors(['parcel '.repeat(200)]);
    expect((await post('/v2/models/tiny-embed/infer', { inputs: tooLong })).status).toBe(413);
    await expectNoSlotsInUse();
  });
});

// ------------------------------------------------------------ classify, batched

for (const { padTo, srv } of PADDINGS) describe(`classify, padded to the ${padTo}`, () => {
  it('many KServe and /predict requests at once are batched; probabilities are the softmax of the unmodified graph\'s logits, run alone', async () => {
    const rand = makeRandom(`classify ${padTo}`);
    const labels = intentRef.spec.labels;
    // Drawn until the unmodified graph gives them more than one top class (the random model says
    // one class for most texts): the answers must differ by text, not all be one label.
    const topOf = async (text: string) => {
      const p = (await intentRef.classification(tok.encode(text, { maxLength: 128, truncate: false }).ids)).probabilities;
      return p.indexOf(Math.max(...p));
    };
    let asked: string[][];
    do asked = Array.from({ length: 12 }, () => randomTexts(rand, words, 1 + Math.floor(rand() * 4), 40));
    while (new Set(await Promise.all(asked.flat().map(topOf))).size < 2);
    const inputs = asked.reduce((s, t) => s + t.length, 0);
    // All queued at once, through both dialects: the server batches them.
    const ran = await ranFor(srv(), 'tiny-intent', () =>
      sentTogether(srv().testHooks, { 'tiny-intent': inputs * 2 }, () =>
        Promise.all([
          Promise.all(asked.map((texts) => postTo(srv(), '/v2/models/tiny-intent/infer', { inputs: [{ name: 'text', shape: [texts.length], datatype: 'BYTES', data: texts }] }))),
          Promise.all(asked.map((texts) => postTo(srv(), '/predict', { inputs: texts, model: 'tiny-intent' }))),
        ]),
      ),
    );
    const [kserve, predict] = ran.result;
    let worstProbability = 0;
    let worstLogit = 0;
    let real = 0;
    let bucketed = 0;
    const lengths: number[] = [];
    for (const [k, texts] of asked.entries()) {
      expect(kserve[k]!.status, JSON.stringify(kserve[k]!.body)).toBe(200);
      expect(predict[k]!.status, JSON.stringify(predict[k]!.body)).toBe(200);
      const [probabilities, logits] = kserve[k]!.body.outputs as { name: string; shape: number[]; data: number[] }[];
      expect(probabilities).toMatchObject({ name: 'probabilities', shape: [texts.length, labels.length] });
      expect(logits).toMatchObject({ name: 'logits', shape: [texts.length, labels.length] });
      expect(predict[k]!.body).toHaveLength(texts.length);
      for (const [i, text] of texts.entries()) {
        const ids = tok.encode(text, { maxLength: 128, truncate: false }).ids;
        const want = await intentRef.classification(ids);
        const at = (o: { data: number[] }) => o.data.slice(i * labels.length, (i + 1) * labels.length);
        worstProbability = Math.max(worstProbability, maxAbsDiff(at(probabilities!), want.probabilities), maxAbsDiff(scoresByClassId(predict[k]!.body[i], labels), want.probabilities));
        worstLogit = Math.max(worstLogit, maxAbsDiff(at(logits!), want.logits));
        real += 2 * ids.length; // each text ran twice: KServe and /predict
        bucketed += 2 * bucketLength(ids.length);
        lengths.push(ids.length, ids.length);
      }
    }
    console.log(`classify ${padTo}: ${inputs * 2} rows in ${ran.batches} batches for ${asked.length * 2} requests; ${ran.padded} padded tokens for ${real} real; worst |probability| ${worstProbability.toExponential(2)}, |logit| ${worstLogit.toExponential(2)}`);
    expect(worstProbability).toBeLessThan(TOLERANCE);
    expect(worstLogit).toBeLessThan(TOLERANCE);
    const batches = batchesOfQueued(lengths, await servedBatching(srv().url, 'tiny-intent'));
    expectBatchedAsPadded(ran, { rows: inputs * 2, requests: asked.length * 2, batches, real, bucketed, padTo });
  });
});

// ------------------------------------------------------------ TEI: rerank, tokenize, decode, pre-tokenized

for (const { padTo, srv } of PADDINGS) describe(`TEI /rerank, padded to the ${padTo}`, () => {
  it('many requests at once are batched; each score is the sigmoid of its pair\'s logit from the unmodified graph run alone', async () => {
    const rand = makeRandom(`rerank ${padTo}`);
    const asked = Array.from({ length: 12 }, () => ({ query: randomTexts(rand, words, 1, 8)[0]!, texts: randomTexts(rand, words, 1 + Math.floor(rand() * 6), 30) }));
    const pairs = asked.reduce((s, a) => s + a.texts.length, 0);
    // All queued at once, scores and raw scores: the server batches them.
    const ran = await ranFor(srv(), 'tiny-rerank', () =>
      sentTogether(srv().testHooks, { 'tiny-rerank': pairs * 2 }, () =>
        Promise.all([
          Promise.all(asked.map((a) => postTo(srv(), '/rerank', { ...a, return_text: true }))),
          Promise.all(asked.map((a) => postTo(srv(), '/rerank', { ...a, raw_scores: true }))),
        ]),
      ),
    );
    const [scored, raw] = ran.result;
    let worstScore = 0;
    let worstLogit = 0;
    let real = 0;
    let bucketed = 0;
    const lengths: number[] = [];
    for (const [k, { query, texts }] of asked.entries()) {
      expect(scored[k]!.status, JSON.stringify(scored[k]!.body)).toBe(200);
      expect(raw[k]!.status, JSON.stringify(raw[k]!.body)).toBe(200);
      const ranked = scored[k]!.body as { index: number; score: number; text: string }[];
      expect(ranked.map((x) => x.index).sort((a, b) => a - b)).toEqual(texts.map((_, i) => i));
      for (let i = 1; i < ranked.length; i++) expect(ranked[i - 1]!.score).toBeGreaterThanOrEqual(ranked[i]!.score);
      const logitOf = new Map((raw[k]!.body as { index: number; score: number; text?: string }[]).map((x) => [x.index, x.score]));
      expect((raw[k]!.body as { text?: string }[]).every((x) => x.text === undefined)).toBe(true);
      for (const { index, score, text } of ranked) {
        expect(text).toBe(texts[index]);
        const pair = tok.encodePair!(query, texts[index]!, { maxLength: 128, truncate: false });
        expect(Array.from(pair.typeIds)).toContain(1);
        const want = await rerankRef.rerank(pair.ids, pair.typeIds);
        worstScore = Math.max(worstScore, Math.abs(score - want.score));
        worstLogit = Math.max(worstLogit, Math.abs(logitOf.get(index)! - want.logit));
        real += 2 * pair.ids.length; // scored and raw: each pair ran twice
        bucketed += 2 * bucketLength(pair.ids.length);
        lengths.push(pair.ids.length, pair.ids.length);
      }
    }
    console.log(`rerank ${padTo}: ${pairs * 2} rows in ${ran.batches} batches for ${asked.length * 2} requests; ${ran.padded} padded tokens for ${real} real; worst |score - sigmoid(logit)| ${worstScore.toExponential(2)}, |logit| ${worstLogit.toExponential(2)}`);
    expect(worstScore).toBeLessThan(TOLERANCE);
    expect(worstLogit).toBeLessThan(TOLERANCE);
    const batches = batchesOfQueued(lengths, await servedBatching(srv().url, 'tiny-rerank'));
    expectBatchedAsPadded(ran, { rows: pairs * 2, requests: asked.length * 2, batches, real, bucketed, padTo });
  });
});

describe('TEI /rerank', () => {
  it('truncate cuts a long pair (longest_first) as the Rust tokenizers library does; without it, 413', async () => {
    const rand = makeRandom('rerank truncate');
    const wordsOf = (min: number, spread: number) => Array.from({ length: min + Math.floor(rand() * spread) }, () => words[Math.floor(rand() * words.length)]).join(' ');
    // A query long enough that longest_first cuts it too, beside texts longer than the model's 128 tokens and a short one.
    const query = wordsOf(70, 40);
    const texts = [wordsOf(130, 100), wordsOf(2, 6), wordsOf(90, 60), wordsOf(130, 100)];
    expect((await post('/rerank', { query, texts: [texts[0]] })).status).toBe(413);
    const r = await post('/rerank', { query, texts, truncate: true, raw_scores: true });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    // The reference ids: the Rust library's, truncated to the model's length (its default strategy, longest_first).
    const { Tokenizer } = createRequire(import.meta.url)('tokenizers') as {
      Tokenizer: { fromFile(p: string): { setTruncation(maxLength: number): void; encode(a: string, b: string): Promise<{ getIds(): number[]; getTypeIds(): number[] }> } };
    };
    const rust = Tokenizer.fromFile(rerankRef.spec.tokenizerPath);
    rust.setTruncation(BUCKETS[BUCKETS.length - 1]!);
    for (const [i, text] of texts.entries()) {
      const pair = await rust.encode(query, text);
      const ids = pair.getIds();
      const typeIds = pair.getTypeIds();
      if (i !== 1) expect(ids.length, `pair ${i}`).toBe(BUCKETS[BUCKETS.length - 1]);
      expect(typeIds, `pair ${i}: the text kept`).toContain(1);
      const got = (r.body as { index: number; score: number }[]).find((x) => x.index === i)!;
      expect(Math.abs(got.score - (await rerankRef.rerank(ids, typeIds)).logit), `pair ${i}`).toBeLessThan(TOLERANCE);
    }
  });

  it('bad requests get 4xx and leave no slot behind', async () => {
    const cases: [unknown, number][] = [
      [{ query: 'q' }, 422],
      [{ query: '', texts: ['a'] }, 422],
      [{ query: 'q', texts: [] }, 422],
      [{ query: 'q', texts: ['a', ''] }, 422],
      [{ query: 'q', texts: 'a' }, 422],
      [{ query: 'q', texts: ['a'], model: 'tiny-embed' }, 422],
      [{ query: 'q', texts: ['a'], model: 'nope' }, 404],
      [{ query: 'q', texts: Array.from({ length: SERVER_DEFAULTS.maxClientBatchSize + 1 }, () => 'a') }, 422],
    ];
    for (const [body, status] of cases) {
      const r = await post('/rerank', body);
      expect(r.status, JSON.stringify(body).slice(0, 80)).toBe(status);
      expect(typeof r.body.error).toBe('string');
    }
    expect((await post('/models/tiny-rerank/rerank', { query: 'q', texts: ['a'] })).status).toBe(200);
    await expectNoSlotsInUse();
  });
});

describe('TEI /tokenize and /decode', () => {
  it('tokenize gives the tokenizer\'s ids, offsets that point at the right substrings, and decode round-trips', async () => {
    const rand = makeRandom('tokenize');
    const texts = messyTexts(rand, 20);
    const r = await post('/tokenize', { inputs: texts });
    expect(r.status).toBe(200);
    const lists = r.body as { id: number; text: string; special: boolean; start: number | null; stop: number | null }[][];
    expect(lists).toHaveLength(texts.length);
    for (let i = 0; i < texts.length; i++) {
      const text = texts[i]!;
      const chars = Array.from(text);
      const tokens = lists[i]!;
      expect(tokens.map((t) => t.id)).toEqual(Array.from(tok.encode(text, { maxLength: 10_000, truncate: false }).ids));
      expect(tokens[0]).toEqual({ id: 101, text: '[CLS]', special: true, start: null, stop: null });
      expect(tokens[tokens.length - 1]).toEqual({ id: 102, text: '[SEP]', special: true, start: null, stop: null });
      let previousStop = 0;
      for (const t of tokens.slice(1, -1)) {
        expect(t.special).toBe(false);
        expect(t.start).not.toBeNull();
        const piece = chars.slice(t.start!, t.stop!).join('');
        expect(t.text).toBe(piece);
        // the substring, normalised, is the token (less its ## prefix)
        const decoded = (await post('/decode', { ids: [t.id] })).body as string;
        expect(normalise(piece)).toBe(decoded.replace(/^##/, ''));
        expect(t.start!).toBeGreaterThanOrEqual(previousStop);
        previousStop = t.stop!;
      }
      const back = await post('/decode', { ids: tokens.map((t) => t.id) });
      expect(back.body).toBe(normalise(text));
    }
    const bare = (await post('/tokenize', { inputs: texts[0], add_special_tokens: false })).body;
    expect(bare).toHaveLength(1);
    expect(bare[0]).toEqual(lists[0]!.slice(1, -1));
  }, 60_000);

  it('offsets equal the Rust tokenizers library\'s on accents, CJK, emoji, control characters, whitespace runs and long words', async () => {
    const require = createRequire(import.meta.url);
    const { Tokenizer } = require('tokenizers') as { Tokenizer: { fromFile(p: string): { encode(t: string): Promise<{ getIds(): number[]; getOffsets(): number[][]; getSpecialTokensMask(): number[] }> } } };
    const rust = Tokenizer.fromFile(rerankRef.spec.tokenizerPath);
    const rand = makeRandom('tokenize offsets');
    const texts = [
      'Héllo, WORLD! naïve [MASK] 你好 😀x unaffordableness',
      'cafe\u0301 au lait, déjà-vu',
      'a\u0000b\u200bc  d\te\nf',
      '  leading and trailing  ',
      '[UNK] 你 [mask]',
      'x'.repeat(120) + ' ok',
      "don't stop-believing... 3.14",
      ...messyTexts(rand, 10),
      ...messyTexts(rand, 10).map((t) => stressed(rand, t)),
    ];
    const lists = (await post('/tokenize', { inputs: texts })).body as { id: number; start: number | null; stop: number | null }[][];
    for (let i = 0; i < texts.length; i++) {
      const e = await rust.encode(texts[i]!);
      const offsets = e.getOffsets();
      const special = e.getSpecialTokensMask();
      expect(lists[i]!.map((t) => t.id), JSON.stringify(texts[i])).toEqual(e.getIds());
      const got = lists[i]!.map((t) => (t.start === null ? null : [t.start, t.stop]));
      const want = offsets.map((o, k) => (special[k] ? null : o));
      expect(got, JSON.stringify(texts[i])).toEqual(want);
    }
  });

  it('decode: one list gives a string, a list of lists a list; special tokens kept on request', async () => {
    const ids = Array.from(tok.encode('Where is my parcel?', { maxLength: 128, truncate: false }).ids);
    expect((await post('/decode', { ids })).body).toBe('where is my parcel?');
    expect((await post('/decode', { ids: [ids, ids.slice(1, 3)] })).body).toEqual(['where is my parcel?', 'where is']);
    expect((await post('/decode', { ids, skip_special_tokens: false })).body).toBe('[CLS] where is my parcel? [SEP]');
    expect((await post('/models/tiny-intent/decode', { ids })).body).toBe('where is my parcel?');
    expect((await post('/models/tiny-intent/tokenize', { inputs: 'hi' })).body[0].map((t: { id: number }) => t.id)).toEqual([101, 7632, 102]);
  });

  it('bad requests get 4xx', async () => {
    const cases: [string, unknown, number][] = [
      ['/tokenize', { inputs: 42 }, 422],
      ['/tokenize', { inputs: [] }, 422],
      ['/tokenize', { inputs: 'hi', model: 'nope' }, 404],
      ['/tokenize', { inputs: Array.from({ length: SERVER_DEFAULTS.maxClientBatchSize + 1 }, () => 'a') }, 422],
      ['/tokenize', { inputs: 'parcel '.repeat(10_000) }, 422], // over MAX_TOKENIZE_CHARS
      ['/decode', { ids: 'hello' }, 422],
      ['/decode', { ids: [1.5] }, 422],
      ['/decode', { ids: [-1] }, 422],
      ['/decode', { ids: [30_522] }, 422],
      ['/decode', { ids: [] }, 200],
    ];
    for (const [path, body, status] of cases) {
      const r = await post(path, body);
      expect(r.status, `${path} ${JSON.stringify(body)}`).toBe(status);
      if (status !== 200) expect(typeof r.body.error).toBe('string');
    }
    expect((await call('POST', '/tokenize', undefined, 'not json')).status).toBe(400);
    expect((await get('/tokenize')).status).toBe(405);
  });
});

describe('pre-tokenized inputs on /embed and /predict', () => {
  it('token ids give what the text gives (the unmodified graph\'s embedding of it alone); one list of ids is one input', async () => {
    const rand = makeRandom('pre-tokenized');
    const texts = randomTexts(rand, words, 4, 30);
    const ids = texts.map((t) => Array.from(tok.encode(t, { maxLength: 128, truncate: false }).ids));
    const expected = await refEmbeddings(texts);
    const single = await post('/embed', { inputs: ids[0] });
    expect(single.status).toBe(200);
    expect(single.body).toHaveLength(1);
    expect(maxAbsDiff(single.body[0], expected[0]!)).toBeLessThan(TOLERANCE);
    const batch = await post('/embed', { inputs: ids });
    ids.forEach((_, i) => expect(maxAbsDiff(batch.body[i], expected[i]!)).toBeLessThan(TOLERANCE));
    const mixed = await post('/embed', { inputs: [texts[0], ids[1], texts[2]] });
    [0, 1, 2].forEach((i) => expect(maxAbsDiff(mixed.body[i], expected[i]!)).toBeLessThan(TOLERANCE));

    const byText = await post('/predict', { inputs: texts[0] });
    const byIds = await post('/predict', { inputs: ids[0] });
    expect(byIds.status).toBe(200);
    expect(byIds.body[0].label).toBe(byText.body[0].label); // one input: one list, not a list of lists
    const want = await intentRef.classification(ids[0]!);
    expect(maxAbsDiff(scoresByClassId(byIds.body, intentRef.spec.labels), want.probabilities)).toBeLessThan(TOLERANCE);
    expect((await post('/predict', { inputs: ids.slice(0, 2) })).body).toHaveLength(2);
  });

  it('bad token ids get 4xx and leave no slot behind', async () => {
    const long = [101, ...Array.from({ length: 200 }, () => 2000), 102];
    const cases: [unknown, number][] = [
      [{ inputs: [101, 30_522, 102] }, 422],
      [{ inputs: [101, -5, 102] }, 422],
      [{ inputs: [101, 2.5, 102] }, 422],
      [{ inputs: [[101, 102], []] }, 422],
      [{ inputs: [101, 'x'] }, 422],
      [{ inputs: long }, 413],
    ];
    // docs/errors.md: a bad field is validation / SLABSERVE_INVALID_INPUT, an input over the model's length too_long / SLABSERVE_INPUT_TOO_LONG.
    const errorOf: Record<number, { type: string; code: string }> = {
      422: { type: 'validation', code: 'SLABSERVE_INVALID_INPUT' },
      413: { type: 'too_long', code: 'SLABSERVE_INPUT_TOO_LONG' },
    };
    for (const [body, status] of cases) {
      const r = await post('/embed', body);
      expect(r.status, JSON.stringify(body).slice(0, 80)).toBe(status);
      expect({ type: r.body.type, code: r.body.code }, JSON.stringify(body).slice(0, 80)).toEqual(errorOf[status]);
      expect(typeof r.body.error).toBe('string');
    }
    const cut = await post('/embed', { inputs: long, truncate: true });
    expect(cut.status).toBe(200);
    await expectNoSlotsInUse();
  });
});

describe('the rerank task', () => {
  it('tiny-rerank is generated by default, served as rerank: [sigmoid(logit), logit] per row', () => {
    expect(DEFAULT_PRESETS).toContain('tiny-rerank');
    const spec = loadModelSpec(join(modelsDir, 'tiny-rerank'), 'tiny-rerank');
    expect(spec).toMatchObject({ task: 'rerank', labels: ['LABEL_0'], outputWidth: 2 });
    const prepared = prepareModel(readFileSync(spec.onnxPath), spec);
    expect(prepared.outputs).toEqual([
      { name: 'slabserve_score', width: 1 },
      { name: 'logits', width: 1 },
    ]);
  });

  it('is inferred from a one-label ForSequenceClassification config; a reranker with more labels is refused', () => {
    const src = join(modelsDir, 'tiny-rerank');
    const dir = mkdtempSync(join(tmpdir(), 'slabserve-rerank-'));
    try {
      for (const f of ['config.json', 'tokenizer.json', 'model.onnx']) copyFileSync(join(src, f), join(dir, f));
      expect(loadModelSpec(dir, 'x').task).toBe('rerank'); // no serve.json
      const config = JSON.parse(readFileSync(join(src, 'config.json'), 'utf8')) as Record<string, unknown>;
      writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...config, id2label: { 0: 'a', 1: 'b' } }));
      expect(loadModelSpec(dir, 'x').task).toBe('classify');
      writeFileSync(join(dir, 'serve.json'), JSON.stringify({ task: 'rerank' }));
      expect(() => loadModelSpec(dir, 'x')).toThrow(/one logit/);
      // the intent classifier's 8 logits cannot be served as a reranker
      const intent = loadModelSpec(join(modelsDir, 'tiny-intent'), 'tiny-intent');
      expect(() => prepareModel(readFileSync(intent.onnxPath), { ...intent, task: 'rerank', labels: ['x'], outputWidth: 2 })).toThrow(/8 columns, expected 1/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
