/**
 * POST /similarity (text-embeddings-inference's route, Hugging Face's
 * sentence-similarity task) and its WebSocket op, on a real server
 * (tiny-embed and tiny-intent, CPU). Every answer is compared with cosines the
 * test computes itself from the independent reference (PlainReference: the
 * unmodified model.onnx on each text alone, pooled by the test), and with the
 * cosines of the server's own /embed rows. The official `@huggingface/inference`
 * client's sentenceSimilarity is pointed at the server (endpointUrl) unchanged.
 * Inputs are random words (seed printed).
 */
import { InferenceClient, InferenceClientProviderApiError } from '@huggingface/inference';
import { unpack } from 'msgpackr';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SlabClient, SlabHttpClient } from '../dist/src/client/index.js';
import { cosineSimilarity, similaritiesToFirst } from '../dist/src/core/similarity.js';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { SERVER_DEFAULTS, startServer, type Server } from '../dist/src/main/server.js';
import { parseMetrics } from './fixtures/http-client.js';
import { batchesOfQueued, sentTogether, servedBatching } from './fixtures/queued-together.js';
import { makeRandom, maxAbsDiff, PlainReference, randomTexts, testServerConfig, vocabularyWords, wsRequest } from './helpers.js';

// Read by startServer: the batching check holds the inference loop while the request's texts are queued (sentTogether).
process.env.SLABSERVE_TEST_HOOKS = '1';

const TOLERANCE = 1e-5;
const BUCKETS = [8, 16, 32, 64];
const MAX_LENGTH = BUCKETS[BUCKETS.length - 1]!;

let server: Server;
let ref: PlainReference;
let tok: TextTokenizer;
let words: string[];
let rand: () => number;

/** a.b / (|a| |b|) in float64, written here (the reference rows are float64 unit vectors already). */
function cosine(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let dot = 0;
  let aa = 0;
  let bb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i]! * b[i]!;
    aa += a[i]! ** 2;
    bb += b[i]! ** 2;
  }
  return dot / Math.sqrt(aa * bb);
}

/** The reference row of `text`; `truncate` cuts it to MAX_LENGTH tokens at the right, or (`'left'`) by this file's own code at the left. */
async function refEmbedding(text: string, truncate: boolean | 'left' = false): Promise<Float64Array> {
  if (truncate !== 'left') return ref.embedding(tok.encode(text, { maxLength: MAX_LENGTH, truncate }).ids);
  // Left: the last tokens stay, [CLS] and [SEP] around them.
  const ids = tok.encode(text, { maxLength: 4 * MAX_LENGTH, truncate: false }).ids;
  if (ids.length <= MAX_LENGTH) return ref.embedding(ids);
  return ref.embedding(Int32Array.from([ids[0]!, ...ids.subarray(ids.length - (MAX_LENGTH - 1), ids.length - 1), ids[ids.length - 1]!]));
}

/** What /similarity must answer, from the independent reference. */
async function refSimilarities(source: string, sentences: string[], truncate: boolean | 'left' = false): Promise<number[]> {
  const s = await refEmbedding(source, truncate);
  return Promise.all(sentences.map(async (t) => cosine(s, await refEmbedding(t, truncate))));
}

async function post(path: string, body: unknown, accept = 'application/json'): Promise<{ status: number; body: any; text: string }> {
  const res = await fetch(server.url + path, { method: 'POST', headers: { 'content-type': 'application/json', accept }, body: JSON.stringify(body) });
  const bytes = new Uint8Array(await res.arrayBuffer());
  const type = res.headers.get('content-type') ?? '';
  const text = type.includes('msgpack') ? '' : new TextDecoder().decode(bytes);
  return { status: res.status, body: type.includes('msgpack') ? unpack(bytes) : JSON.parse(text), text };
}

/** A random source and `n` sentences, one of them the source itself (its cosine must be 1). */
function draw(n: number, maxWords = 10): { source: string; sentences: string[] } {
  const [source, ...rest] = randomTexts(rand, words, n, maxWords);
  const sentences = [...rest];
  sentences.splice(Math.floor(rand() * n), 0, source!);
  return { source: source!, sentences };
}

function expectScores(got: unknown, want: number[], what: string): void {
  expect(Array.isArray(got), what).toBe(true);
  const scores = got as number[];
  expect(scores, what).toHaveLength(want.length);
  for (const s of scores) expect(typeof s, what).toBe('number');
  expect(maxAbsDiff(scores, want), `${what}: ${JSON.stringify(scores)} against ${JSON.stringify(want)}`).toBeLessThan(TOLERANCE);
}


beforeAll(async () => {
  server = await startServer(testServerConfig({ models: ['tiny-embed', 'tiny-intent'], batching: { buckets: BUCKETS } }));
  ref = await PlainReference.open('tiny-embed');
  tok = await loadTokenizer(ref.spec.tokenizerPath);
  words = vocabularyWords(ref.spec);
  rand = makeRandom('similarity');
  await server.ready;
}, 120_000);

afterAll(async () => {
  await ref?.close();
  await server?.close();
});

describe('cosine (src/core/similarity.ts)', () => {
  it('against the definition, on random vectors; a zero vector gives 0; lengths must agree', () => {
    for (let n = 1; n < 40; n++) {
      const a = Float32Array.from({ length: n }, () => rand() * 2 - 1);
      const b = Float32Array.from({ length: n }, () => rand() * 2 - 1);
      expect(cosineSimilarity(a, b)).toBeCloseTo(cosine(a, b), 12);
      expect(cosineSimilarity(a, a)).toBeCloseTo(1, 12);
      expect(cosineSimilarity(a, a.map((x) => -3 * x))).toBeCloseTo(-1, 12);
    }
    expect(cosineSimilarity(Float32Array.from([3, 4]), Float32Array.from([4, 3]))).toBeCloseTo(24 / 25, 12);
    expect(cosineSimilarity(new Float32Array(3), Float32Array.from([1, 2, 3]))).toBe(0);
    expect(() => cosineSimilarity(new Float32Array(2), new Float32Array(3))).toThrow(RangeError);
    const rows = [Float32Array.from([1, 0]), Float32Array.from([0, 1]), Float32Array.from([1, 1]), Float32Array.from([-2, 0])];
    expect(Array.from(similaritiesToFirst(rows))).toEqual([0, Math.fround(Math.SQRT1_2), -1]);
  });
});

describe('POST /similarity', () => {
  it('each sentence\'s cosine to the source: the independent reference, and the cosines of /embed\'s rows', async () => {
    const { source, sentences } = draw(9);
    const r = await post('/similarity', { inputs: { source_sentence: source, sentences } });
    expect(r.status, r.text).toBe(200);
    expectScores(r.body, await refSimilarities(source, sentences), '/similarity');
    expect(r.body[sentences.indexOf(source)]).toBeCloseTo(1, 5);
    const rows = (await post('/embed', { inputs: [source, ...sentences] })).body as number[][];
    expectScores(r.body, rows.slice(1).map((row) => cosine(rows[0]!, row)), '/similarity against /embed');
    // scores are float32 values written as their shortest decimals (at most 9 digits), not as the doubles they widen to
    for (const number of r.text.slice(1, -1).split(',')) {
      const digits = number.replace(/e.*$/, '').replace(/[-.]/g, '').replace(/^0+/, '');
      expect(digits.length, number).toBeLessThanOrEqual(9);
    }
  });

  it('runs as one request of the embedding model: one slot per text, batched together', async () => {
    const { source, sentences } = draw(8, 3); // short texts: one bucket
    const before = parseMetrics(await (await fetch(server.url + '/metrics')).text());
    // Its texts all queued before the loop takes them in: how many batches they make is no matter of timing.
    const r = await sentTogether(server.testHooks, { 'tiny-embed': sentences.length + 1 }, () => post('/similarity', { inputs: { source_sentence: source, sentences } }));
    expect(r.status).toBe(200);
    const after = parseMetrics(await (await fetch(server.url + '/metrics')).text());
    const d = (name: string, labels: Record<string, string>) => after.sum(name, labels) - before.sum(name, labels);
    expect(d('slabserve_batch_size_sum', { model: 'tiny-embed' })).toBe(sentences.length + 1);
    const lengths = [source, ...sentences].map((t) => tok.encode(t, { maxLength: MAX_LENGTH, truncate: false }).ids.length);
    expect(d('slabserve_batch_size_count', { model: 'tiny-embed' })).toBe(batchesOfQueued(lengths, await servedBatching(server.url, 'tiny-embed')));
    expect(d('slabserve_batch_size_count', { model: 'tiny-embed' })).toBeLessThan(sentences.length + 1);
  });

  it('msgpack answers, the model in the path, the root route', async () => {
    const { source, sentences } = draw(5);
    const want = await refSimilarities(source, sentences);
    const body = { inputs: { source_sentence: source, sentences } };
    expectScores((await post('/similarity', body, 'application/msgpack')).body, want, 'msgpack');
    expectScores((await post('/models/tiny-embed/similarity', body)).body, want, '/models/tiny-embed/similarity');
    expectScores((await post('/', { ...body, model: 'tiny-embed' })).body, want, 'POST / (tiny-embed named)');
    expectScores((await post('/', body)).body, want, 'POST / (the first model)');
  });

  it('parameters: truncate (and its direction) and prompt_name reach the embedding', async () => {
    const long = randomTexts(rand, words, 1, 1)[0] + ' ' + Array.from({ length: MAX_LENGTH + 20 }, () => words[Math.floor(rand() * words.length)]).join(' ');
    const { sentences } = draw(3);
    const tooLong = await post('/similarity', { inputs: { source_sentence: long, sentences } });
    expect({ status: tooLong.status, code: tooLong.body.code }).toEqual({ status: 413, code: 'SLABSERVE_INPUT_TOO_LONG' });
    const cut = await post('/similarity', { inputs: { source_sentence: long, sentences }, parameters: { truncate: true, truncation_direction: 'right' } });
    expect(cut.status, cut.text).toBe(200);
    expectScores(cut.body, await refSimilarities(long, sentences, true), 'truncated');
    const left = await post('/similarity', { inputs: { source_sentence: long, sentences }, parameters: { truncate: true, truncation_direction: 'Left' } });
    expect(left.status, left.text).toBe(200);
    expectScores(left.body, await refSimilarities(long, sentences, 'left'), 'truncated on the left');
    expect(maxAbsDiff(left.body, cut.body)).toBeGreaterThan(1e-3); // the other end of the text was kept
    const prompt = await post('/similarity', { inputs: { source_sentence: 'a', sentences: ['b'] }, parameters: { prompt_name: 'query' } });
    expect({ status: prompt.status, code: prompt.body.code }).toEqual({ status: 422, code: 'SLABSERVE_INVALID_INPUT' });
    expect(prompt.body.error).toContain('query');
    const nulls = await post('/similarity', { inputs: { source_sentence: 'a', sentences: ['b'] }, parameters: null });
    expect(nulls.status).toBe(200);
  });

  it('bad bodies: 422 naming the field; a classifier is not an embedding model; the batch limit counts the source', async () => {
    const cases: [unknown, string][] = [
      [{ inputs: { source_sentence: 'a', sentences: [] } }, 'inputs.sentences'],
      [{ inputs: { source_sentence: 'a', sentences: 'b' } }, 'inputs.sentences'],
      [{ inputs: { sentences: ['b'] } }, 'inputs.source_sentence'],
      [{ inputs: 'a' }, 'inputs'],
      [{ inputs: { source_sentence: 'a', sentences: ['b'] }, parameters: { truncate: 'yes' } }, 'parameters.truncate'],
    ];
    for (const [body, field] of cases) {
      const r = await post('/similarity', body);
      expect({ status: r.status, type: r.body.type, code: r.body.code }, JSON.stringify(body)).toEqual({ status: 422, type: 'validation', code: 'SLABSERVE_INVALID_INPUT' });
      expect(r.body.error).toContain(field);
    }
    const intent = await post('/similarity', { inputs: { source_sentence: 'a', sentences: ['b'] }, model: 'tiny-intent' });
    expect(intent.status).toBe(422);
    expect(intent.body.error).toContain('not embed');
    const limit = SERVER_LIMIT;
    const full = await post('/similarity', { inputs: { source_sentence: 'a', sentences: Array.from({ length: limit - 1 }, (_, i) => `s ${i}`) } });
    expect(full.status).toBe(200);
    const over = await post('/similarity', { inputs: { source_sentence: 'a', sentences: Array.from({ length: limit }, (_, i) => `s ${i}`) } });
    expect(over.status).toBe(422);
    expect(over.body.error).toContain(`${limit + 1} inputs`);
  });
});

/** --max-client-batch-size of the test server (the default). */
const SERVER_LIMIT = SERVER_DEFAULTS.maxClientBatchSize;

describe("the official client: @huggingface/inference's sentenceSimilarity, unchanged", () => {
  it('pointed at /similarity, and at the server root, it answers the reference cosines', async () => {
    const { source, sentences } = draw(6);
    const want = await refSimilarities(source, sentences);
    const atRoute = new InferenceClient(undefined, { endpointUrl: `${server.url}/similarity` });
    expectScores(await atRoute.sentenceSimilarity({ inputs: { source_sentence: source, sentences } }), want, 'InferenceClient at /similarity');
    const atRoot = new InferenceClient().endpoint(server.url);
    expectScores(await atRoot.sentenceSimilarity({ inputs: { source_sentence: source, sentences } }), want, 'InferenceClient at the root');
  });

  it('our error reaches it as its provider error, with our message', async () => {
    const client = new InferenceClient(undefined, { endpointUrl: `${server.url}/similarity` });
    const err = await client.sentenceSimilarity({ inputs: { source_sentence: 'a', sentences: [] } }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(InferenceClientProviderApiError);
    expect((err as Error).message).toContain('inputs.sentences');
  });
});

describe('the WebSocket op and slabserve\'s clients', () => {
  it('{op: "similarity"} answers the same numbers', async () => {
    const { source, sentences } = draw(7);
    const frame = await wsRequest(server.port, { id: 'sim', op: 'similarity', inputs: { source_sentence: source, sentences } });
    expect(frame.id).toBe('sim');
    expectScores(frame.result, await refSimilarities(source, sentences), 'ws');
    const bad = await wsRequest(server.port, { id: 'bad', op: 'similarity', inputs: { source_sentence: source } });
    expect(bad.error).toMatchObject({ type: 'validation', code: 'SLABSERVE_INVALID_INPUT' });
  });

  it('similarity() over WebSocket, HTTP msgpack and HTTP JSON', async () => {
    const { source, sentences } = draw(5);
    const want = await refSimilarities(source, sentences);
    const ws = await SlabClient.connect(server.url);
    try {
      expectScores(await ws.similarity(source, sentences), want, 'SlabClient');
      expectScores(await new SlabHttpClient(server.url).similarity(source, sentences, { model: 'tiny-embed' }), want, 'SlabHttpClient msgpack');
      expectScores(await new SlabHttpClient(server.url, { format: 'json' }).similarity(source, sentences, { truncate: true }), want, 'SlabHttpClient json');
      const err = await ws.similarity(source, sentences, { promptName: 'query' }).then(
        () => null,
        (e: { code?: string }) => e,
      );
      expect(err?.code).toBe('SLABSERVE_INVALID_INPUT');
    } finally {
      await ws.close();
    }
  });
});
