/**
 * The result cache in a real server (startServer: gateway threads, the
 * inference thread, onnxruntime on CPU, the generated tiny models): the same
 * inputs again are answered `x-cache: hit` with the bits of the first answer,
 * which equals the independent reference, no batch runs for them, and no slot
 * is needed; partial hits run only their misses; `--cache-mb 0` turns it off.
 * Rows are compared as float32 bits (msgpack carries every float32 exactly, as
 * a float64), not as rounded JSON. Fresh random texts each run (seed printed).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { createEngine } from '../dist/src/main/engine.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { HttpClient, parseMetrics, type Metrics, type Reply } from './fixtures/http-client.js';
import { eventually, makeRandom, maxAbsDiff, randomTexts, Reference, testServerConfig, vocabularyWords } from './helpers.js';

process.env.SLABSERVE_TEST_HOOKS = '1'; // the stall that holds every slot, and a gateway's death

const TOLERANCE = 1e-5;
const DIM = 128;
const SLOTS = 4;

let embedRef: Reference;
let intentRef: Reference;
let embedTok: TextTokenizer;
let words: string[];

beforeAll(async () => {
  embedRef = await Reference.open('tiny-embed');
  intentRef = await Reference.open('tiny-intent');
  embedTok = await loadTokenizer(embedRef.spec.tokenizerPath);
  words = vocabularyWords(embedRef.spec);
});

afterAll(async () => {
  await embedRef?.close();
  await intentRef?.close();
});

/** A row's float32 bits. */
const bits = (row: ArrayLike<number>) => Array.from(new Uint32Array(Float32Array.from(row).buffer));

async function scrape(c: HttpClient): Promise<Metrics> {
  const r = await c.get('/metrics');
  expect(r.status).toBe(200);
  return parseMetrics(r.text);
}

/** What the device ran for `model`: rows in batches, and real tokens. */
const ran = (m: Metrics, model: string) => ({ rows: m.sum('slabserve_batch_size_sum', { model }), tokens: m.sum('slabserve_tokens_total', { model, kind: 'real' }) });
const cacheCounts = (m: Metrics, model: string) => ({
  hits: m.sum('slabserve_cache_hits_total', { model }),
  misses: m.sum('slabserve_cache_misses_total', { model }),
});

/** POST /embed as msgpack both ways: the rows as float32 bits, and the reply. */
async function embed(c: HttpClient, inputs: unknown, extra: object = {}): Promise<{ r: Reply; rows: number[][] }> {
  const r = await c.post('/embed', { inputs, ...extra }, { as: 'msgpack', accept: 'msgpack' });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return { r, rows: (r.body as number[][]).map(bits) };
}

async function expectReference(texts: string[], rows: number[][]): Promise<void> {
  for (let i = 0; i < texts.length; i++) {
    const ref = (await embedRef.rowOfText(embedTok, texts[i]!)).slice(0, DIM);
    const got = new Float32Array(Uint32Array.from(rows[i]!).buffer);
    expect(maxAbsDiff(got, ref), `text ${i}: ${texts[i]}`).toBeLessThan(TOLERANCE);
  }
}

describe('the result cache on (two gateway threads)', () => {
  let server: Server;
  let client: HttpClient;

  beforeAll(async () => {
    // Few slots, so the last test can hold them all; a heartbeat timeout that lets it stall the loop briefly.
    server = await startServer(
      testServerConfig({ models: ['tiny-embed', 'tiny-intent'], gatewayThreads: 2, cacheMb: 16, slotsPerModel: SLOTS, maxClientBatchSize: SLOTS, heartbeatTimeoutMs: 6000 }),
    );
    await server.ready;
    client = await HttpClient.open(server.url);
  });

  afterAll(async () => {
    await client?.close();
    await server?.close();
  });

  it('GET /info says the cache: its size, the rows each model may keep, the longest key', async () => {
    const r = await client.get('/info');
    expect(r.status).toBe(200);
    // The rows each model may keep, from the table's layout (docs/cache.md, Sizing; src/shared/result-cache.ts): an
    // entry is 6 header words, room for a 64-token key and the model's row (tiny-embed's 128 floats and its norm,
    // tiny-intent's probabilities and logits), in whole 64-byte lines; every model has as many sets of 8 as fit in
    // 16 MiB together (less the few hundred bytes of counters at its head, which here fit in what is left over).
    const entryBytes = (width: number) => Math.ceil((6 + 64 + width) / 16) * 64;
    const entries = { 'tiny-embed': entryBytes(DIM + 1), 'tiny-intent': entryBytes(2 * intentRef.spec.labels.length) };
    const sets = Math.floor((16 * 2 ** 20) / (8 * (entries['tiny-embed'] + entries['tiny-intent'])));
    expect(r.body.cache).toEqual({ megabytes: 16, rowsPerModel: 8 * sets, maxKeyTokens: 64 });
    expect(8 * sets).toBeGreaterThan(1000); // 16 MiB holds thousands of short rows of each model
    // And each model's region of the table is that many entries.
    const m = await scrape(client);
    for (const [model, bytes] of Object.entries(entries)) expect(m.sum('slabserve_cache_capacity_bytes', { model }), model).toBe(8 * sets * bytes);
  });

  it('the same texts twice: the second is x-cache: hit, bit for bit the first (the reference), and no batch runs for it', async () => {
    const rand = makeRandom('cache-server twice');
    const texts = randomTexts(rand, words, 3, 6);
    const m0 = await scrape(client);
    const first = await embed(client, texts);
    expect(first.r.headers.get('x-cache')).toBe('miss');
    await expectReference(texts, first.rows);
    const m1 = await scrape(client);
    expect(cacheCounts(m1, 'tiny-embed')).toEqual({ hits: cacheCounts(m0, 'tiny-embed').hits, misses: cacheCounts(m0, 'tiny-embed').misses + 3 });
    expect(ran(m1, 'tiny-embed').rows - ran(m0, 'tiny-embed').rows).toBe(3);

    // Again, on fresh connections (the kernel spreads them over both gateway threads): every one a hit.
    for (let i = 0; i < 6; i++) {
      const c = await HttpClient.open(server.url);
      try {
        const again = await embed(c, texts);
        expect(again.r.headers.get('x-cache')).toBe('hit');
        expect(again.rows).toEqual(first.rows);
        // Answered by the gateway: no queue, no run.
        expect(again.r.headers.get('x-queue-time')).toBe('0.000');
        expect(again.r.headers.get('x-inference-time')).toBe('0.000');
      } finally {
        await c.close();
      }
    }
    const m2 = await scrape(client);
    expect(ran(m2, 'tiny-embed')).toEqual(ran(m1, 'tiny-embed'));
    expect(cacheCounts(m2, 'tiny-embed')).toEqual({ hits: cacheCounts(m1, 'tiny-embed').hits + 18, misses: cacheCounts(m1, 'tiny-embed').misses });
    expect(m2.sum('slabserve_cache_bytes', { model: 'tiny-embed' })).toBeGreaterThan(0);
    expect(m2.sum('slabserve_cache_bytes', { model: 'tiny-embed' })).toBeLessThanOrEqual(m2.sum('slabserve_cache_capacity_bytes', { model: 'tiny-embed' }));
    expect(m2.sum('slabserve_cache_capacity_bytes')).toBeLessThanOrEqual(16 * 2 ** 20);
    expect(m2.has('slabserve_cache_evictions_total', { model: 'tiny-embed' })).toBe(true);
  });

  it('the cached row serves every option and dialect: normalize false, the token ids of the text, OpenAI base64 (its f32 bytes)', async () => {
    const rand = makeRandom('cache-server dialects');
    const [text] = randomTexts(rand, words, 1, 6) as [string];
    const first = await embed(client, [text]);
    expect(first.r.headers.get('x-cache')).toBe('miss');
    const m0 = await scrape(client);
    // normalize false: the same cached row, scaled back by its norm after the lookup.
    const scaled = await embed(client, [text], { normalize: false });
    expect(scaled.r.headers.get('x-cache')).toBe('hit');
    const row = await embedRef.rowOfText(embedTok, text);
    const got = new Float32Array(Uint32Array.from(scaled.rows[0]!).buffer);
    expect(maxAbsDiff(got, Array.from(row.slice(0, DIM), (v) => v * row[DIM]!))).toBeLessThan(1e-4 * row[DIM]!);
    // The text's token ids, sent as ids: the same key.
    const ids = Array.from(embedTok.encode(text, { maxLength: 512, truncate: false }).ids);
    const byIds = await embed(client, [ids]);
    expect(byIds.r.headers.get('x-cache')).toBe('hit');
    expect(byIds.rows).toEqual(first.rows);
    // OpenAI's base64: the float32 bytes of the same row.
    const oa = await client.post('/v1/embeddings', { input: text, model: 'tiny-embed', encoding_format: 'base64' });
    expect(oa.status, oa.text).toBe(200);
    expect(oa.headers.get('x-cache')).toBe('hit');
    const bytes = Buffer.from(oa.body.data[0].embedding as string, 'base64');
    expect(bits(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4))).toEqual(first.rows[0]);
    expect(ran(await scrape(client), 'tiny-embed')).toEqual(ran(m0, 'tiny-embed'));
    // A prompt changes the tokens: another key, a miss.
    const prompted = await embed(client, [text], { prompt: 'query: ' });
    expect(prompted.r.headers.get('x-cache')).toBe('miss');
    expect(prompted.rows[0]).not.toEqual(first.rows[0]);
  });

  it('a classifier too: /predict twice, the second a hit with the same scores, bit for bit', async () => {
    const rand = makeRandom('cache-server predict');
    const texts = randomTexts(rand, words, 2, 6);
    const one = await client.post('/predict', { inputs: texts }, { as: 'msgpack', accept: 'msgpack' });
    const two = await client.post('/predict', { inputs: texts }, { as: 'msgpack', accept: 'msgpack' });
    expect([one.status, two.status]).toEqual([200, 200]);
    expect([one.headers.get('x-cache'), two.headers.get('x-cache')]).toEqual(['miss', 'hit']);
    const flat = (b: { label: string; score: number }[][]) => b.map((l) => l.map((x) => [x.label, bits([x.score])[0]]));
    expect(flat(two.body)).toEqual(flat(one.body));
    // The same text as an embedding is another model's key: a miss there.
    const other = await embed(client, [texts[0]]);
    expect(other.r.headers.get('x-cache')).toBe('miss');
  });

  it('a partial hit: the cached inputs come from the cache, only the others run; x-cache: miss, then hit', async () => {
    const rand = makeRandom('cache-server partial');
    const [a, b, c] = randomTexts(rand, words, 3, 6) as [string, string, string];
    const cached = await embed(client, [a]);
    const m0 = await scrape(client);
    const mixed = await embed(client, [b, a, c]);
    expect(mixed.r.headers.get('x-cache')).toBe('miss');
    expect(mixed.rows[1]).toEqual(cached.rows[0]);
    await expectReference([b, a, c], mixed.rows);
    const m1 = await scrape(client);
    expect(ran(m1, 'tiny-embed').rows - ran(m0, 'tiny-embed').rows).toBe(2); // b and c alone ran
    expect(cacheCounts(m1, 'tiny-embed')).toEqual({ hits: cacheCounts(m0, 'tiny-embed').hits + 1, misses: cacheCounts(m0, 'tiny-embed').misses + 2 });
    const again = await embed(client, [c, b, a]);
    expect(again.r.headers.get('x-cache')).toBe('hit');
    expect(again.rows).toEqual([mixed.rows[2], mixed.rows[0], mixed.rows[1]]);
  });

  it('a gateway thread that dies leaves the cache to its replacement: hits after it is back', { timeout: 30_000 }, async () => {
    const rand = makeRandom('cache-server gateway death');
    const texts = randomTexts(rand, words, 2, 6);
    const first = await embed(client, texts);
    const before = await scrape(client);
    server.testHooks!.gatewayFault(0);
    await eventually('the gateway replaced', () => scrape(client).catch(() => before), (m) => m.sum('slabserve_gateway_restarts_total') === before.sum('slabserve_gateway_restarts_total') + 1);
    for (let i = 0; i < 6; i++) {
      const c = await HttpClient.open(server.url);
      try {
        const again = await embed(c, texts);
        expect(again.r.headers.get('x-cache')).toBe('hit');
        expect(again.rows).toEqual(first.rows);
      } finally {
        await c.close();
      }
    }
  });

  it('a full hit needs no slot: with every slot held, a hit is answered 200 and a miss 429', { timeout: 40_000 }, async () => {
    const rand = makeRandom('cache-server no slot');
    const texts = randomTexts(rand, words, 2, 6);
    const cached = await embed(client, texts);
    // The loop stops taking work in: these take every slot and wait on the submit ring.
    await server.testHooks!.inferenceFault('stall');
    const holders = randomTexts(rand, words, SLOTS, 6).map((t) => client.post('/embed', { inputs: [t] }));
    await eventually('every slot held', () => scrape(client), (m) => m.sum('slabserve_slots_in_use', { model: 'tiny-embed' }) === SLOTS);
    const hit = await embed(client, texts);
    expect(hit.r.headers.get('x-cache')).toBe('hit');
    expect(hit.rows).toEqual(cached.rows);
    const miss = await client.post('/embed', { inputs: randomTexts(rand, words, 1, 6) });
    expect(miss.status, miss.text).toBe(429);
    expect(miss.body.code).toBe('SLABSERVE_OVERLOADED');
    // The stalled loop is replaced (heartbeat timeout): the holders are answered 503, the server serves again.
    for (const r of await Promise.all(holders)) expect([r.status, r.body.code]).toEqual([503, 'SLABSERVE_INFERENCE_RESTARTED']);
    await eventually('ready again', () => client.get('/readyz'), (r) => r.status === 200);
    await eventually('every slot free', () => scrape(client), (m) => m.sum('slabserve_slots_in_use', { model: 'tiny-embed' }) === 0);
  });
});

describe('the result cache off (--cache-mb 0)', () => {
  let server: Server;
  let client: HttpClient;

  beforeAll(async () => {
    server = await startServer(testServerConfig({ models: ['tiny-embed'], cacheMb: 0 }));
    await server.ready;
    client = await HttpClient.open(server.url);
  });

  afterAll(async () => {
    await client?.close();
    await server?.close();
  });

  it('no x-cache header, every repeat runs on the device, no cache series', async () => {
    const rand = makeRandom('cache-server off');
    const texts = randomTexts(rand, words, 2, 6);
    const m0 = await scrape(client);
    const one = await embed(client, texts);
    const two = await embed(client, texts);
    expect([one.r.headers.get('x-cache'), two.r.headers.get('x-cache')]).toEqual([null, null]);
    await expectReference(texts, two.rows);
    const m1 = await scrape(client);
    expect(ran(m1, 'tiny-embed').rows - ran(m0, 'tiny-embed').rows).toBe(4);
    expect(m1.samples.filter((s) => s.name.startsWith('slabserve_cache_'))).toEqual([]);
  });
});

describe('the in-process engine with cacheMb', () => {
  it('a repeat is answered from the cache: the same bits, and no batch runs for it', { timeout: 60_000 }, async () => {
    const rand = makeRandom('cache-server engine');
    const engine = await createEngine({ models: ['tiny-embed'], device: 'cpu', cacheMb: 4, log: () => {} });
    try {
      const texts = randomTexts(rand, words, 3, 6);
      const first = await engine.embed(texts);
      const rowsRun = engine.stats()['tiny-embed']!.rows;
      const again = await engine.embed(texts);
      expect(engine.stats()['tiny-embed']!.rows).toBe(rowsRun);
      expect(again.map(bits)).toEqual(first.map(bits));
      await expectReference(texts, again.map(bits));
      // normalize false on a hit: the caller's row is scaled (the reference's row times its norm), the cached one is not.
      const scaled = await engine.embed(texts, { normalize: false });
      expect(engine.stats()['tiny-embed']!.rows).toBe(rowsRun); // a hit: nothing ran
      for (const [i, t] of texts.entries()) {
        const ref = await embedRef.rowOfText(embedTok, t);
        const norm = ref[DIM]!;
        expect(Math.abs(norm - 1), 'a norm that scaling shows').toBeGreaterThan(0.1);
        expect(maxAbsDiff(scaled[i]!, ref.slice(0, DIM).map((v) => v * norm)), `text ${i} unnormalised`).toBeLessThan(TOLERANCE * norm);
      }
      expect((await engine.embed(texts)).map(bits)).toEqual(first.map(bits));
      expect(engine.stats()['tiny-embed']!.rows).toBe(rowsRun);
    } finally {
      await engine.close();
    }
  });
});
