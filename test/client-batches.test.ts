/**
 * Large client batches (core/client-batches.ts): a request of far more inputs
 * than the model has slots for is run part by part and answered once, in
 * order, with the rows a plain onnxruntime run of the unmodified graph gives
 * each input alone; other clients keep being served while it runs; a client
 * that goes away mid-batch leaves no slot behind.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { partSizeFor, PARTS_IN_FLIGHT } from '../dist/src/core/client-batches.js';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { parseMetrics } from './fixtures/http-client.js';
import { batchesOfQueued, sentTogether, servedBatching } from './fixtures/queued-together.js';
import { eventually, makeRandom, maxAbsDiff, PlainReference, randomTexts, randomTokenSequences, sleep, testServerConfig, vocabularyWords } from './helpers.js';

// The servers here can make one token id fail in onnxruntime (server.testHooks.poisonToken), and hold the
// inference loop while a test queues its requests (sentTogether); inert otherwise.
process.env.SLABSERVE_TEST_HOOKS = '1';

const SLOTS = 64;
const PART = partSizeFor(SLOTS, 32); // 16: a quarter of the slots
const BIG = 1000;

let server: Server;
let ref: PlainReference;
let tok: TextTokenizer;
let words: string[];

beforeAll(async () => {
  server = await startServer(testServerConfig({ models: ['tiny-embed'], slotsPerModel: SLOTS, maxClientBatchSize: BIG, batching: { maxBatchSize: 32 } }));
  await server.ready;
  ref = await PlainReference.open('tiny-embed');
  tok = await loadTokenizer(ref.spec.tokenizerPath);
  words = vocabularyWords(ref.spec);
});

afterAll(async () => {
  await server?.close();
  await ref?.close();
});

const embed = async (inputs: string | string[], signal?: AbortSignal) => {
  const r = await fetch(`${server.url}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs }), ...(signal ? { signal } : {}) });
  return { status: r.status, body: (await r.json()) as number[][] | { error: string } };
};

const metrics = async () => parseMetrics(await (await fetch(`${server.url}/metrics`)).text());

describe('partSizeFor', () => {
  it('a quarter of the slots at most, at least a full batch where the slots allow, never 0', () => {
    expect(partSizeFor(1024, 32)).toBe(32);
    expect(partSizeFor(1024, 128)).toBe(128);
    expect(partSizeFor(1024, 8)).toBe(32);
    expect(partSizeFor(64, 32)).toBe(16);
    expect(partSizeFor(2, 32)).toBe(1);
  });
});

describe(`a client batch of ${BIG} inputs on a model with ${SLOTS} slots`, () => {
  it('is one answer, in order, each row the unmodified graph run on that input alone, and equal to the input sent alone', async () => {
    const texts = randomTexts(makeRandom('client-batches: 1000 texts'), words, BIG, 12);
    const before = await metrics();
    const big = await embed(texts);
    expect(big.status, JSON.stringify(big.body).slice(0, 300)).toBe(200);
    const rows = big.body as number[][];
    expect(rows).toHaveLength(BIG);
    let worst = 0;
    for (let i = 0; i < BIG; i++) {
      const want = await ref.embedding(tok.encode(texts[i]!, { maxLength: ref.spec.maxLength, truncate: false }).ids);
      worst = Math.max(worst, maxAbsDiff(rows[i]!, want));
    }
    console.log(`1000 rows against the plain graph: worst component ${worst.toExponential(2)}`);
    expect(worst).toBeLessThan(1e-5);
    const mid = await metrics();
    // The same texts one request each (16 at a time, all queued at once): the same rows.
    const batching = await servedBatching(server.url, 'tiny-embed');
    let singleBatches = 0;
    let vsSingle = 0;
    for (let i = 0; i < BIG; i += 16) {
      const group = texts.slice(i, i + 16);
      singleBatches += batchesOfQueued(group.map((t) => tok.encode(t, { maxLength: ref.spec.maxLength, truncate: false }).ids.length), batching);
      const singles = await sentTogether(server.testHooks, { 'tiny-embed': group.length }, () => Promise.all(group.map((t) => embed(t))));
      singles.forEach((s, k) => {
        expect(s.status).toBe(200);
        vsSingle = Math.max(vsSingle, maxAbsDiff((s.body as number[][])[0]!, rows[i + k]!));
      });
    }
    expect(vsSingle).toBeLessThan(1e-5);
    const after = await metrics();
    // All of them ran on the device, batched: more than one part, fewer batches than inputs. The big
    // request's count depends on when its parts arrive (at most a batch a row); the singles', queued
    // 16 at once, is exactly what their buckets make.
    const batches = (a: typeof after, b: typeof after) => a.sum('slabserve_batch_size_count') - b.sum('slabserve_batch_size_count');
    expect(mid.sum('slabserve_batch_size_sum') - before.sum('slabserve_batch_size_sum')).toBe(BIG);
    expect(after.sum('slabserve_batch_size_sum') - mid.sum('slabserve_batch_size_sum')).toBe(BIG);
    expect(batches(mid, before)).toBeGreaterThan(BIG / 32);
    expect(batches(after, mid)).toBe(singleBatches);
    expect(singleBatches).toBeLessThan(BIG);
    expect(batches(after, before)).toBeLessThan(2 * BIG);
  });

  it('never holds more than its parts in flight, and other clients are served while it runs', async () => {
    const texts = randomTexts(makeRandom('client-batches: interleaved'), words, BIG, 12);
    let bigDone = false;
    const bigAnswer = embed(texts).finally(() => (bigDone = true));
    const singles: { status: number; beforeBig: boolean }[] = [];
    let peakSlots = 0;
    const single = (async () => {
      for (let i = 0; !bigDone; i++) {
        const s = await embed(texts[i % BIG]!);
        singles.push({ status: s.status, beforeBig: !bigDone });
      }
    })();
    const sampler = (async () => {
      while (!bigDone) {
        peakSlots = Math.max(peakSlots, (await metrics()).sum('slabserve_slots_in_use', { model: 'tiny-embed' }));
        await sleep(5);
      }
    })();
    const big = await bigAnswer;
    await Promise.all([single, sampler]);
    expect(big.status).toBe(200);
    expect((big.body as number[][]).length).toBe(BIG);
    const served = singles.filter((s) => s.beforeBig);
    console.log(`${served.length} single requests answered while the batch ran; peak slots in use ${peakSlots} of ${SLOTS}`);
    expect(singles.every((s) => s.status === 200)).toBe(true);
    expect(served.length).toBeGreaterThanOrEqual(3);
    // The batch's parts, plus the one single request in flight.
    expect(peakSlots).toBeLessThanOrEqual(PARTS_IN_FLIGHT * PART + 1);
  });

  it('a client that goes away mid-batch leaves no slot behind, and the server goes on', async () => {
    const texts = randomTexts(makeRandom('client-batches: abandoned'), words, BIG, 12);
    const before = await metrics();
    const abort = new AbortController();
    const answer = embed(texts, abort.signal).catch((e: unknown) => e);
    await eventually('the batch running', metrics, (m) => m.sum('slabserve_batch_size_sum') > before.sum('slabserve_batch_size_sum'), 20_000, () => 'no batch yet');
    abort.abort();
    expect(await answer).toBeInstanceOf(Error);
    await eventually('every slot back', metrics, (m) => m.sum('slabserve_slots_in_use', { model: 'tiny-embed' }) === 0, 20_000, (m) => m.sum('slabserve_slots_in_use'));
    const ran = (await metrics()).sum('slabserve_batch_size_sum') - before.sum('slabserve_batch_size_sum');
    console.log(`the abandoned batch ran ${ran} of its ${BIG} inputs`);
    expect(ran).toBeLessThan(BIG); // the rest were never run
    const after = await embed(texts[0]!);
    expect(after.status).toBe(200);
  });

  it('an input the model fails on fails the request (422, or 500 had it run alone), cancels the parts after it, and leaves no slot behind', async () => {
    const POISON = 999; // in the vocabulary, outside the ids randomTokenSequences draws
    const rand = makeRandom('client-batches: poisoned');
    const seqs = randomTokenSequences(rand, BIG, 6, 24).map((x) => Array.from(x.ids));
    // Anywhere but in the last parts: whole parts follow the ones that may still run once it has failed (below).
    const at = Math.floor(rand() * (BIG - (PARTS_IN_FLIGHT + 2) * PART));
    const part = Math.floor(at / PART);
    seqs[at]!.splice(2, 0, POISON);
    const rowsRun = async () => (await metrics()).sum('slabserve_batch_size_sum'); // rows of runs that succeeded, each input once
    const splitRuns = async () => (await metrics()).sum('slabserve_batch_split_runs_total');
    const before = await rowsRun();
    const splitBefore = await splitRuns();
    let atAnswer: number;
    await server.testHooks!.poisonToken(POISON);
    try {
      const r = await fetch(`${server.url}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: seqs }) });
      atAnswer = await rowsRun();
      const body = (await r.json()) as { code: string };
      // 422 when it shared its batch (split until it stood alone), 500 when it ran alone (supervision.test.ts)
      expect(`${r.status} ${body.code}`).toMatch(/^(422 SLABSERVE_INPUT_FAILED|500 SLABSERVE_INFERENCE_FAILED)$/);
    } finally {
      await server.testHooks!.poisonToken(-1);
    }
    await eventually('every slot back', metrics, (m) => m.sum('slabserve_slots_in_use', { model: 'tiny-embed' }) === 0, 20_000, (m) => m.sum('slabserve_slots_in_use'));
    const ran = (await rowsRun()) - before;
    const ranAfter = (await rowsRun()) - atAnswer!;
    const splits = (await splitRuns()) - splitBefore;
    // Rows run: at most the parts up to its own, less the input itself, and the PARTS_IN_FLIGHT parts after it:
    // the one in flight beside its own, and the next one that lane took up if it ended first, which may start
    // before the cancel reaches it. And while the failed batch is split and its halves run again one at a time
    // (the request fails only after the last), a half that succeeds answers its rows at once: the other lane's
    // part, finished so, makes room for its next, which the other model instance may run meanwhile: one part more
    // per split run at most. No part after those; and once the request has failed (its answer), at most the parts
    // then in flight run.
    const bound = (part + 1 + PARTS_IN_FLIGHT + splits) * PART - 1;
    console.log(`the batch with a poisoned input at ${at} (part ${part} of ${PART} inputs) ran ${ran} rows of its ${BIG} inputs (${splits} split runs), ${ranAfter} after the answer; at most ${bound} may run`);
    expect(ran).toBeLessThanOrEqual(bound);
    expect(ranAfter).toBeLessThanOrEqual(PARTS_IN_FLIGHT * PART);
  });
});

describe('a large client batch with the result cache on', () => {
  let cached: Server;
  beforeAll(async () => {
    cached = await startServer(testServerConfig({ models: ['tiny-embed'], slotsPerModel: SLOTS, maxClientBatchSize: BIG, cacheMb: 8, batching: { maxBatchSize: 32 } }));
    await cached.ready;
  });
  afterAll(async () => {
    await cached?.close();
  });

  it('runs only the inputs the cache lacks, part by part, and answers every row in order', async () => {
    const texts = randomTexts(makeRandom('client-batches: half cached'), words, BIG, 12).map((t, i) => `${t} ${i}`); // each text once
    const post = async (inputs: string[]) => {
      const r = await fetch(`${cached.url}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs }) });
      return { status: r.status, cache: r.headers.get('x-cache'), rows: (await r.json()) as number[][] };
    };
    const rowsRun = async () => parseMetrics(await (await fetch(`${cached.url}/metrics`)).text()).sum('slabserve_batch_size_sum');
    const odd = texts.filter((_, i) => i % 2 === 1);
    expect((await post(odd)).status).toBe(200); // half of them cached now
    const before = await rowsRun();
    const all = await post(texts);
    expect(all.status).toBe(200);
    expect(all.cache).toBe('miss'); // not every input was found
    expect((await rowsRun()) - before).toBe(BIG / 2); // the even half ran; the odd half came from the cache
    let worst = 0;
    for (let i = 0; i < BIG; i++) {
      const want = await ref.embedding(tok.encode(texts[i]!, { maxLength: ref.spec.maxLength, truncate: false }).ids);
      worst = Math.max(worst, maxAbsDiff(all.rows[i]!, want));
    }
    expect(worst).toBeLessThan(1e-5);
    const again = await post(texts);
    expect(again.cache).toBe('hit');
    expect(again.rows).toEqual(all.rows);
  });
});
