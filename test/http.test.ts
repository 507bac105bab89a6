/**
 * The HTTP server end to end: startServer() with real gateway threads
 * (uWebSockets.js), the real inference thread and onnxruntime on CPU, the
 * generated tiny models. Clients are global fetch (undici) and raw node:net
 * sockets where fetch cannot express the case. Every result is compared with
 * the unbatched, unpadded reference (test/helpers.ts) on fresh random inputs.
 *
 * Servers: one per describe block whose options differ. Each block uses its
 * own connection pools (test/fixtures/http-client.ts) and closes them before
 * server.close(). Start-up and shut-down cases that, when broken, abort the
 * whole process run in child processes (the last describe block).
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { pack } from 'msgpackr';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { portOutsideEphemeral } from './cli-process.js';
import { SERVER_DEFAULTS, startServer, TEST_HOLD_GATEWAY_ENV, TEST_HOLD_START_ENV, TEST_HOOKS_ENV, type Server } from '../dist/src/main/server.js';
import { VERSION } from '../dist/src/version.js';
import { TEI_ERROR_TYPE } from '../dist/src/gateway/http/request-context.js';
import { chunk, HttpClient, MSGPACK, parseMetrics, RawConnection, requestHead, type Metrics, type Reply } from './fixtures/http-client.js';
import { eventually, makeRandom, maxAbsDiff, randomTexts, Reference, scoresByClassId, sleep, testServerConfig, vocabularyWords } from './helpers.js';

const TOLERANCE = 1e-5;
/** A client that stops sending a body it declared is closed by uWS's timeout: about 10 s (20.30) or 30 s (20.57). A bound on a hang. */
const UWS_BODY_TIMEOUT_MS = 45_000;
/** Rows of different texts differ by far more than this: what makes the comparison able to catch a wrong row. */
const DISTINCT = 1e-3;
const DIM = 128;
const MAX_LENGTH = 512;

let embedRef: Reference;
let intentRef: Reference;
let embedTok: TextTokenizer;
let intentTok: TextTokenizer;
let words: string[];
let labels: string[];

beforeAll(async () => {
  embedRef = await Reference.open('tiny-embed');
  intentRef = await Reference.open('tiny-intent');
  embedTok = await loadTokenizer(embedRef.spec.tokenizerPath);
  intentTok = await loadTokenizer(intentRef.spec.tokenizerPath);
  words = vocabularyWords(embedRef.spec);
  labels = intentRef.spec.labels;
});

afterAll(async () => {
  await embedRef?.close();
  await intentRef?.close();
});

const config = testServerConfig;

// ------------------------------------------------------------------ reference results


/** The embedding the server must return for `text` (normalised, or scaled back by the norm). */
async function refEmbedding(text: string, opts: { normalize?: boolean; truncate?: boolean } = {}): Promise<Float32Array> {
  const row = await embedRef.rowOfText(embedTok, text, opts.truncate ?? false);
  const unit = row.slice(0, DIM);
  if (opts.normalize === false) for (let i = 0; i < DIM; i++) unit[i]! *= row[DIM]!;
  return unit;
}

/** Probabilities and logits of `text`, by class id. */
async function refClasses(text: string, truncate = false): Promise<{ probabilities: Float32Array; logits: Float32Array }> {
  const row = await intentRef.rowOfText(intentTok, text, truncate);
  return { probabilities: row.slice(0, labels.length), logits: row.slice(labels.length, 2 * labels.length) };
}

type Scored = { label: string; score: number };

const byClassId = (got: Scored[]) => scoresByClassId(got, labels);

function expectTimingHeaders(r: Reply): void {
  for (const h of ['x-queue-time', 'x-inference-time', 'x-tokenization-time', 'x-total-time']) {
    const v = r.headers.get(h);
    expect(v, h).not.toBeNull();
    expect(Number.isFinite(Number(v)), `${h}: ${v}`).toBe(true);
    expect(Number(v), h).toBeGreaterThanOrEqual(0);
  }
}

function expectError(r: Reply, status: number, type: string, code?: string): void {
  expect({ status: r.status, type: r.body?.type, code: r.body?.code }, r.text).toEqual({
    status,
    type,
    code: code ?? expect.any(String),
  });
  expect(typeof r.body.error).toBe('string');
  expect(r.body.error.length).toBeGreaterThan(0);
  expect(Object.keys(r.body).sort()).toEqual(['code', 'error', 'error_type', 'type']);
  expect(r.body.error_type, 'TEI\'s kind of the family').toBe(TEI_ERROR_TYPE[type as keyof typeof TEI_ERROR_TYPE]);
}

// ------------------------------------------------------------------ metrics and waiting

async function scrape(c: HttpClient, close = false): Promise<Metrics> {
  const r = await c.get('/metrics', { close });
  expect(r.status).toBe(200);
  return parseMetrics(r.text);
}


const slotsInUse = (m: Metrics) => ({
  'tiny-embed': m.sum('slabserve_slots_in_use', { model: 'tiny-embed' }),
  'tiny-intent': m.sum('slabserve_slots_in_use', { model: 'tiny-intent' }),
});

async function expectSlotsFree(c: HttpClient, close = false): Promise<void> {
  const m = await eventually('every slot free', () => scrape(c, close), (m) => m.has('slabserve_slots_in_use') && Object.values(slotsInUse(m)).every((n) => n === 0));
  expect(m.has('slabserve_slots_in_use', { model: 'tiny-embed' })).toBe(true);
  expect(m.has('slabserve_slots_in_use', { model: 'tiny-intent' })).toBe(true);
}

/** A text of `n` random vocabulary words. */
function wordsText(rand: () => number, n: number): string {
  return Array.from({ length: n }, () => words[Math.floor(rand() * words.length)]).join(' ');
}

/** A free port outside the ephemeral range, which another test's port-0 bind cannot take meanwhile. */
const freePort = portOutsideEphemeral;

// =================================================================== routes

describe('routes, JSON and msgpack (one gateway thread)', () => {
  let server: Server;
  let client: HttpClient;

  beforeAll(async () => {
    // tiny-intent first: /embed must still pick tiny-embed, the first model *of its task*.
    // maxBatchTokens below the default: a shorter warm-up, and a setting /info must report.
    server = await startServer(config({ models: ['tiny-intent', 'tiny-embed'], batching: { maxBatchTokens: 4096 } }));
    await server.ready;
    client = await HttpClient.open(server.url);
  });

  afterAll(async () => {
    await client?.close();
    await server?.close();
  });

  it('POST /embed: one input and many, JSON and msgpack, equal the reference; content type per Accept; timing headers', async () => {
    const rand = makeRandom('http embed');
    const texts = randomTexts(rand, words, 6, 40);
    const refs = await Promise.all(texts.map((t) => refEmbedding(t)));
    // The comparison can fail: each text's reference is far from every other text's row.
    for (let i = 0; i < texts.length; i++) {
      for (let j = 0; j < texts.length; j++) if (texts[i] !== texts[j]) expect(maxAbsDiff(refs[i]!, refs[j]!)).toBeGreaterThan(DISTINCT);
    }

    for (const fmt of ['json', 'msgpack'] as const) {
      const one = await client.post('/embed', { inputs: texts[0] }, { as: fmt, accept: fmt });
      expect(one.status, one.text).toBe(200);
      expect(one.contentType).toBe(fmt === 'json' ? 'application/json' : MSGPACK);
      expectTimingHeaders(one);
      expect(one.body).toHaveLength(1);
      expect(one.body[0]).toHaveLength(DIM);
      expect(maxAbsDiff(one.body[0], refs[0]!)).toBeLessThan(TOLERANCE);
      expect(Math.hypot(...(one.body[0] as number[]))).toBeCloseTo(1, 5);

      const many = await client.post('/embed', { inputs: texts }, { as: fmt, accept: fmt });
      expect(many.status, many.text).toBe(200);
      expectTimingHeaders(many);
      expect(many.body).toHaveLength(texts.length);
      texts.forEach((_, i) => expect(maxAbsDiff(many.body[i], refs[i]!), `row ${i} (${fmt})`).toBeLessThan(TOLERANCE));
    }

    // Request and response formats are independent: msgpack in, JSON out (no Accept), and the reverse.
    const msgIn = await client.post('/embed', { inputs: [texts[1]] }, { as: 'msgpack' });
    expect(msgIn.status).toBe(200);
    expect(msgIn.contentType).toBe('application/json');
    expect(maxAbsDiff(msgIn.body[0], refs[1]!)).toBeLessThan(TOLERANCE);
    const msgOut = await client.post('/embed', { inputs: texts[2] }, { as: 'json', accept: 'msgpack' });
    expect(msgOut.contentType).toBe(MSGPACK);
    expect(maxAbsDiff(msgOut.body[0], refs[2]!)).toBeLessThan(TOLERANCE);
    const altType = await client.post('/embed', undefined, { raw: pack({ inputs: texts[3] }), headers: { 'content-type': 'application/x-msgpack' } });
    expect(altType.status, altType.text).toBe(200);
    expect(maxAbsDiff(altType.body[0], refs[3]!)).toBeLessThan(TOLERANCE);
  });

  it('POST /embed: normalize false returns the unnormalised vector, truncate cuts a long input', async () => {
    const rand = makeRandom('http normalize');
    const texts = randomTexts(rand, words, 3, 30);
    for (const fmt of ['json', 'msgpack'] as const) {
      const raw = await client.post('/embed', { inputs: texts, normalize: false }, { as: fmt, accept: fmt });
      expect(raw.status, raw.text).toBe(200);
      for (let i = 0; i < texts.length; i++) {
        const ref = await refEmbedding(texts[i]!, { normalize: false });
        expect(maxAbsDiff(raw.body[i], ref)).toBeLessThan(TOLERANCE);
        expect(Math.abs(Math.hypot(...(raw.body[i] as number[])) - 1)).toBeGreaterThan(DISTINCT); // really not unit length
      }
    }
    const unit = await client.post('/embed', { inputs: texts[0], normalize: true });
    expect(maxAbsDiff(unit.body[0], await refEmbedding(texts[0]!))).toBeLessThan(TOLERANCE);

    const long = wordsText(rand, 700); // well over 512 tokens
    expect(() => embedTok.encode(long, { maxLength: MAX_LENGTH, truncate: false })).toThrow();
    const refused = await client.post('/embed', { inputs: long });
    expectError(refused, 413, 'too_long', 'SLABSERVE_INPUT_TOO_LONG');
    const cut = await client.post('/embed', { inputs: [texts[1], long], truncate: true });
    expect(cut.status, cut.text).toBe(200);
    expect(maxAbsDiff(cut.body[0], await refEmbedding(texts[1]!))).toBeLessThan(TOLERANCE);
    expect(maxAbsDiff(cut.body[1], await refEmbedding(long, { truncate: true }))).toBeLessThan(TOLERANCE);
  });

  it('POST /predict: [{label, score}] sorted, summing to 1, equal to the reference; a list gives one per input; raw_scores gives logits', async () => {
    const rand = makeRandom('http predict');
    const texts = randomTexts(rand, words, 5, 40);
    const refs = await Promise.all(texts.map((t) => refClasses(t)));
    // The comparison can fail: different texts get clearly different probabilities.
    for (let i = 0; i < texts.length; i++) {
      for (let j = i + 1; j < texts.length; j++) if (texts[i] !== texts[j]) expect(maxAbsDiff(refs[i]!.probabilities, refs[j]!.probabilities)).toBeGreaterThan(DISTINCT);
    }

    for (const fmt of ['json', 'msgpack'] as const) {
      const one = await client.post('/predict', { inputs: texts[0] }, { as: fmt, accept: fmt });
      expect(one.status, one.text).toBe(200);
      expect(one.contentType).toBe(fmt === 'json' ? 'application/json' : MSGPACK);
      expectTimingHeaders(one);
      expect(Array.isArray(one.body[0])).toBe(false); // one string: one list of scores, not a list of lists
      const probs = byClassId(one.body);
      expect(probs.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 5);
      expect(maxAbsDiff(probs, refs[0]!.probabilities)).toBeLessThan(TOLERANCE);

      const many = await client.post('/predict', { inputs: texts }, { as: fmt, accept: fmt });
      expect(many.status, many.text).toBe(200);
      expect(many.body).toHaveLength(texts.length);
      texts.forEach((_, i) => {
        const p = byClassId(many.body[i]);
        expect(p.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 5);
        expect(maxAbsDiff(p, refs[i]!.probabilities), `row ${i}`).toBeLessThan(TOLERANCE);
      });

      const raw = await client.post('/predict', { inputs: texts, raw_scores: true }, { as: fmt, accept: fmt });
      expect(raw.status, raw.text).toBe(200);
      texts.forEach((_, i) => {
        const logits = byClassId(raw.body[i]);
        expect(maxAbsDiff(logits, refs[i]!.logits), `logits ${i}`).toBeLessThan(TOLERANCE);
        expect(maxAbsDiff(logits, refs[i]!.probabilities)).toBeGreaterThan(DISTINCT); // logits are not probabilities
      });
    }
    // A list of one string is still a list of lists.
    const listOfOne = await client.post('/predict', { inputs: [texts[0]] });
    expect(listOfOne.body).toHaveLength(1);
    expect(maxAbsDiff(byClassId(listOfOne.body[0]), refs[0]!.probabilities)).toBeLessThan(TOLERANCE);
  });

  it("POST / answers as the named model's task does (TEI's root route): /predict for a classifier, /embed for an embedding model", async () => {
    const rand = makeRandom('http root route');
    const texts = randomTexts(rand, words, 3, 30);
    // No model named: the first served (tiny-intent here), a classifier.
    const first = await client.post('/', { inputs: texts });
    expect(first.status, first.text).toBe(200);
    for (let i = 0; i < texts.length; i++) expect(maxAbsDiff(byClassId(first.body[i]), (await refClasses(texts[i]!)).probabilities)).toBeLessThan(TOLERANCE);
    const embed = await client.post('/', { inputs: texts, model: 'tiny-embed', normalize: false });
    expect(embed.status, embed.text).toBe(200);
    expectTimingHeaders(embed);
    for (let i = 0; i < texts.length; i++) expect(maxAbsDiff(embed.body[i], await refEmbedding(texts[i]!, { normalize: false }))).toBeLessThan(TOLERANCE);
    expectError(await client.post('/', { inputs: 'x', model: 'nope' }), 404, 'not_found', 'SLABSERVE_MODEL_NOT_FOUND');
    expectError(await client.post('/', { inputs: 'x', model: 'tiny-embed', normalize: 'yes' }), 422, 'validation', 'SLABSERVE_INVALID_INPUT');
  });

  it('POST /models/{name}/embed and /models/{name}/predict: the named model, same results; body model must agree', async () => {
    const rand = makeRandom('http path form');
    const texts = randomTexts(rand, words, 3, 30);
    for (const fmt of ['json', 'msgpack'] as const) {
      const e = await client.post('/models/tiny-embed/embed', { inputs: texts }, { as: fmt, accept: fmt });
      expect(e.status, e.text).toBe(200);
      expectTimingHeaders(e);
      for (let i = 0; i < texts.length; i++) expect(maxAbsDiff(e.body[i], await refEmbedding(texts[i]!))).toBeLessThan(TOLERANCE);
      const p = await client.post('/models/tiny-intent/predict', { inputs: texts[0] }, { as: fmt, accept: fmt });
      expect(p.status, p.text).toBe(200);
      expect(maxAbsDiff(byClassId(p.body), (await refClasses(texts[0]!)).probabilities)).toBeLessThan(TOLERANCE);
    }
    const agreeing = await client.post('/models/tiny-embed/embed', { inputs: texts[1], model: 'tiny-embed' });
    expect(agreeing.status).toBe(200);
    const bodyModel = await client.post('/embed', { inputs: texts[1], model: 'tiny-embed' });
    expect(maxAbsDiff(bodyModel.body[0], agreeing.body[0])).toBeLessThan(TOLERANCE);
    expectError(await client.post('/models/tiny-embed/embed', { inputs: 'x', model: 'tiny-intent' }), 422, 'validation', 'SLABSERVE_INVALID_INPUT');
  });

  it('GET /info: models, tasks, device, batching, limits, version (JSON and msgpack)', async () => {
    for (const fmt of ['json', 'msgpack'] as const) {
      const r = await client.get('/info', { accept: fmt });
      expect(r.status).toBe(200);
      expect(r.contentType).toBe(fmt === 'json' ? 'application/json' : MSGPACK);
      // The documented default: four buckets to each doubling of the length, up to maxLength.
      const buckets = [8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512];
      const batching = { maxBatchSize: 32, maxBatchDelayMs: 5, maxBatchTokens: 4096, buckets };
      // toMatchObject: these fields exactly, more may be added.
      expect(r.body).toMatchObject({
        version: VERSION,
        device: { label: 'cpu', name: expect.any(String), provider: 'CPUExecutionProvider' },
        models: [
          { name: 'tiny-intent', task: 'classify', maxLength: 512, dimension: 8, labels, batching },
          {
            name: 'tiny-embed',
            task: 'embed',
            maxLength: 512,
            dimension: 128,
            labels: [],
            pooling: 'mean',
            normalize: true,
            sources: { task: 'serve.json', pooling: 'serve.json', normalize: 'serve.json', maxLength: 'config.json' },
            batching,
          },
        ],
        limits: {
          maxClientBatchSize: SERVER_DEFAULTS.maxClientBatchSize,
          maxBodyBytes: SERVER_DEFAULTS.maxBodyBytes,
          requestTimeoutMs: SERVER_DEFAULTS.requestTimeoutMs,
          slotsPerModel: SERVER_DEFAULTS.slotsPerModel,
        },
        gatewayThreads: 1,
        cache: null, // --cache-mb 0 (testServerConfig)
      });
    }
  });

  it('a second server on the same fixed port is refused before it starts (uWS would share it silently), and the first serves on', async () => {
    const port = server.port;
    await expect(startServer(config({ port, models: ['tiny-embed'] }))).rejects.toMatchObject({ code: 'SLABSERVE_PORT_IN_USE', message: `127.0.0.1:${port} is in use (another slabserve, or another program): stop it, or choose another --port` });
    expect((await client.get('/readyz')).status).toBe(200);
  });

  it('GET /health, /livez, /readyz answer 200 when ready', async () => {
    for (const [path, status] of [
      ['/health', 'ready'],
      ['/readyz', 'ready'],
      ['/livez', 'alive'],
    ] as const) {
      const r = await client.get(path);
      expect(r.status, path).toBe(200);
      expect(r.contentType).toBe('application/json');
      expect(r.body).toEqual({ status });
      const m = await client.get(path, { accept: 'msgpack' });
      expect(m.contentType).toBe(MSGPACK);
      expect(m.body).toEqual({ status });
    }
  });

  it('GET /metrics: Prometheus text with the slabserve families, every sample typed', async () => {
    const r = await client.get('/metrics');
    expect(r.status).toBe(200);
    expect(r.contentType).toBe('text/plain; version=0.0.4; charset=utf-8');
    const m = parseMetrics(r.text);
    for (const [family, type] of [
      ['slabserve_slots_in_use', 'gauge'],
      ['slabserve_slots', 'gauge'],
      ['slabserve_queue_depth', 'gauge'],
      ['slabserve_ready', 'gauge'],
      ['slabserve_requests_cancelled_total', 'gauge'],
      ['slabserve_request_duration_seconds', 'histogram'],
      ['slabserve_batch_size', 'histogram'],
      ['slabserve_batch_fill_ratio', 'histogram'],
      ['slabserve_batch_padding_efficiency', 'histogram'],
      ['process_cpu_seconds_total', 'counter'],
    ]) {
      expect(m.types.get(family!), family).toBe(type);
    }
    expect(m.sum('slabserve_slots', { model: 'tiny-embed' })).toBe(SERVER_DEFAULTS.slotsPerModel);
    expect(m.sum('slabserve_slots', { model: 'tiny-intent' })).toBe(SERVER_DEFAULTS.slotsPerModel);
    expect(m.sum('slabserve_ready')).toBe(1);
    // Every sample belongs to a family with a # TYPE line (histograms through _bucket/_sum/_count).
    for (const s of m.samples) {
      const family = s.name.replace(/_(bucket|sum|count)$/, '');
      expect(m.types.has(s.name) || m.types.has(family), s.name).toBe(true);
    }
  });

  it('metrics move as traffic flows: batch size, fill ratio, padding efficiency, request duration, tokens', async () => {
    const rand = makeRandom('http metrics');
    const embedTexts = randomTexts(rand, words, 7, 50);
    const predictTexts = randomTexts(rand, words, 3, 50);
    const realTokens = embedTexts.reduce((n, t) => n + embedTok.encode(t, { maxLength: MAX_LENGTH, truncate: false }).ids.length, 0);
    const before = await scrape(client);
    const e = { model: 'tiny-embed' };
    const i = { model: 'tiny-intent' };

    const replies = [
      await client.post('/embed', { inputs: embedTexts[0] }),
      await client.post('/embed', { inputs: embedTexts.slice(1, 6) }, { as: 'msgpack' }),
      await client.post('/embed', { inputs: embedTexts[6] }),
      await client.post('/predict', { inputs: predictTexts[0] }),
      await client.post('/predict', { inputs: predictTexts.slice(1) }),
    ];
    expect(replies.map((r) => r.status)).toEqual([200, 200, 200, 200, 200]);

    // The inference thread's histograms reach /metrics through a scrape RPC: wait until its rows show.
    const after = await eventually(
      'batch metrics to include the new rows',
      () => scrape(client),
      (m) => m.sum('slabserve_batch_size_sum', e) - before.sum('slabserve_batch_size_sum', e) >= 7 && m.sum('slabserve_batch_size_sum', i) - before.sum('slabserve_batch_size_sum', i) >= 3,
    );
    const d = (name: string, match: Record<string, string>) => after.sum(name, match) - before.sum(name, match);

    // Rows: exactly one per input. Batches: at least one, at most one per input.
    expect(d('slabserve_batch_size_sum', e)).toBe(7);
    expect(d('slabserve_batch_size_sum', i)).toBe(3);
    const batches = d('slabserve_batch_size_count', e);
    expect(batches).toBeGreaterThanOrEqual(1);
    expect(batches).toBeLessThanOrEqual(7);
    expect(d('slabserve_batch_size_count', i)).toBeGreaterThanOrEqual(1);
    // One fill ratio and one padding efficiency per batch, each in (0, 1].
    expect(d('slabserve_batch_fill_ratio_count', e)).toBe(batches);
    expect(d('slabserve_batch_padding_efficiency_count', e)).toBe(batches);
    expect(d('slabserve_batch_fill_ratio_sum', e)).toBeGreaterThan(0);
    expect(d('slabserve_batch_fill_ratio_sum', e)).toBeLessThanOrEqual(batches);
    expect(d('slabserve_batch_padding_efficiency_sum', e)).toBeGreaterThan(0);
    expect(d('slabserve_batch_padding_efficiency_sum', e)).toBeLessThanOrEqual(batches + 1e-9);
    // Tokens: the real ones exactly (counted by the same tokenizer), padded ones at least as many.
    expect(d('slabserve_tokens_total', { model: 'tiny-embed', kind: 'real' })).toBe(realTokens);
    expect(d('slabserve_tokens_total', { model: 'tiny-embed', kind: 'padded' })).toBeGreaterThanOrEqual(realTokens);
    // Requests: one duration sample per request, inputs counted one per text.
    expect(d('slabserve_request_duration_seconds_count', { model: 'tiny-embed', route: '/embed', status: '200' })).toBe(3);
    expect(d('slabserve_request_duration_seconds_count', { model: 'tiny-intent', route: '/predict', status: '200' })).toBe(2);
    expect(d('slabserve_request_duration_seconds_sum', { model: 'tiny-embed', route: '/embed', status: '200' })).toBeGreaterThan(0);
    expect(d('slabserve_request_inputs_total', { model: 'tiny-embed', route: '/embed' })).toBe(7);
    expect(d('slabserve_request_inputs_total', { model: 'tiny-intent', route: '/predict' })).toBe(3);
    expect(d('slabserve_request_queue_duration_seconds_count', e)).toBe(3);

    // A refused request is counted under its status and its failure reason.
    const failuresBefore = after.sum('slabserve_request_failures_total', { reason: 'not_found' });
    expectError(await client.post('/embed', { inputs: 'x', model: 'nope' }), 404, 'not_found');
    const later = await scrape(client);
    expect(later.sum('slabserve_request_failures_total', { reason: 'not_found' })).toBe(failuresBefore + 1);
  });

  it('200 requests from 32 concurrent keep-alive clients, mixed lengths and routes: each answered once, with its own row', async () => {
    const rand = makeRandom('http concurrency');
    type Spec = { route: '/embed' | '/predict'; inputs: string | string[]; fmt: 'json' | 'msgpack' };
    const specs: Spec[] = Array.from({ length: 200 }, () => {
      const route = rand() < 0.7 ? '/embed' : '/predict';
      const list = rand() < 0.3;
      const texts = randomTexts(rand, words, list ? 2 + Math.floor(rand() * 6) : 1, 100);
      return { route, inputs: list ? texts : texts[0]!, fmt: rand() < 0.5 ? 'json' : 'msgpack' };
    });
    const before = await scrape(client);

    const clients = await Promise.all(Array.from({ length: 32 }, () => HttpClient.open(server.url)));
    const replies: (Reply | undefined)[] = new Array(specs.length);
    let next = 0;
    try {
      await Promise.all(
        clients.map(async (c) => {
          for (let k = next++; k < specs.length; k = next++) {
            const s = specs[k]!;
            replies[k] = await c.post(s.route, { inputs: s.inputs }, { as: s.fmt, accept: s.fmt });
          }
        }),
      );
    } finally {
      await Promise.all(clients.map((c) => c.close()));
    }

    let worst = 0;
    let compared = 0;
    let nearestWrong = Infinity; // how close a wrong row ever came: the comparison's margin
    for (let k = 0; k < specs.length; k++) {
      const s = specs[k]!;
      const r = replies[k]!;
      expect(r.status, `request ${k}: ${r.text.slice(0, 200)}`).toBe(200);
      const texts = typeof s.inputs === 'string' ? [s.inputs] : s.inputs;
      if (s.route === '/embed') {
        expect(r.body).toHaveLength(texts.length);
        for (let j = 0; j < texts.length; j++) {
          worst = Math.max(worst, maxAbsDiff(r.body[j], await refEmbedding(texts[j]!)));
          const other = texts[(j + 1) % texts.length]!;
          if (other !== texts[j]) nearestWrong = Math.min(nearestWrong, maxAbsDiff(r.body[j], await refEmbedding(other)));
          compared++;
        }
      } else {
        const lists: Scored[][] = typeof s.inputs === 'string' ? [r.body] : r.body;
        expect(lists).toHaveLength(texts.length);
        for (let j = 0; j < texts.length; j++) {
          const got = byClassId(lists[j]!);
          worst = Math.max(worst, maxAbsDiff(got, (await refClasses(texts[j]!)).probabilities));
          const other = texts[(j + 1) % texts.length]!;
          if (other !== texts[j]) nearestWrong = Math.min(nearestWrong, maxAbsDiff(got, (await refClasses(other)).probabilities));
          compared++;
        }
      }
    }
    expect(worst).toBeLessThan(TOLERANCE);
    expect(compared).toBeGreaterThan(200);
    expect(nearestWrong).toBeGreaterThan(DISTINCT); // a row swapped within a request would have been caught

    // Server side: exactly 200 answered, all 200 OK.
    const after = await scrape(client);
    const answered = (m: Metrics) => m.sum('slabserve_request_duration_seconds_count', { status: '200' });
    expect(answered(after) - answered(before)).toBe(200);
    await expectSlotsFree(client);
  });

  it('a client that disconnects before its answer frees its slots; the server keeps answering', async () => {
    const rand = makeRandom('http disconnect');
    const list = (n: number, len: number) => Array.from({ length: n }, () => wordsText(rand, len));

    // 1. Clients gone at once: right after sending a long list, and half-way through a body.
    const conns: RawConnection[] = [];
    try {
      for (let k = 0; k < 4; k++) {
        const body = JSON.stringify({ inputs: list(64, 60) });
        const c = await RawConnection.open(server.port);
        conns.push(c);
        await c.write(requestHead('POST', k % 2 ? '/predict' : '/embed', { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }) + body);
        c.destroy();
      }
      const half = JSON.stringify({ inputs: list(64, 60) });
      const c = await RawConnection.open(server.port);
      conns.push(c);
      await c.write(requestHead('POST', '/embed', { 'content-type': 'application/json', 'content-length': Buffer.byteLength(half) }) + half.slice(0, half.length >> 1));
      c.destroy();
    } finally {
      conns.forEach((c) => c.destroy());
    }
    await expectSlotsFree(client);

    // 2. A client gone while its slots are queued: its 64 inputs wait on tiny-intent behind a long tiny-embed
    //    request (one inference thread runs the oldest batch first); once all 64 are seen in use, it disconnects.
    const before = await scrape(client);
    const blocker = client.post('/embed', { inputs: list(64, 600), truncate: true });
    // Queued on the device (slots in use alone may be slots held while the request is tokenized).
    await eventually('the blocker queued', () => scrape(client), (m) => m.sum('slabserve_queue_depth', { model: 'tiny-embed' }) > 0);
    const victim = await RawConnection.open(server.port);
    try {
      const body = JSON.stringify({ inputs: list(64, 20) });
      await victim.write(requestHead('POST', '/predict', { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }) + body);
      await eventually('the victim\'s 64 inputs queued', () => scrape(client), (m) => m.sum('slabserve_queue_depth', { model: 'tiny-intent' }) === 64 || victim.received > 0);
      expect(victim.received, 'the victim was answered before it could disconnect: make the blocker longer').toBe(0);
    } finally {
      victim.destroy();
    }
    const b = await blocker;
    expect(b.status, b.text).toBe(200);
    expect(b.body).toHaveLength(64);
    await expectSlotsFree(client);
    const after = await scrape(client);
    const cancelled = after.sum('slabserve_requests_cancelled_total', { model: 'tiny-intent' }) - before.sum('slabserve_requests_cancelled_total', { model: 'tiny-intent' });
    expect(cancelled).toBeGreaterThan(0);
    expect(cancelled).toBeLessThanOrEqual(64);
    // The disconnect saved work: the device did not compute all of the victim's 64 rows.
    const ran = after.sum('slabserve_batch_size_sum', { model: 'tiny-intent' }) - before.sum('slabserve_batch_size_sum', { model: 'tiny-intent' });
    expect(ran).toBeLessThan(64);

    // Still serving, correctly.
    const text = wordsText(rand, 12);
    const ok = await client.post('/predict', { inputs: text });
    expect(ok.status).toBe(200);
    expect(maxAbsDiff(byClassId(ok.body), (await refClasses(text)).probabilities)).toBeLessThan(TOLERANCE);
    await expectSlotsFree(client);
  });
});

// =================================================================== bad input and limits

describe('bad input, limits and overload (small limits)', () => {
  const MAX_INPUTS = 4;
  const MAX_BODY = 8192;
  const SLOTS = 4;
  let server: Server;
  let client: HttpClient;

  beforeAll(async () => {
    server = await startServer(config({ maxClientBatchSize: MAX_INPUTS, maxBodyBytes: MAX_BODY, slotsPerModel: SLOTS, batching: { maxBatchTokens: 2048 } }));
    await server.ready;
    client = await HttpClient.open(server.url);
  });

  afterAll(async () => {
    await client?.close();
    await server?.close();
  });

  it('every bad-input class gets its status, type and code', async () => {
    const rand = makeRandom('http bad input');
    const long = wordsText(rand, 700);
    expect(Buffer.byteLength(JSON.stringify({ inputs: long }))).toBeLessThan(MAX_BODY); // too long in tokens, not in bytes
    const json = { 'content-type': 'application/json' };
    const msgpack = { 'content-type': MSGPACK };
    type Case = [name: string, method: string, path: string, opts: { payload?: unknown; raw?: string | Uint8Array; headers?: Record<string, string>; as?: 'msgpack' }, status: number, type: string, code: string];
    const cases: Case[] = [
      ['malformed JSON', 'POST', '/embed', { raw: '{"inputs": "a"', headers: json }, 400, 'validation', 'SLABSERVE_MALFORMED_BODY'],
      ['malformed JSON on /predict', 'POST', '/predict', { raw: '{inputs: a}', headers: json }, 400, 'validation', 'SLABSERVE_MALFORMED_BODY'],
      ['malformed msgpack (bytes after the value)', 'POST', '/embed', { raw: Buffer.concat([pack({ inputs: 'hi' }), Buffer.from([0xff, 0x00])]), headers: msgpack }, 400, 'validation', 'SLABSERVE_MALFORMED_BODY'],
      ['malformed msgpack (str8 longer than the body)', 'POST', '/embed', { raw: new Uint8Array([0x81, 0xa6, ...Buffer.from('inputs'), 0xd9, 0x40, 0x61]), headers: msgpack }, 400, 'validation', 'SLABSERVE_MALFORMED_BODY'],
      ['malformed msgpack (truncated)', 'POST', '/embed', { raw: pack({ inputs: 'hello there' }).subarray(0, 6), headers: msgpack }, 400, 'validation', 'SLABSERVE_MALFORMED_BODY'],
      ['empty body', 'POST', '/embed', { raw: '', headers: json }, 400, 'validation', 'SLABSERVE_MALFORMED_BODY'],
      ['body not an object', 'POST', '/embed', { payload: ['a'] }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['inputs missing', 'POST', '/embed', { payload: { input: 'a' } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['inputs a number', 'POST', '/embed', { payload: { inputs: 5 } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['inputs a number (msgpack)', 'POST', '/predict', { payload: { inputs: 5 }, as: 'msgpack' }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['a number in the list', 'POST', '/embed', { payload: { inputs: ['a', 3] } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['normalize not a boolean', 'POST', '/embed', { payload: { inputs: 'a', normalize: 'no' } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['raw_scores not a boolean', 'POST', '/predict', { payload: { inputs: 'a', raw_scores: 1 } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['truncate not a boolean', 'POST', '/embed', { payload: { inputs: 'a', truncate: 'yes' } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['model not a string', 'POST', '/embed', { payload: { inputs: 'a', model: 1 } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['empty string', 'POST', '/embed', { payload: { inputs: '' } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['empty string in a list', 'POST', '/predict', { payload: { inputs: ['a', ''] } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['empty list', 'POST', '/embed', { payload: { inputs: [] } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['empty list (msgpack)', 'POST', '/predict', { payload: { inputs: [] }, as: 'msgpack' }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['more inputs than --max-client-batch-size', 'POST', '/embed', { payload: { inputs: Array(MAX_INPUTS + 1).fill('a') } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['more inputs than the limit, path form', 'POST', '/models/tiny-intent/predict', { payload: { inputs: Array(MAX_INPUTS + 1).fill('a') } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['input longer than the max length', 'POST', '/embed', { payload: { inputs: long } }, 413, 'too_long', 'SLABSERVE_INPUT_TOO_LONG'],
      ['a long input in a list', 'POST', '/predict', { payload: { inputs: ['a', long] } }, 413, 'too_long', 'SLABSERVE_INPUT_TOO_LONG'],
      ['truncate: false is no truncation', 'POST', '/embed', { payload: { inputs: long, truncate: false } }, 413, 'too_long', 'SLABSERVE_INPUT_TOO_LONG'],
      ['unknown model in the body', 'POST', '/embed', { payload: { inputs: 'a', model: 'nope' } }, 404, 'not_found', 'SLABSERVE_MODEL_NOT_FOUND'],
      ['unknown model in the body of /predict', 'POST', '/predict', { payload: { inputs: 'a', model: 'nope' } }, 404, 'not_found', 'SLABSERVE_MODEL_NOT_FOUND'],
      ['unknown model in the path (embed)', 'POST', '/models/nope/embed', { payload: { inputs: 'a' } }, 404, 'not_found', 'SLABSERVE_MODEL_NOT_FOUND'],
      ['unknown model in the path (predict)', 'POST', '/models/nope/predict', { payload: { inputs: 'a' } }, 404, 'not_found', 'SLABSERVE_MODEL_NOT_FOUND'],
      ['predict on an embed model (path)', 'POST', '/models/tiny-embed/predict', { payload: { inputs: 'a' } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['predict on an embed model (body)', 'POST', '/predict', { payload: { inputs: 'a', model: 'tiny-embed' } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['embed on a classify model', 'POST', '/models/tiny-intent/embed', { payload: { inputs: 'a' } }, 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['unsupported content type (text/plain)', 'POST', '/embed', { raw: '{"inputs":"a"}', headers: { 'content-type': 'text/plain' } }, 415, 'unsupported_media_type', 'SLABSERVE_UNSUPPORTED_MEDIA_TYPE'],
      ['unsupported content type (form)', 'POST', '/predict', { raw: 'inputs=a', headers: { 'content-type': 'application/x-www-form-urlencoded' } }, 415, 'unsupported_media_type', 'SLABSERVE_UNSUPPORTED_MEDIA_TYPE'],
      ['unknown route', 'GET', '/nope', {}, 404, 'not_found', 'SLABSERVE_ROUTE_NOT_FOUND'],
      ['unknown route (POST)', 'POST', '/no/such/route', { payload: { inputs: 'a' } }, 404, 'not_found', 'SLABSERVE_ROUTE_NOT_FOUND'],
      ['a model path with an unknown task', 'POST', '/models/tiny-embed/nope', { payload: { inputs: 'a' } }, 404, 'not_found', 'SLABSERVE_ROUTE_NOT_FOUND'],
    ];
    for (const [name, method, path, o, status, type, code] of cases) {
      const r = await client.request(method, path, o.payload, { ...(o.raw !== undefined ? { raw: o.raw } : {}), ...(o.headers ? { headers: o.headers } : {}), ...(o.as ? { as: o.as } : {}) });
      expect({ case: name, status: r.status, type: r.body?.type, code: r.body?.code }, r.text).toEqual({ case: name, status, type, code });
      expect(r.contentType, name).toBe('application/json');
      expectError(r, status, type, code);
    }

    // Wrong method on a known path: 405 with Allow.
    for (const [method, path, allow] of [
      ['GET', '/embed', 'POST'],
      ['PUT', '/predict', 'POST'],
      ['GET', '/models/tiny-embed/embed', 'POST'],
      ['DELETE', '/models/tiny-intent/predict', 'POST'],
      ['POST', '/info', 'GET'],
      ['POST', '/health', 'GET'],
      ['DELETE', '/livez', 'GET'],
      ['POST', '/readyz', 'GET'],
      ['PUT', '/metrics', 'GET'],
    ] as const) {
      const r = await client.request(method, path, method === 'GET' || method === 'DELETE' ? undefined : { inputs: 'a' });
      expectError(r, 405, 'method_not_allowed', 'SLABSERVE_METHOD_NOT_ALLOWED');
      expect(r.headers.get('allow'), `${method} ${path}`).toBe(allow);
    }

    // Errors follow Accept too.
    const m = await client.post('/embed', { inputs: [] }, { as: 'msgpack', accept: 'msgpack' });
    expect(m.contentType).toBe(MSGPACK);
    expectError(m, 422, 'validation', 'SLABSERVE_INVALID_INPUT');

    // The same long input with truncate: true is accepted, and equals the reference of its first 512 tokens.
    const cut = await client.post('/embed', { inputs: long, truncate: true });
    expect(cut.status, cut.text).toBe(200);
    expect(maxAbsDiff(cut.body[0], await refEmbedding(long, { truncate: true }))).toBeLessThan(TOLERANCE);
    const cutClass = await client.post('/predict', { inputs: ['a', long], truncate: true });
    expect(cutClass.status).toBe(200);
    expect(maxAbsDiff(byClassId(cutClass.body[1]), (await refClasses(long, true)).probabilities)).toBeLessThan(TOLERANCE);
    // And exactly --max-client-batch-size inputs are accepted.
    const full = await client.post('/embed', { inputs: Array(MAX_INPUTS).fill('a') });
    expect(full.status, full.text).toBe(200);
    expect(full.body).toHaveLength(MAX_INPUTS);
  });

  it('--max-body-bytes: a body of exactly the limit is read, one byte more is refused (413 payload_too_large)', async () => {
    const base = JSON.stringify({ inputs: 'where is my parcel' });
    const exact = base + ' '.repeat(MAX_BODY - base.length); // JSON allows trailing whitespace
    expect(Buffer.byteLength(exact)).toBe(MAX_BODY);
    const ok = await client.post('/embed', undefined, { raw: exact, headers: { 'content-type': 'application/json' } });
    expect(ok.status, ok.text).toBe(200);
    expect(maxAbsDiff(ok.body[0], await refEmbedding('where is my parcel'))).toBeLessThan(TOLERANCE);
    const over = await client.post('/embed', undefined, { raw: exact + ' ', headers: { 'content-type': 'application/json' } });
    expectError(over, 413, 'payload_too_large', 'SLABSERVE_PAYLOAD_TOO_LARGE');
  });

  it('a declared Content-Length over the limit is refused before the body is sent, and the connection closed', async () => {
    const c = await RawConnection.open(server.port);
    try {
      const declared = 50 * 1024 * 1024;
      await c.write(requestHead('POST', '/embed', { 'content-type': 'application/json', 'content-length': declared }) + '{"inputs": "');
      const r = await c.response(); // we sent 12 bytes of 50 MiB
      expect(r.status).toBe(413);
      expect(r.headers['content-type']).toBe('application/json');
      expect(JSON.parse(r.body)).toMatchObject({ type: 'payload_too_large', code: 'SLABSERVE_PAYLOAD_TOO_LARGE' });
      await c.serverClose(UWS_BODY_TIMEOUT_MS);
    } finally {
      c.destroy();
    }
  });

  it('a chunked body (no Content-Length) is refused as soon as it grows past the limit; under the limit it is read', async () => {
    const c = await RawConnection.open(server.port);
    try {
      await c.write(requestHead('POST', '/embed', { 'content-type': 'application/json', 'transfer-encoding': 'chunked' }));
      const piece = 'x'.repeat(1000);
      for (let k = 0; k * piece.length <= MAX_BODY; k++) await c.write(chunk(piece));
      // No terminating chunk: the body is not complete, yet the server has answered.
      const r = await c.response();
      expect(r.status).toBe(413);
      expect(JSON.parse(r.body)).toMatchObject({ type: 'payload_too_large', code: 'SLABSERVE_PAYLOAD_TOO_LARGE' });
      await c.serverClose(UWS_BODY_TIMEOUT_MS);
    } finally {
      c.destroy();
    }

    const ok = await RawConnection.open(server.port);
    try {
      const body = JSON.stringify({ inputs: ['where is', 'my parcel'] });
      await ok.write(requestHead('POST', '/embed', { 'content-type': 'application/json', 'transfer-encoding': 'chunked', connection: 'close' }));
      await ok.write(Buffer.concat([chunk(body.slice(0, 10)), chunk(body.slice(10)), Buffer.from('0\r\n\r\n')]));
      const r = await ok.response();
      expect(r.status, r.body).toBe(200);
      const rows = JSON.parse(r.body) as number[][];
      expect(maxAbsDiff(rows[1]!, await refEmbedding('my parcel'))).toBeLessThan(TOLERANCE);
    } finally {
      ok.destroy();
    }
  });

  it('overload: with 4 slots per model, concurrent requests get 200 or 429 (Retry-After, type overloaded); slots return to 0', async () => {
    const rand = makeRandom('http overload');
    const texts = randomTexts(rand, words, 40, 100);
    const before = await scrape(client);
    const burst = await HttpClient.open(server.url); // a pool of its own: one connection per concurrent request
    let replies: Reply[];
    try {
      replies = await Promise.all(texts.map((t, k) => burst.post('/embed', { inputs: [t, texts[(k + 1) % texts.length]!] })));
    } finally {
      await burst.close();
    }
    const ok = replies.filter((r) => r.status === 200);
    const refused = replies.filter((r) => r.status === 429);
    expect(ok.length + refused.length, replies.map((r) => r.status).join(',')).toBe(texts.length);
    expect(ok.length).toBeGreaterThan(0);
    expect(refused.length).toBeGreaterThan(0);
    for (const r of refused) {
      expectError(r, 429, 'overloaded', 'SLABSERVE_OVERLOADED');
      const retry = r.headers.get('retry-after');
      expect(retry).toMatch(/^\d+$/);
      expect(Number(retry)).toBeGreaterThanOrEqual(1);
    }
    for (let k = 0; k < texts.length; k++) {
      if (replies[k]!.status !== 200) continue;
      expect(maxAbsDiff(replies[k]!.body[0], await refEmbedding(texts[k]!))).toBeLessThan(TOLERANCE);
      expect(maxAbsDiff(replies[k]!.body[1], await refEmbedding(texts[(k + 1) % texts.length]!))).toBeLessThan(TOLERANCE);
    }
    await expectSlotsFree(client);
    const after = await scrape(client);
    expect(after.sum('slabserve_request_failures_total', { reason: 'overloaded' }) - before.sum('slabserve_request_failures_total', { reason: 'overloaded' })).toBe(refused.length);
    expect(after.sum('slabserve_slots', { model: 'tiny-embed' })).toBe(SLOTS);
  });

  it('after all of that, the server still answers and no slot is left in use', async () => {
    const r = await client.post('/embed', { inputs: ['still', 'here'] });
    expect(r.status).toBe(200);
    expect(maxAbsDiff(r.body[1], await refEmbedding('here'))).toBeLessThan(TOLERANCE);
    await expectSlotsFree(client);
  });
});

// =================================================================== readiness, two gateways, drain

describe('readiness during warm-up, two gateway threads on one port, draining on close()', () => {
  let server: Server;
  type Sample = { readyResolved: boolean; readyz: number; readyzType?: string; embed: number; embedType?: string; embedCode?: string };
  const samples: Sample[] = [];
  let livezDuringWarmUp: Reply | undefined;
  let readyzDuringWarmUp: Reply | undefined;

  beforeAll(async () => {
    // The models' opening is held (TEST_HOLD_START_ENV) until a few polls have seen the server not
    // ready: a warm-up over before the first poll (a slow start of the gateways) would show no 503.
    const port = await freePort();
    process.env[TEST_HOOKS_ENV] = '1';
    process.env[TEST_HOLD_START_ENV] = '1';
    try {
      server = await startServer(config({ port, gatewayThreads: 2 }));
    } finally {
      delete process.env[TEST_HOOKS_ENV];
      delete process.env[TEST_HOLD_START_ENV];
    }
    // startServer resolves once the gateways listen, before warm-up ends: poll from now.
    let readyResolved = false;
    const ready = server.ready.then(() => {
      readyResolved = true;
    });
    const poller = await HttpClient.open(server.url);
    try {
      let afterReady = 0;
      while (afterReady < 3 && samples.length < 100_000) {
        if (samples.length === 3) server.testHooks!.releaseModelOpen();
        const resolvedBefore = readyResolved;
        const rz = await poller.get('/readyz');
        if (!livezDuringWarmUp && rz.status === 503) {
          readyzDuringWarmUp = rz;
          livezDuringWarmUp = await poller.get('/livez');
        }
        const em = await poller.post('/embed', { inputs: 'where is my parcel' });
        samples.push({ readyResolved: resolvedBefore, readyz: rz.status, readyzType: rz.body?.type, embed: em.status, embedType: em.body?.type, embedCode: em.body?.code });
        if (resolvedBefore) afterReady++;
      }
      await ready;
    } finally {
      await poller.close();
    }
  });

  afterAll(async () => {
    await server?.close();
  });

  it('/readyz is 503 until warm-up ends, then 200 for good; /embed answers 503 unavailable meanwhile; /livez answers at once', () => {
    console.log(`readiness: ${samples.filter((s) => s.readyz === 503).length} polls during warm-up, ${samples.length} in all`);
    expect(samples.length).toBeGreaterThan(3);
    // Each sample is (readyz, then embed); as one timeline, readiness goes false -> true once and never back.
    const timeline = samples.flatMap((s) => [s.readyz, s.embed]);
    for (const status of timeline) expect([200, 503]).toContain(status);
    const firstReady = timeline.indexOf(200);
    expect(firstReady, 'no 503 seen: warm-up ended before the first poll').toBeGreaterThan(0);
    expect(timeline.slice(firstReady).every((s) => s === 200), `went back to 503: ${timeline.join(',')}`).toBe(true);
    expect(timeline.slice(0, firstReady).every((s) => s === 503)).toBe(true);
    // Every answer given after server.ready resolved is 200.
    expect(samples.filter((s) => s.readyResolved).every((s) => s.readyz === 200 && s.embed === 200)).toBe(true);
    // The 503s say why.
    for (const s of samples) {
      if (s.readyz === 503) expect(s.readyzType).toBe('unavailable');
      if (s.embed === 503) expect({ type: s.embedType, code: s.embedCode }).toEqual({ type: 'unavailable', code: 'SLABSERVE_NOT_READY' });
    }
    expect(samples.some((s) => s.embed === 503)).toBe(true);
    expect(readyzDuringWarmUp?.status).toBe(503);
    expect(livezDuringWarmUp?.status).toBe(200);
    expect(livezDuringWarmUp?.body).toEqual({ status: 'alive' });
  });

  it('two gateway threads on one port: many requests on separate connections are all answered; /metrics sums both threads', async () => {
    const rand = makeRandom('http two gateways');
    const texts = randomTexts(rand, words, 48, 40);
    const c = await HttpClient.open(server.url);
    try {
      const info = await c.get('/info', { close: true });
      expect(info.body.gatewayThreads).toBe(2);
      const before = await scrape(c, true);
      // Connection: close on each: 48 connections, which the kernel spreads over both listening threads
      // (SO_REUSEPORT); all on one thread would have probability 2^-47.
      const replies = await Promise.all(texts.map((t) => c.post('/embed', { inputs: t }, { close: true })));
      for (let k = 0; k < texts.length; k++) {
        expect(replies[k]!.status).toBe(200);
        expect(maxAbsDiff(replies[k]!.body[0], await refEmbedding(texts[k]!))).toBeLessThan(TOLERANCE);
      }
      const after = await scrape(c, true);
      const count = (m: Metrics) => m.sum('slabserve_request_duration_seconds_count', { route: '/embed', status: '200' });
      expect(count(after) - count(before)).toBe(texts.length);
      expect(after.sum('slabserve_request_inputs_total', { route: '/embed' }) - before.sum('slabserve_request_inputs_total', { route: '/embed' })).toBe(texts.length);
      // Both gateway threads report into the one scrape.
      expect(after.has('slabserve_gateway_event_loop_lag_seconds', { gateway: '0' })).toBe(true);
      expect(after.has('slabserve_gateway_event_loop_lag_seconds', { gateway: '1' })).toBe(true);
      await expectSlotsFree(c, true);
    } finally {
      await c.close();
    }
  });

  it('close(): new connections refused, requests on open ones 503 with Connection: close, in-flight requests finish; idle connections closed; afterwards /readyz no longer answers 200', async () => {
    const rand = makeRandom('http drain');
    const c = await HttpClient.open(server.url);
    // Idle keep-alive connections, as every pooling client keeps: close() must close them before it stops
    // the gateway threads (a uWS socket still open then aborts the whole process, this test run included).
    const idle = await RawConnection.open(server.port);
    const kept = await RawConnection.open(server.port);
    // The in-flight request is held queued (the inference hold) until the open connection has had its
    // 503: finished before that, the drain would go on to close idle connections, `kept` among them.
    const hooks = server.testHooks!;
    try {
      for (const conn of [idle, kept]) {
        await conn.write(requestHead('GET', '/livez', {}));
        expect((await conn.response()).status).toBe(200);
      }
      const keptBytes = kept.received;

      // The other requests here send Connection: close: each on a connection of its own.
      const long = Array.from({ length: 64 }, () => wordsText(rand, 600));
      // 64 inputs of 512 tokens: the in-flight request close() must wait for.
      await hooks.holdInference();
      const inFlight = c.post('/embed', { inputs: long, truncate: true }, { close: true });
      let inFlightSettled = false;
      void inFlight.finally(() => (inFlightSettled = true));
      await eventually('the in-flight request queued', () => scrape(c, true), (m) => slotsInUse(m)['tiny-embed'] > 0);
      expect(idle.serverClosed, 'the idle connection timed out before close(): nothing to test').toBe(false);
      const closing = server.close();
      // A new connection is refused (the listen sockets close first): nothing was sent, a client may retry elsewhere.
      const fresh = await eventually(
        'new connections refused',
        () => c.get('/readyz', { close: true }).then((r) => String(r.status), (e: Error & { cause?: { code?: string } }) => e.cause?.code ?? e.message),
        (v) => v !== '200' && v !== '503',
      );
      expect(['ECONNREFUSED', 'ECONNRESET']).toContain(fresh);
      // A request on a connection already open is answered 503, told to close, and the connection closed.
      await kept.write(requestHead('GET', '/readyz', {}));
      const drained = await kept.response(15_000, keptBytes);
      expect(drained.status).toBe(503);
      expect(drained.headers.connection).toBe('close');
      await kept.serverClose();
      expect(inFlightSettled, 'the in-flight request answered while held').toBe(false);
      hooks.releaseInference();
      const done = await inFlight;
      expect(done.status, done.text).toBe(200);
      expect(done.body).toHaveLength(64);
      expect(maxAbsDiff(done.body[63], await refEmbedding(long[63]!, { truncate: true }))).toBeLessThan(TOLERANCE);
      await closing;
      const after = await c.get('/readyz', { close: true }).then(
        (r) => r.status,
        (e: Error & { cause?: { code?: string } }) => e.cause?.code ?? e.message,
      );
      expect(after).toBe('ECONNREFUSED');
      await idle.serverClose();
    } finally {
      hooks.releaseInference();
      idle.destroy();
      kept.destroy();
      await c.close();
    }
  });
});

describe('the stop signal (SIGTERM in the CLI): the drain begins the moment it is aborted, even while starting', () => {
  /** Starts a server on a free port with the stop signal and the log lines kept, its warm-up held (test hooks). */
  async function start(stop: AbortController, lines: string[]): Promise<Server> {
    const port = await freePort();
    process.env[TEST_HOOKS_ENV] = '1';
    process.env[TEST_HOLD_START_ENV] = '1';
    try {
      return await startServer(config({ port, gatewayThreads: 2, signal: stop.signal, log: (l: string) => lines.push(l) }));
    } finally {
      delete process.env[TEST_HOOKS_ENV];
      delete process.env[TEST_HOLD_START_ENV];
    }
  }

  it('aborted: the next request on an open connection is 503 NOT_READY with Connection: close, with no wait; the server then stops by itself', async () => {
    const stop = new AbortController();
    const lines: string[] = [];
    const server = await start(stop, lines);
    const conn = await RawConnection.open(server.port);
    try {
      const ask = async () => {
        const from = conn.received;
        await conn.write(requestHead('POST', '/embed', { 'content-type': 'application/json', 'content-length': 12 }) + '{"inputs":1}');
        return conn.response(15_000, from);
      };
      // Warming up (held): refused, and the connection kept.
      const before = await ask();
      expect({ status: before.status, connection: before.headers.connection }).toEqual({ status: 503, connection: undefined });
      stop.abort(); // nothing awaited between this and the request
      const after = await ask();
      expect({ status: after.status, connection: after.headers.connection, code: (JSON.parse(after.body) as { code: string }).code }).toEqual({ status: 503, connection: 'close', code: 'SLABSERVE_NOT_READY' });
      await conn.serverClose();
      server.testHooks!.releaseModelOpen();
      await eventually('the server stops without close()', async () => lines, (l) => l.includes('slabserve: stopped'), 30_000, (l) => l.slice(-3).join(' | '));
    } finally {
      conn.destroy();
      await server.close();
    }
  });

  it('aborted while the second gateway starts: the first, already serving, refuses with Connection: close; the server stops by itself', async () => {
    const stop = new AbortController();
    const lines: string[] = [];
    const port = await freePort();
    process.env[TEST_HOOKS_ENV] = '1';
    process.env[TEST_HOLD_START_ENV] = '1';
    process.env[TEST_HOLD_GATEWAY_ENV] = '1'; // the second gateway starts only once the stop signal fires
    let returned = false;
    const starting = startServer(config({ port, gatewayThreads: 2, signal: stop.signal, log: (l: string) => lines.push(l) })).finally(() => (returned = true));
    let conn: RawConnection | null = null;
    try {
      // The first gateway listens while the second waits to start (gateways start one after the other).
      while (!conn) conn = await RawConnection.open(port).catch(() => sleep(2).then(() => null));
      expect(returned).toBe(false);
      stop.abort();
      await conn.write(requestHead('POST', '/embed', { 'content-type': 'application/json', 'content-length': 12 }) + '{"inputs":1}');
      const after = await conn.response();
      expect({ status: after.status, connection: after.headers.connection }).toEqual({ status: 503, connection: 'close' });
      const server = await starting;
      server.testHooks!.releaseModelOpen();
      await eventually('the server stops without close()', async () => lines, (l) => l.includes('slabserve: stopped'), 30_000, (l) => l.slice(-3).join(' | '));
      const refused = await fetch(`${server.url}/readyz`).then((r) => String(r.status), (e: Error & { cause?: { code?: string } }) => e.cause?.code ?? e.message);
      expect(refused).toBe('ECONNREFUSED');
      await server.close(); // the same drain: resolves at once
    } finally {
      delete process.env[TEST_HOOKS_ENV];
      delete process.env[TEST_HOLD_START_ENV];
      delete process.env[TEST_HOLD_GATEWAY_ENV];
      conn?.destroy();
      await starting.then((s) => s.close(), () => {});
    }
  });
});

// =================================================================== start-up and shut-down in a child process

describe('start-up and shut-down in child processes (when these go wrong, the process aborts)', () => {
  const fixture = fileURLToPath(new URL('./fixtures/server-process.mjs', import.meta.url));
  type Outcome = { code: number | null; signal: string | null; stdout: string; stderr: string };
  const run = (mode: string): Promise<Outcome> =>
    new Promise((resolve) => {
      const child = spawn(process.execPath, [fixture, mode], { stdio: ['ignore', 'pipe', 'pipe'] });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d: Buffer) => (stdout += d));
      child.stderr.on('data', (d: Buffer) => (stderr += d));
      const timer = setTimeout(() => child.kill('SIGKILL'), 50_000);
      child.on('exit', (code, signal) => {
        clearTimeout(timer);
        resolve({ code, signal, stdout, stderr: stderr.slice(0, 400) });
      });
    });
  const outcomes: Record<string, Outcome> = {};

  beforeAll(async () => {
    const modes = ['two-gateways-port-0', 'port-in-use'];
    const done = await Promise.all(modes.map(run));
    modes.forEach((m, k) => (outcomes[m] = done[k]!));
  });

  /** The process ran to its end (exit 0, its last line "ok: {...}"): what it saw, for the test to check. */
  const seen = (o: Outcome): Record<string, any> => { // eslint-disable-line @typescript-eslint/no-explicit-any
    const last = o.stdout.trim().split('\n').pop() ?? '';
    expect({ code: o.code, signal: o.signal, last: last.slice(0, 4) }, `${last}\n${o.stderr}`).toEqual({ code: 0, signal: null, last: 'ok: ' });
    return JSON.parse(last.slice(4));
  };

  // uSockets sets SO_REUSEPORT only for a non-zero port: with port 0 and two gateways, startServer
  // must pick a free port itself so the second gateway can join the first.
  it('gatewayThreads 2 with port 0 starts on one port that both gateways answer on', () => {
    const o = seen(outcomes['two-gateways-port-0']!);
    console.log(`two gateways, port 0: ${JSON.stringify(o)}`);
    expect(o.port).toBeGreaterThan(0);
    expect(o.urlPort).toBe(o.port);
    // Every request answered 200, and both gateway threads answered some (the second joined the port).
    expect(o.statuses).toEqual({ 200: o.requests });
    expect(o.gateways).toBe(2);
  });

  // Terminating the inference thread while onnxruntime opens its sessions aborts the process: a start-up
  // failure must stop it cleanly, and startServer reject.
  it('a port already in use makes startServer reject (not abort the process)', () => {
    const o = seen(outcomes['port-in-use']!);
    expect(o.rejected).toEqual({
      name: 'SlabserveError',
      code: 'SLABSERVE_PORT_IN_USE',
      // The port it was asked for, and the flag that chooses another.
      message: expect.stringMatching(new RegExp(`^127\\.0\\.0\\.1:${o.port} is in use\\b.*--port`)),
    });
  });
});
