/**
 * The lone wait (--lone-wait-us, src/core/lone-wait.ts): a gateway serving
 * a lone caller holds its thread for the answer to the only request in the
 * server, asleep in short slices until its batch starts, then until shortly
 * before the batch's predicted end, awake from there; never for several
 * callers, never past its bound.
 */
import { Worker } from 'node:worker_threads';
import { availableParallelism } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Doorbell } from '../dist/src/shared/doorbell.js';
import { LONE_STREAK, LoneWait } from '../dist/src/core/lone-wait.js';
import { OPTIONS } from '../dist/src/shared/options.js';

const MAX_LONE_WAIT_US = OPTIONS.loneWaitUs.max!;
import { Counter, type Slab } from '../dist/src/shared/slab.js';
import { nowMs } from '../dist/src/shared/clock.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { parseMetrics } from './fixtures/http-client.js';
import { expectCliRefuses } from './cli-process.js';
import { HARDWARE } from './fixtures/skips.js';
import type { TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { makeRandom, maxAbsDiff, openReference, randomTexts, type Reference, testServerConfig, vocabularyWords } from './helpers.js';

// Read by startServer: the inference hold below.
process.env.SLABSERVE_TEST_HOOKS = '1';

const MODEL = 'tiny-embed';
/** tiny-embed runs on one core: a machine of one core has none left for the wait's spin, and never holds. */
const CORE_FREE = availableParallelism() > 1;

/** What LoneWait reads of a slab: its counters and how many slots are taken. */
function fakeSlab(inUse: number, runCores = 1): Slab {
  const counters = new Float64Array(16);
  counters[Counter.RUN_CORES] = runCores;
  return { counters, slotsInUse: () => inUse } as unknown as Slab;
}

const newBell = () => new Doorbell(new Int32Array(new SharedArrayBuffer(4)), 0);

/** Rings `cells`' bell from another thread as soon as that thread runs. */
function ringFromAnotherThread(cells: Int32Array): Worker {
  return new Worker(
    `const { workerData } = require('node:worker_threads');
     const cells = new Int32Array(workerData.cells);
     Atomics.add(cells, 0, 1);
     Atomics.notify(cells, 0);`,
    { eval: true, workerData: { cells: cells.buffer } },
  );
}

describe('LoneWait', () => {
  it('applies only after LONE_STREAK requests in a row found nothing else in flight, to a request alone in its slab, whose run leaves a core free', () => {
    const wait = new LoneWait(newBell(), { maxUs: 1000 });
    const gpu = (inUse: number) => fakeSlab(inUse, 0); // a run that takes no core
    for (let i = 1; i < LONE_STREAK; i++) wait.submitted(gpu(1), false);
    expect(wait.applies()).toBe(false);
    wait.submitted(gpu(1), false);
    expect(wait.applies()).toBe(true);
    wait.submitted(gpu(2), false); // another request in the server
    expect(wait.applies()).toBe(false);
    wait.submitted(fakeSlab(1, availableParallelism() - 1), false); // a core left for the spin
    expect(wait.applies()).toBe(true);
    wait.submitted(fakeSlab(1, availableParallelism()), false); // the run takes every core
    expect(wait.applies()).toBe(false);
    wait.submitted(gpu(1), true); // a second caller: the streak starts again
    expect(wait.applies()).toBe(false);
  });

  it('never holds past its bound: a batch predicted to end later is slept on until the bound, then it returns false and reports it', () => {
    const outcomes: boolean[] = [];
    const sleeps: { ms: number; at: number }[] = [];
    const bell = newBell();
    const sleepFor = bell.sleep.bind(bell);
    bell.sleep = (seen: number, ms: number) => (sleeps.push({ ms, at: nowMs() }), sleepFor(seen, ms));
    const wait = new LoneWait(bell, { maxUs: 20_000, onWait: (a) => outcomes.push(a) });
    const slab = fakeSlab(1);
    slab.counters[Counter.BUSY_UNTIL] = nowMs() + 60_000; // a minute away
    const before = nowMs();
    wait.submitted(slab, false);
    expect(wait.wait(bell.read())).toBe(false);
    const after = nowMs();
    expect(outcomes).toEqual([false]);
    // It slept until its bound (20 ms after it began, which was between `before` and the first
    // sleep), never toward the predicted end, and returned only once the bound had passed: orderings
    // that hold however slow the machine is.
    expect(sleeps.length).toBeGreaterThan(0);
    for (const { ms } of sleeps) expect(ms).toBeLessThanOrEqual(20);
    expect(sleeps[0]!.ms).toBeGreaterThanOrEqual(before + 20 - sleeps[0]!.at);
    expect(after).toBeGreaterThanOrEqual(before + 20);
  });

  it('sleeps until shortly before the predicted end, then watches the bell until it rings', () => {
    // A bell that rings only on the 5th read after its sleep, and whose sleep returns at once with the
    // batch then due to end, as after a real sleep to WAKE_EARLY_MS before it: what the wait asks of it,
    // in order. After the sleep every read makes the batch due 50 µs ago (not yet overdue), whenever the
    // read comes: a stall of this thread (another test's load on the machine) cannot make it overdue
    // (slept on again), as a fixed prediction could.
    const calls: string[] = [];
    const sleeps: { ms: number; at: number }[] = [];
    let count = 0;
    let readsAfterSleep = -1;
    const slab = fakeSlab(1);
    const bell = {
      read: () => {
        calls.push('read');
        if (readsAfterSleep >= 0) {
          slab.counters[Counter.BUSY_UNTIL] = nowMs() - 0.05;
          if (++readsAfterSleep === 5) count++;
        }
        return count;
      },
      sleep: (_seen: number, ms: number) => {
        calls.push('sleep');
        sleeps.push({ ms, at: nowMs() });
        slab.counters[Counter.BUSY_UNTIL] = nowMs() - 0.05;
        readsAfterSleep = 0;
      },
    } as unknown as Doorbell;
    const wait = new LoneWait(bell, { maxUs: 60_000_000 }); // a minute: a hang bound
    // Predicted to end in a second (the fake sleep returns at once): far enough that no stall before the wait makes it overdue.
    const busyUntil = nowMs() + 1000;
    slab.counters[Counter.BUSY_UNTIL] = busyUntil;
    const before = nowMs();
    wait.submitted(slab, false);
    expect(wait.wait(0)).toBe(true);
    // One sleep, asked first thing, until WAKE_EARLY_MS (0.15) before the predicted end (the wait read
    // its clock between `before` and the sleep call); then reads until the ring.
    expect(calls.slice(0, 2)).toEqual(['read', 'sleep']);
    expect(sleeps).toHaveLength(1);
    expect(sleeps[0]!.ms).toBeLessThanOrEqual(busyUntil - 0.15 - before);
    expect(sleeps[0]!.ms).toBeGreaterThanOrEqual(busyUntil - 0.15 - sleeps[0]!.at);
    expect(calls.slice(2)).toEqual(['read', 'read', 'read', 'read', 'read']);
  });

  it('watches a batch that has not started only a moment, then sleeps on it in short slices; once it starts, until shortly before its predicted end', () => {
    // A bell whose sleeps return at once: the 3rd slice starts the batch (a minute to run), the 4th sleep rings.
    const slab = fakeSlab(1); // BUSY_UNTIL 0: its batch has not started
    const sleeps: number[] = [];
    let rung = 0;
    const bell = {
      read: () => rung,
      sleep: (_seen: number, ms: number) => {
        sleeps.push(ms);
        if (sleeps.length === 3) slab.counters[Counter.BUSY_UNTIL] = nowMs() + 60_000;
        if (sleeps.length === 4) rung = 1;
      },
    } as unknown as Doorbell;
    const wait = new LoneWait(bell, { maxUs: 1_000_000 }); // a second: a spin through the unstarted batch would use it all and return false
    wait.submitted(slab, false);
    expect(wait.wait(0)).toBe(true);
    expect(sleeps).toHaveLength(4);
    for (const ms of sleeps.slice(0, 3)) expect(ms).toBeLessThanOrEqual(0.1); // slices, the core left to the inference thread
    expect(sleeps[3]).toBeGreaterThan(100); // started: asleep toward its end (a minute off), up to the bound
  });

  it('sleeps on a batch overdue past its predicted end (something took its core), woken by the answer, instead of spinning to the bound', () => {
    // A bell whose sleeps return at once and whose first sleep rings: the wait's calls, in order.
    const calls: string[] = [];
    const sleeps: number[] = [];
    let rung = 0;
    const bell = {
      read: () => (calls.push('read'), rung),
      sleep: (_seen: number, ms: number) => {
        calls.push('sleep');
        sleeps.push(ms);
        rung = 1;
      },
    } as unknown as Doorbell;
    const slab = fakeSlab(1);
    slab.counters[Counter.BUSY_UNTIL] = nowMs() - 1; // predicted to end a millisecond ago
    const wait = new LoneWait(bell, { maxUs: 1_000_000 }); // a second: a spin would read the bell until then and return false
    wait.submitted(slab, false);
    expect(wait.wait(0)).toBe(true);
    expect(calls).toEqual(['read', 'sleep', 'read']);
    expect(sleeps[0]).toBeGreaterThan(900); // until the bound (1000 ms), not a slice
    expect(sleeps[0]).toBeLessThanOrEqual(1000);
  });

  it('returns when another thread rings its bell', async () => {
    const cells = new Int32Array(new SharedArrayBuffer(4));
    const bell = new Doorbell(cells, 0);
    const slab = fakeSlab(1);
    const outcomes: boolean[] = [];
    const wait = new LoneWait(bell, { maxUs: 60_000_000, onWait: (a) => outcomes.push(a) }); // a minute: a hang bound
    const seen = bell.read();
    slab.counters[Counter.BUSY_UNTIL] = nowMs() + 60_000; // predicted far off: it sleeps until the ring
    const ringer = ringFromAnotherThread(cells);
    await new Promise((resolve) => ringer.once('online', resolve));
    wait.submitted(slab, false);
    expect(wait.wait(seen)).toBe(true);
    expect(bell.read()).not.toBe(seen);
    expect(outcomes).toEqual([true]);
    await ringer.terminate();
  });
});

describe('--lone-wait-us on a server', () => {
  let server: Server;
  let texts: string[];
  let ref: Reference;
  let tok: TextTokenizer;

  beforeAll(async () => {
    server = await startServer(testServerConfig({ models: [MODEL], loneWaitUs: 50_000, heartbeatTimeoutMs: 60_000 }));
    await server.ready;
    ({ ref, tok } = await openReference(MODEL));
    texts = randomTexts(makeRandom('lone-wait'), vocabularyWords(ref.spec), 3 * LONE_STREAK, 30);
  }, 60_000);

  afterAll(async () => {
    await server?.close();
    await ref?.close();
  });

  const loneWaits = async () => {
    const m = parseMetrics(await (await fetch(server.url + '/metrics')).text());
    return { answered: m.sum('slabserve_gateway_lone_waits_total', { outcome: 'answered' }), released: m.sum('slabserve_gateway_lone_waits_total', { outcome: 'released' }) };
  };

  const embed = async (inputs: string | string[]): Promise<number[][]> => {
    const r = await fetch(server.url + '/embed', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs }) });
    expect(r.status).toBe(200);
    return (await r.json()) as number[][];
  };

  it('holds the gateway for a lone caller from its LONE_STREAK-th request on; its rows are the reference', { timeout: 60_000 }, async () => {
    const before = await loneWaits();
    const rows: number[][] = [];
    for (const text of texts) rows.push((await embed(text))[0]!);
    const after = await loneWaits();
    // From the LONE_STREAK-th on, each is held unless its answer came before the gateway came to wait
    // (it waits after the turn that submitted it: on a busy machine that turn can take as long); none
    // before. A 50 ms bound: only a stall releases one.
    const lone = CORE_FREE ? texts.length - LONE_STREAK + 1 : 0;
    const holds = after.answered + after.released - before.answered - before.released;
    expect(holds).toBeLessThanOrEqual(lone);
    expect(holds).toBeGreaterThanOrEqual(lone / 2);
    expect(after.answered - before.answered).toBeGreaterThanOrEqual(0.9 * holds);
    // Each held answer is its text's reference row (the unmodified graph run alone, pooled by the test).
    for (const [i, text] of texts.entries()) expect(maxAbsDiff(rows[i]!, (await ref.rowOfText(tok, text)).slice(0, ref.spec.dimension)), `text ${i}`).toBeLessThan(1e-5);
  });

  it('holds it for few requests of several callers that overlap', { timeout: 60_000 }, async () => {
    const before = await loneWaits();
    // Eight callers at once: every request meets others in flight (the result cache answers repeats, so each is new).
    const callers = Array.from({ length: 8 }, (_, c) => (async () => {
      for (let i = 0; i < 6; i++) await embed(`${texts[(c * 6 + i) % texts.length]} caller ${c} round ${i}`);
    })());
    await Promise.all(callers);
    const after = await loneWaits();
    // The first of them finds the server empty and is held; the others arrive during its hold, and
    // the second read after it already overlaps: the streak ends, and a few holds at most are left.
    expect(after.answered + after.released - before.answered - before.released).toBeLessThanOrEqual(8);
  });

  it('lets the gateway go after the bound: a held request is answered once the device runs it', { timeout: 60_000 }, async (ctx) => {
    if (!CORE_FREE) ctx.skip(`${HARDWARE} a second core (the inference thread spins on the one there is)`);
    for (let i = 0; i < LONE_STREAK; i++) await embed(`${texts[i]} again ${i}`); // a lone caller again
    const before = await loneWaits();
    await server.testHooks!.holdInference();
    let settled = false;
    const pending = embed('a request the device does not run yet').finally(() => (settled = true));
    try {
      // The gateway holds itself 50 ms at most, then serves: /health answers while the request waits.
      const health = await fetch(server.url + '/health');
      expect(health.status).toBe(200);
      expect((await loneWaits()).released).toBe(before.released + 1);
      expect(settled).toBe(false); // the device has not run it: held, it cannot be answered
    } finally {
      server.testHooks!.releaseInference();
    }
    expect((await pending)[0]!.length).toBeGreaterThan(0);
  });
});

describe('--lone-wait-us range', () => {
  it('refuses a bound out of range: startServer, the flag and SLABSERVE_LONE_WAIT_US', async () => {
    await expect(startServer(testServerConfig({ models: [MODEL], loneWaitUs: MAX_LONE_WAIT_US + 1 }))).rejects.toThrow(/loneWaitUs must be an integer from 0 to 100000, got 100001/);
    expectCliRefuses(
      [
        [['--lone-wait-us', String(MAX_LONE_WAIT_US + 1)], {}],
        [['--lone-wait-us', '-1'], {}],
        [[], { SLABSERVE_LONE_WAIT_US: 'long' }],
      ],
      /--lone-wait-us .*expected an integer from 0 to 100000/,
    );
  });
});
