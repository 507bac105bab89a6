/**
 * The inference hold (SLABSERVE_TEST_HOOKS=1: server.testHooks.holdInference),
 * which every batching proof relies on (test/fixtures/queued-together.ts), on
 * a real server: held, the loop takes nothing in and runs nothing; released,
 * everything sent meanwhile meets the scheduler at once and runs in exactly
 * the batches its buckets make. A hold outlasts an inference-thread restart,
 * and closing the server lets it go.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import type { BatchingOptions } from '../dist/src/gpu-worker/scheduler.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { parseMetrics, type Metrics } from './fixtures/http-client.js';
import { batchesOfQueued, sentTogether, servedBatching } from './fixtures/queued-together.js';
import { eventually, makeRandom, randomTexts, Reference, testServerConfig, vocabularyWords } from './helpers.js';

// Read by startServer: this file's servers carry the test hooks.
process.env.SLABSERVE_TEST_HOOKS = '1';

const MODEL = 'tiny-embed';
const BATCHING = { buckets: [16, 32, 64, 128], maxBatchSize: 8 };

let server: Server;
let batching: BatchingOptions;
let tok: TextTokenizer;
let words: string[];

beforeAll(async () => {
  // A short heartbeat timeout: the restart below comes quickly.
  server = await startServer(testServerConfig({ models: [MODEL], batching: BATCHING, heartbeatTimeoutMs: 2000 }));
  await server.ready;
  const ref = await Reference.open(MODEL);
  tok = await loadTokenizer(ref.spec.tokenizerPath);
  words = vocabularyWords(ref.spec);
  await ref.close();
  batching = await servedBatching(server.url, MODEL);
}, 60_000);

afterAll(async () => {
  await server?.close();
});

async function metrics(): Promise<Metrics> {
  return parseMetrics(await (await fetch(server.url + '/metrics')).text());
}

const batchesRun = (m: Metrics) => m.sum('slabserve_batch_size_count', { model: MODEL });

async function embed(text: string): Promise<number> {
  const r = await fetch(server.url + '/embed', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: text }) });
  await r.arrayBuffer();
  return r.status;
}

/** Fresh texts, and their token lengths. */
function textsOf(label: string, count: number): { texts: string[]; lengths: number[] } {
  const texts = randomTexts(makeRandom(label), words, count, 40);
  return { texts, lengths: texts.map((t) => tok.encode(t, { maxLength: 128, truncate: false }).ids.length) };
}

describe('the inference hold', () => {
  it('held: nothing is taken in or run, and scrapes still answer; released: every request 200, in exactly the batches its buckets make', async () => {
    const hooks = server.testHooks!;
    expect(await embed('a first request, so the batch count is on /metrics')).toBe(200);
    const { texts, lengths } = textsOf('hold', 40);
    const before = batchesRun(await metrics());
    await hooks.holdInference();
    let answered = 0;
    let sent: Promise<number[]>;
    try {
      sent = Promise.all(texts.map((t) => embed(t).finally(() => answered++)));
      await eventually('every input waiting for the held loop', async () => hooks.inputsWaiting(MODEL), (n) => n === texts.length);
      // Held on: each scrape is answered by the parked inference thread (it goes round its park loop), and nothing ran meanwhile.
      for (let scrape = 0; scrape < 3; scrape++) {
        expect(batchesRun(await metrics())).toBe(before);
        expect(hooks.inputsWaiting(MODEL)).toBe(texts.length);
        expect(answered).toBe(0);
      }
    } finally {
      hooks.releaseInference();
    }
    expect(await sent).toEqual(texts.map(() => 200));
    const ran = batchesRun(await metrics()) - before;
    console.log(`hold: ${texts.length} requests in ${ran} batches`);
    expect(ran).toBe(batchesOfQueued(lengths, batching));
    expect(ran).toBeLessThan(texts.length);
    expect(hooks.inputsWaiting(MODEL)).toBe(0);
  });

  it('sentTogether: the same, as the batching proofs use it', async () => {
    const { texts, lengths } = textsOf('sent together', 24);
    const before = batchesRun(await metrics());
    const statuses = await sentTogether(server.testHooks, { [MODEL]: texts.length }, () => Promise.all(texts.map(embed)));
    expect(statuses).toEqual(texts.map(() => 200));
    expect(batchesRun(await metrics()) - before).toBe(batchesOfQueued(lengths, batching));
  });

  it('outlasts an inference-thread restart: the replacement parks too, until released', { timeout: 40_000 }, async () => {
    const hooks = server.testHooks!;
    const restarts = async () => (await metrics()).sum('slabserve_inference_restarts_total');
    const restartsBefore = await restarts();
    await hooks.holdInference();
    try {
      await hooks.inferenceFault('stall'); // the parked thread blocks: its heartbeat stops, the watchdog replaces it
      await eventually('restarted', restarts, (n) => n === restartsBefore + 1);
      await eventually('ready again', () => fetch(server.url + '/readyz').then((r) => r.status), (s) => s === 200);
      await hooks.holdInference(); // resolves once the replacement has parked
      const { texts, lengths } = textsOf('hold over a restart', 16);
      const before = batchesRun(await metrics());
      const statuses = await sentTogether(hooks, { [MODEL]: texts.length }, () => Promise.all(texts.map(embed)));
      expect(statuses).toEqual(texts.map(() => 200));
      expect(batchesRun(await metrics()) - before).toBe(batchesOfQueued(lengths, batching));
    } finally {
      hooks.releaseInference();
    }
  });

  it('closing a held server lets the loop go: close resolves, and the request it held is answered', { timeout: 40_000 }, async () => {
    const held = await startServer(testServerConfig({ models: [MODEL], batching: BATCHING, drainTimeoutMs: 500 }));
    await held.ready;
    await held.testHooks!.holdInference();
    const answer = fetch(held.url + '/embed', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: 'held at close' }) }).then(
      (r) => r.status,
      () => 'connection closed',
    );
    await eventually('waiting', async () => held.testHooks!.inputsWaiting(MODEL), (n) => n === 1);
    await held.close();
    // Answered, not dropped: run once the hold is let go (200), or refused by the drain's end (503).
    const got = await answer;
    console.log(`the request held at close: ${got}`);
    expect([200, 503]).toContain(got);
  });
});
