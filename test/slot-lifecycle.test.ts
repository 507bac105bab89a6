// Slot life cycle end to end, against the built code: the real SlabSubmitter on
// this thread, the real InferenceLoop on a worker thread
// (fixtures/fake-inference-worker.mjs) with fake runners, real slabs and the
// real ControlBlock. Every request carries a unique tag in ids[0]; the fake
// runner answers with a function of the slot's own ids and records, in shared
// memory, which tags it ran and in which batch.
//
// Each rig draws its requests from a seeded generator and prints `<label>: seed S`;
// SLABSERVE_TEST_SEED=S npx vitest run test/slot-lifecycle.test.ts -t "<test name>"
// draws the same requests again (the threads' interleaving still varies).
import { Worker } from 'node:worker_threads';
import { afterEach, describe, expect, it } from 'vitest';
import type { BatchingOptions } from '../dist/src/gpu-worker/scheduler.js';
import { ControlBlock } from '../dist/src/shared/control.js';
import {
  CancelledError,
  DeadlineExceededError,
  EngineClosedError,
  InferenceError,
  OverloadedError,
} from '../dist/src/shared/errors.js';
import { Counter, Slab, SlotState, type SlabLayout } from '../dist/src/shared/slab.js';
import { SlabSubmitter, type SlotResult } from '../dist/src/core/submitter.js';
import { mulberry32 } from '../dist/models/generator/rng.js';

const fixture = new URL('./fixtures/fake-inference-worker.mjs', import.meta.url);

// Same constants and stats layout as the fixture.
const POISON = 999_999;
const HOLD = 999_998;
const S_BATCHES = 0;
const S_ROWS = 1;
const S_VIOLATIONS = 2;
const S_HOLDING = 3;
const S_RELEASE = 4;
const S_POISONED = 5;
const S_MAX_ROWS = 6;
const HDR = 16;
const TAGS = 16_384;

/**
 * A rig's seed: SLABSERVE_TEST_SEED when set, else a fresh one; printed, so that a failure can be
 * replayed (what test/helpers.ts makeRandom does for a generator; the rig also hands its seed to the
 * second owner thread, so it needs the number).
 */
function rigSeed(label: string): number {
  const seed = Number(process.env.SLABSERVE_TEST_SEED ?? Math.floor(Math.random() * 2 ** 31)) >>> 0;
  console.log(`${label}: seed ${seed}`);
  return seed;
}

/** Guards every await on another thread: a hang fails the test with a name instead of timing it out. */
const HANG_MS = 15_000;

function expectedRow(ids: readonly number[], typeIds: readonly number[], model: number, width: number): Float32Array {
  let sum = 0;
  let weighted = 0;
  let types = 0;
  for (let i = 0; i < ids.length; i++) {
    sum += ids[i]!;
    weighted = (weighted + (i + 1) * ids[i]!) % 65_521;
    types += (i + 1) * typeIds[i]!;
  }
  const row = new Float32Array(width);
  const vals = [sum, ids.length + 100 * model, ids[0]!, weighted, types];
  for (let k = 0; k < Math.min(width, vals.length); k++) row[k] = vals[k]!;
  return row;
}


const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const tick = () => new Promise<void>((r) => setImmediate(r));

interface Req {
  tag: number;
  model: number;
  ids: number[];
  typeIds: number[];
}

interface RigOptions {
  models: { layout: Omit<SlabLayout, 'owners'>; batching: BatchingOptions }[];
  owners?: number;
  maxInflightBatches: number;
  delayMs?: [number, number];
  /** Busy time (random, up to this) in each run() before its first await. */
  spinMs?: number;
}

class Rig {
  readonly slabs: Slab[];
  readonly control: ControlBlock;
  readonly stats = new Int32Array(new SharedArrayBuffer((HDR + 3 * TAGS) * 4));
  readonly sub: SlabSubmitter;
  readonly worker: Worker;
  readonly violations: string[] = [];
  readonly stopped: Promise<void>;
  readonly exited: Promise<number>;
  /** Rejects if the inference thread crashes or exits before being told to stop. */
  readonly failed: Promise<never>;
  readonly rand: () => number;
  readonly seed: number;
  private nextTag = 0;
  private stopping = false;

  constructor(label: string, readonly opts: RigOptions) {
    const seed = rigSeed(label);
    this.seed = seed;
    this.rand = mulberry32(seed);
    const owners = opts.owners ?? 1;
    this.slabs = opts.models.map((m) => Slab.create({ ...m.layout, owners }));
    this.control = ControlBlock.create(owners);
    this.sub = new SlabSubmitter(this.slabs, this.control, 0);
    this.worker = new Worker(fixture, {
      workerData: {
        role: 'loop',
        control: this.control.buffer,
        owners,
        models: this.slabs.map((s, i) => ({ slab: s.buffer, layout: s.layout, batching: opts.models[i]!.batching })),
        maxInflightBatches: opts.maxInflightBatches,
        delayMs: opts.delayMs ?? [0, 2],
        spinMs: opts.spinMs ?? 0,
        stats: this.stats.buffer,
        tagCapacity: TAGS,
      },
    });
    // Listeners go on at creation: the thread may exit before anyone awaits it.
    let onStopped!: () => void;
    this.stopped = new Promise((r) => (onStopped = r));
    let onFailed!: (e: Error) => void;
    this.failed = new Promise<never>((_, rej) => (onFailed = rej));
    this.failed.catch(() => {});
    this.worker.on('message', (m: { type: string; detail?: string }) => {
      if (m.type === 'stopped') onStopped();
      if (m.type === 'violation') this.violations.push(m.detail!);
    });
    this.worker.on('error', (e) => onFailed(e));
    this.exited = new Promise((r) =>
      this.worker.on('exit', (code) => {
        if (!this.stopping || code !== 0) onFailed(new Error(`inference thread exited (code ${code}) before it was stopped`));
        r(code);
      }),
    );
    live.add(this);
  }

  /** Awaits `p`, failing fast if the inference thread dies and loudly if nothing happens for HANG_MS. */
  async guard<T>(p: Promise<T>, what: string): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    const hang = new Promise<never>((_, rej) => {
      timer = setTimeout(() => rej(new Error(`hang: ${what} (seed ${this.seed})`)), HANG_MS);
    });
    try {
      return await Promise.race([p, this.failed, hang]);
    } finally {
      clearTimeout(timer);
    }
  }

  req(model: number, opts: { len?: number; minLen?: number; maxLen?: number; poison?: boolean; hold?: boolean } = {}): Req {
    const maxLength = this.slabs[model]!.layout.maxLength;
    const lo = opts.minLen ?? 1;
    const hi = opts.maxLen ?? maxLength;
    const len = opts.len ?? lo + Math.floor(this.rand() * (hi - lo + 1));
    const tag = this.nextTag++;
    if (tag >= TAGS) throw new Error('out of request tags');
    const ids = Array.from({ length: len }, (_, i) => (i === 0 ? tag : 1 + Math.floor(this.rand() * 20_000)));
    const typeIds = Array.from({ length: len }, () => (this.rand() < 0.5 ? 0 : 1));
    const special = opts.poison ? POISON : opts.hold ? HOLD : 0;
    if (special) {
      if (len < 2) throw new Error('a poison or hold request needs two tokens');
      ids[1 + Math.floor(this.rand() * (len - 1))] = special;
    }
    return { tag, model, ids, typeIds };
  }

  submit(r: Req, opts: { deadline?: number; signal?: AbortSignal } = {}): Promise<SlotResult> {
    return this.sub.submit(r.model, r.ids, r.typeIds, { deadline: opts.deadline ?? Date.now() + 60_000, ...(opts.signal ? { signal: opts.signal } : {}) });
  }

  /** Submits, retrying while every slot is taken; counts the refusals in `overloads`. */
  async submitRetry(r: Req, tally: { overloads: number }, opts: { deadline?: number } = {}): Promise<SlotResult> {
    for (;;) {
      try {
        return await this.submit(r, opts);
      } catch (err) {
        if (!(err instanceof OverloadedError)) throw err;
        tally.overloads++;
        await sleep(1);
      }
    }
  }

  correct(r: Req, res: SlotResult): boolean {
    const want = expectedRow(r.ids, r.typeIds, r.model, this.slabs[r.model]!.layout.outputWidth);
    return res.output.length === want.length && want.every((v, k) => v === res.output[k]);
  }

  ran(tag: number): number {
    return Atomics.load(this.stats, HDR + tag);
  }

  batchOf(tag: number): number {
    return Atomics.load(this.stats, HDR + TAGS + tag);
  }

  batchPoisoned(batch: number): boolean {
    return Atomics.load(this.stats, HDR + 2 * TAGS + batch) === 1;
  }

  /** Resolves once `n` HOLD batches have reached the gate (and are parked there). */
  async holding(n: number): Promise<void> {
    const wait = async () => {
      for (let v = Atomics.load(this.stats, S_HOLDING); v < n; v = Atomics.load(this.stats, S_HOLDING)) {
        const w = Atomics.waitAsync(this.stats, S_HOLDING, v, 100);
        if (w.async) await w.value;
      }
    };
    await this.guard(wait(), `a HOLD batch to reach the gate`);
  }

  release(): void {
    Atomics.add(this.stats, S_RELEASE, 1);
    Atomics.notify(this.stats, S_RELEASE);
  }

  counter(c: number, model = 0): number {
    return this.slabs[model]!.counters[c]!;
  }

  requestStop(): void {
    this.stopping = true;
    this.control.requestStop();
  }

  async stop(): Promise<void> {
    this.requestStop();
    await this.guard(this.stopped, 'the inference loop to stop');
    await this.guard(this.exited, 'the inference thread to exit');
    live.delete(this);
  }

  /** After a failed test: let parked batches go, stop, and terminate if the thread does not exit. */
  async dispose(): Promise<void> {
    this.stopping = true;
    this.release();
    this.control.requestStop();
    const gone = await Promise.race([this.exited.then(() => true), sleep(2_000).then(() => false)]);
    if (!gone) await this.worker.terminate();
    live.delete(this);
  }

  /** Every slot FREE, every queue empty, each slot index exactly once on the free list. Call once the loop is idle or stopped. */
  expectClean(): void {
    expect(this.violations, `seed ${this.seed}`).toEqual([]);
    expect(Atomics.load(this.stats, S_VIOLATIONS)).toBe(0);
    expect(this.sub.pendingCount).toBe(0);
    for (const slab of this.slabs) {
      expect(slab.slotsInUse(), `seed ${this.seed}`).toBe(0);
      const states = Array.from({ length: slab.layout.slotCount }, (_, s) => slab.state(s));
      expect(states.filter((s) => s !== SlotState.FREE), `states ${states}`).toEqual([]);
      expect(slab.submit.pop()).toBe(-1);
      for (const q of slab.completions) expect(q.pop()).toBe(-1);
      const popped: number[] = [];
      for (let s = slab.free.pop(); s !== -1; s = slab.free.pop()) popped.push(s);
      expect(popped.sort((a, b) => a - b)).toEqual(Array.from({ length: slab.layout.slotCount }, (_, i) => i));
      for (const s of popped) slab.free.push(s);
    }
  }
}

const live = new Set<Rig>();
/** Other threads a test started; terminated after it whatever happened. */
const stray = new Set<Worker>();
afterEach(async () => {
  for (const rig of [...live]) await rig.dispose();
  for (const w of stray) await w.terminate();
  stray.clear();
});

const BATCHING: BatchingOptions = { maxBatchSize: 8, maxBatchDelayMs: 1, maxBatchTokens: 256, buckets: [8, 16, 32] };
const LAYOUT = { slotCount: 16, maxLength: 32, outputWidth: 5 };

type Outcome = { kind: 'ok'; res: SlotResult } | { kind: 'err'; err: unknown };
const outcome = (p: Promise<SlotResult>): Promise<Outcome> =>
  p.then(
    (res) => ({ kind: 'ok', res }),
    (err: unknown) => ({ kind: 'err', err }),
  );

/** Runs `work` for every item with at most `clients` at once. */
async function pool<T>(items: T[], clients: number, work: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: clients }, async () => {
      while (next < items.length) await work(items[next++]!);
    }),
  );
}

describe('slot life cycle: submitter <-> inference loop over shared slabs', () => {
  it('many concurrent requests over few slots, two owners, two models: each gets the answer to its own ids, and every slot comes back once', { timeout: 30_000 }, async () => {
    const rig = new Rig('slot-lifecycle concurrent', {
      models: [
        { layout: LAYOUT, batching: BATCHING },
        { layout: { slotCount: 8, maxLength: 16, outputWidth: 4 }, batching: { ...BATCHING, buckets: [8, 16] } },
      ],
      owners: 2,
      maxInflightBatches: 2,
    });
    // A second owner thread on the same slabs (its own completion queue and doorbell).
    const ownerCount = 500;
    const owner = new Worker(fixture, {
      workerData: {
        role: 'owner',
        owner: 1,
        owners: 2,
        control: rig.control.buffer,
        models: rig.slabs.map((s) => ({ slab: s.buffer, layout: s.layout })),
        count: ownerCount,
        tagBase: 10_000,
        clients: 12,
        seed: rig.seed ^ 0x5bd1e995,
      },
    });
    stray.add(owner);
    const ownerExit = new Promise<number>((r) => owner.on('exit', r));
    const ownerDone = new Promise<Record<string, unknown>>((resolve, reject) => {
      owner.on('message', (m: { type: string }) => m.type === 'owner-done' && resolve(m as Record<string, unknown>));
      owner.on('error', reject);
      void ownerExit.then((code) => reject(new Error(`owner thread exited (code ${code}) without reporting`)));
    });

    const N = 2_000;
    const reqs = Array.from({ length: N }, (_, i) => rig.req(i % 5 === 4 ? 1 : 0));
    const tally = { overloads: 0 };
    const results = new Map<number, Outcome>();
    let settlements = 0;
    // Waves of 200, each wave more requests than slots, submitted by 40 concurrent clients.
    for (let w = 0; w < N; w += 200) {
      await rig.guard(
        pool(reqs.slice(w, w + 200), 40, async (r) => {
          const o = await outcome(rig.submitRetry(r, tally));
          settlements++;
          expect(results.has(r.tag)).toBe(false);
          results.set(r.tag, o);
        }),
        `wave ${w / 200}`,
      );
    }
    const other = await rig.guard(ownerDone, 'the second owner');
    await rig.guard(ownerExit, 'the second owner to exit');

    expect(settlements).toBe(N);
    const wrong: number[] = [];
    for (const r of reqs) {
      const o = results.get(r.tag)!;
      if (o.kind === 'err') throw new Error(`request ${r.tag} failed: ${String(o.err)} (seed ${rig.seed})`);
      if (!rig.correct(r, o.res)) wrong.push(r.tag);
      expect(rig.ran(r.tag)).toBe(1);
    }
    expect(wrong, `requests answered with another request's row (seed ${rig.seed})`).toEqual([]);
    // The check can fail: outputs differ from request to request, and from a neighbour's expected row.
    const distinct = new Set(reqs.map((r) => (results.get(r.tag) as { res: SlotResult }).res.output.join(',')));
    expect(distinct.size).toBe(N);
    const [a, b] = [reqs[0]!, reqs[1]!];
    expect(rig.correct(a, (results.get(b.tag) as { res: SlotResult }).res)).toBe(false);

    expect(other).toMatchObject({ type: 'owner-done', ok: ownerCount, wrong: [], errors: {}, pending: 0 });
    for (let t = 10_000; t < 10_000 + ownerCount; t++) expect(rig.ran(t)).toBe(1);
    // The free lists really cycled under pressure, and the loop really batched.
    expect(tally.overloads).toBeGreaterThan(0);
    const rows = rig.counter(Counter.ROWS, 0) + rig.counter(Counter.ROWS, 1);
    expect(rows).toBe(N + ownerCount);
    expect(Atomics.load(rig.stats, S_ROWS)).toBe(N + ownerCount);
    expect(Atomics.load(rig.stats, S_MAX_ROWS)).toBeGreaterThan(1);
    const realTokens = reqs.reduce((s, r) => s + r.ids.length, 0);
    expect(rig.counter(Counter.REAL_TOKENS, 0) + rig.counter(Counter.REAL_TOKENS, 1)).toBeGreaterThan(realTokens);
    expect(rig.counter(Counter.FAILED_BATCHES) + rig.counter(Counter.CANCELLED_SKIPPED) + rig.counter(Counter.DROPPED_EXPIRED)).toBe(0);

    await rig.stop();
    rig.expectClean();
  });

  it('cancellation racing completion: each request resolves with its own row or rejects CancelledError, and no slot leaks', { timeout: 30_000 }, async () => {
    const rig = new Rig('slot-lifecycle cancellation', { models: [{ layout: LAYOUT, batching: BATCHING }], maxInflightBatches: 3, spinMs: 1 });
    const N = 3_000;
    const modes = ['pre', 'sync', 'micro', 'immediate', 'timer', 'after', 'never'] as const;
    type Mode = (typeof modes)[number];
    const weights = [5, 20, 10, 15, 25, 15, 10];
    const pick = (): Mode => {
      let x = rig.rand() * 100;
      for (let i = 0; i < modes.length; i++) if ((x -= weights[i]!) < 0) return modes[i]!;
      return 'never';
    };
    const reqs = Array.from({ length: N }, () => ({ r: rig.req(0), mode: pick(), delay: rig.rand() * 3 }));
    const got = new Map<number, Outcome>();
    const tally = { overloads: 0 };

    await rig.guard(
      pool(reqs, 24, async ({ r, mode, delay }) => {
        for (;;) {
          const ac = new AbortController();
          if (mode === 'pre') ac.abort();
          const p = outcome(rig.submit(r, { signal: ac.signal }));
          if (mode === 'sync') ac.abort();
          else if (mode === 'micro') queueMicrotask(() => ac.abort());
          else if (mode === 'immediate') setImmediate(() => ac.abort());
          else if (mode === 'timer') setTimeout(() => ac.abort(), delay);
          const o = await p;
          if (mode === 'after') ac.abort(); // settled already: must change nothing
          if (o.kind === 'err' && o.err instanceof OverloadedError) {
            tally.overloads++;
            await sleep(1);
            continue;
          }
          expect(got.has(r.tag)).toBe(false);
          got.set(r.tag, o);
          return;
        }
      }),
      'cancel storm',
    );
    expect(got.size).toBe(N);

    const count: Record<string, number> = {};
    const bump = (k: string) => (count[k] = (count[k] ?? 0) + 1);
    for (const { r, mode } of reqs) {
      const o = got.get(r.tag)!;
      const ran = rig.ran(r.tag);
      if (o.kind === 'ok') {
        if (!rig.correct(r, o.res)) throw new Error(`request ${r.tag} (${mode}) got another row (seed ${rig.seed})`);
        expect(ran).toBe(1);
        bump('ok');
        if (mode !== 'never' && mode !== 'after') bump('ok-despite-abort');
      } else {
        if (!(o.err instanceof CancelledError)) throw new Error(`request ${r.tag} (${mode}) rejected with ${String(o.err)} (seed ${rig.seed})`);
        expect(o.err.code).toBe('SLABSERVE_CANCELLED');
        expect(['never', 'after']).not.toContain(mode);
        expect(ran).toBeLessThanOrEqual(1);
        if (mode === 'pre') {
          expect(ran).toBe(0);
          bump('cancelled-pre');
        } else bump(ran === 0 ? 'cancelled-before-run' : 'cancelled-after-run');
      }
    }
    // Both sides of the race happened: cancels that kept a request off the device,
    // cancels that came after it ran, and aborts too late to matter.
    expect(count['cancelled-pre'] ?? 0).toBeGreaterThan(0);
    expect(count['cancelled-before-run'] ?? 0).toBeGreaterThan(0);
    expect(count['cancelled-after-run'] ?? 0).toBeGreaterThan(0);
    expect(count['ok-despite-abort'] ?? 0).toBeGreaterThan(0);
    expect(tally.overloads).toBeGreaterThan(0);

    // Stopping lets the loop free the cancelled slots still in its queues or in running batches.
    await rig.stop();
    const skipped = rig.counter(Counter.CANCELLED_SKIPPED);
    const cancelledInSlab = (count['cancelled-before-run'] ?? 0) + (count['cancelled-after-run'] ?? 0);
    // Each cancelled slot is freed exactly once: by the loop (counted) or by its owner (result already written).
    expect(skipped).toBeGreaterThanOrEqual(count['cancelled-before-run']!);
    expect(skipped).toBeLessThanOrEqual(cancelledInSlab);
    // ...and some were freed by their owner: cancelled after the result was written (DONE, not yet drained).
    expect(cancelledInSlab - skipped).toBeGreaterThan(0);
    expect(rig.counter(Counter.ROWS)).toBe(Atomics.load(rig.stats, S_ROWS));
    rig.expectClean();
  });

  it('a poisoned batch fails exactly the requests batched with it, and the loop goes on', { timeout: 30_000 }, async () => {
    const rig = new Rig('slot-lifecycle poisoned batch', { models: [{ layout: { ...LAYOUT, slotCount: 32 }, batching: BATCHING }], maxInflightBatches: 1, delayMs: [0, 1] });

    // Deterministic part: park a batch on the device, queue 16 short requests
    // (two batches of 8) with poison in the first eight, then let it go.
    const hold = rig.req(0, { len: 20, hold: true });
    const held = outcome(rig.submit(hold));
    await rig.holding(1);
    const burst = Array.from({ length: 16 }, (_, i) => rig.req(0, { minLen: 2, maxLen: 8, poison: i === 3 }));
    const burstOut = burst.map((r) => outcome(rig.submit(r)));
    rig.release();
    const outs = await rig.guard(Promise.all([held, ...burstOut]), 'the poisoned burst');
    expect(outs[0]!.kind === 'ok' && rig.correct(hold, outs[0].res)).toBe(true);
    outs.slice(1).forEach((o, i) => {
      if (i < 8) {
        expect(o.kind).toBe('err');
        const err = (o as { err: unknown }).err;
        expect(err).toBeInstanceOf(InferenceError);
        expect((err as InferenceError).code).toBe('SLABSERVE_INFERENCE_FAILED');
        expect(rig.batchOf(burst[i]!.tag)).toBe(rig.batchOf(burst[3]!.tag));
      } else {
        expect(o.kind === 'ok' && rig.correct(burst[i]!, o.res)).toBe(true);
        expect(rig.batchPoisoned(rig.batchOf(burst[i]!.tag))).toBe(false);
      }
    });
    expect(rig.counter(Counter.FAILED_BATCHES)).toBe(1);

    // Random part: 3% poison under load; a request fails iff its batch held poison.
    const reqs = Array.from({ length: 600 }, () => rig.req(0, { minLen: 2, poison: rig.rand() < 0.03 }));
    const got = new Map<number, Outcome>();
    const tally = { overloads: 0 };
    await rig.guard(
      pool(reqs, 24, async (r) => {
        got.set(r.tag, await outcome(rig.submitRetry(r, tally)));
      }),
      'poison under load',
    );
    for (const r of reqs) {
      const o = got.get(r.tag)!;
      expect(rig.ran(r.tag)).toBe(1);
      const poisonedBatch = rig.batchPoisoned(rig.batchOf(r.tag));
      if (r.ids.includes(POISON)) expect(poisonedBatch).toBe(true);
      if (poisonedBatch) {
        expect(o.kind === 'err' && o.err instanceof InferenceError, `request ${r.tag} (seed ${rig.seed})`).toBe(true);
      } else {
        expect(o.kind === 'ok' && rig.correct(r, o.res), `request ${r.tag} (seed ${rig.seed})`).toBe(true);
      }
    }
    const poisoned = reqs.filter((r) => r.ids.includes(POISON)).length;
    expect(poisoned).toBeGreaterThan(0);
    expect(rig.counter(Counter.FAILED_BATCHES)).toBe(Atomics.load(rig.stats, S_POISONED));

    // Afterwards everything works again.
    const after = Array.from({ length: 100 }, () => rig.req(0));
    const afterOut = await rig.guard(Promise.all(after.map((r) => outcome(rig.submitRetry(r, tally)))), 'requests after the failures');
    afterOut.forEach((o, i) => expect(o.kind === 'ok' && rig.correct(after[i]!, o.res)).toBe(true));

    await rig.stop();
    rig.expectClean();
  });

  it('requests whose deadline has passed reject DeadlineExceededError and never reach the runner', { timeout: 30_000 }, async () => {
    const rig = new Rig('slot-lifecycle deadline', { models: [{ layout: { ...LAYOUT, slotCount: 32 }, batching: BATCHING }], maxInflightBatches: 1 });

    // Expiring while queued: behind a parked batch, deadlines 25 ms out; released once they have passed.
    const hold = rig.req(0, { len: 20, hold: true });
    const held = outcome(rig.submit(hold));
    await rig.holding(1);
    const soon = Array.from({ length: 10 }, () => rig.req(0, { maxLen: 8 }));
    const later = Array.from({ length: 5 }, () => rig.req(0, { maxLen: 8 }));
    const soonOut = soon.map((r) => outcome(rig.submit(r, { deadline: Date.now() + 25 })));
    const laterOut = later.map((r) => outcome(rig.submit(r)));
    await sleep(60);
    rig.release();
    const [h, ...rest] = await rig.guard(Promise.all([held, ...soonOut, ...laterOut]), 'queued requests with deadlines');
    expect(h!.kind === 'ok' && rig.correct(hold, h.res)).toBe(true);
    rest.forEach((o, i) => {
      if (i < soon.length) {
        expect(o.kind === 'err' && o.err instanceof DeadlineExceededError).toBe(true);
        expect((o as { err: DeadlineExceededError }).err.code).toBe('SLABSERVE_DEADLINE_EXCEEDED');
        expect(rig.ran(soon[i]!.tag)).toBe(0);
      } else {
        const r = later[i - soon.length]!;
        expect(o.kind === 'ok' && rig.correct(r, o.res)).toBe(true);
      }
    });
    expect(rig.counter(Counter.DROPPED_EXPIRED)).toBe(soon.length);

    // Already past when submitted, mixed with live requests under load.
    const reqs = Array.from({ length: 400 }, () => ({ r: rig.req(0), past: rig.rand() < 0.4 }));
    const got = new Map<number, Outcome>();
    const tally = { overloads: 0 };
    await rig.guard(
      pool(reqs, 24, async ({ r, past }) => {
        const deadline = past ? Date.now() - 1_000 - rig.rand() * 1_000 : Date.now() + 60_000;
        got.set(r.tag, await outcome(rig.submitRetry(r, tally, { deadline })));
      }),
      'past deadlines under load',
    );
    let expired = 0;
    for (const { r, past } of reqs) {
      const o = got.get(r.tag)!;
      if (past) {
        expired++;
        expect(o.kind === 'err' && o.err instanceof DeadlineExceededError, `request ${r.tag}`).toBe(true);
        expect(rig.ran(r.tag), `expired request ${r.tag} reached the runner`).toBe(0);
      } else {
        expect(o.kind === 'ok' && rig.correct(r, o.res), `request ${r.tag}`).toBe(true);
        expect(rig.ran(r.tag)).toBe(1);
      }
    }
    expect(expired).toBeGreaterThan(0);
    expect(rig.counter(Counter.DROPPED_EXPIRED)).toBe(soon.length + expired);
    expect(Atomics.load(rig.stats, S_ROWS)).toBe(1 + later.length + reqs.length - expired);

    await rig.stop();
    rig.expectClean();
  });

  it('shutdown fails what is still queued with EngineClosedError, lets running batches finish, and leaks no slot', { timeout: 30_000 }, async () => {
    // Deterministic: one batch parked on the device, 20 requests queued, stop requested, then released.
    {
      const rig = new Rig('slot-lifecycle shutdown', { models: [{ layout: { ...LAYOUT, slotCount: 32 }, batching: BATCHING }], maxInflightBatches: 1 });
      const hold = rig.req(0, { len: 20, hold: true });
      const held = outcome(rig.submit(hold));
      await rig.holding(1);
      const queued = Array.from({ length: 20 }, () => rig.req(0));
      const queuedOut = queued.map((r) => outcome(rig.submit(r)));
      rig.requestStop();
      rig.release();
      await rig.guard(rig.stopped, 'the loop to stop');
      const [h, ...rest] = await rig.guard(Promise.all([held, ...queuedOut]), 'requests queued at shutdown');
      expect(h!.kind === 'ok' && rig.correct(hold, h.res)).toBe(true);
      for (const [i, o] of rest.entries()) {
        expect(o.kind === 'err' && o.err instanceof EngineClosedError).toBe(true);
        expect((o as { err: EngineClosedError }).err.code).toBe('SLABSERVE_ENGINE_CLOSED');
        expect(rig.ran(queued[i]!.tag)).toBe(0);
      }
      await rig.stop();
      rig.expectClean();
      rig.sub.close();
      await expect(rig.submit(rig.req(0))).rejects.toBeInstanceOf(EngineClosedError);
    }

    // Slow device (20-50 ms a batch, one at a time), stop requested as soon as the first answer is in.
    {
      const rig = new Rig('slot-lifecycle shutdown, slow device', { models: [{ layout: { ...LAYOUT, slotCount: 64 }, batching: BATCHING }], maxInflightBatches: 1, delayMs: [20, 50] });
      const reqs = Array.from({ length: 60 }, () => rig.req(0));
      const outs = reqs.map((r) => outcome(rig.submit(r)));
      await rig.guard(Promise.race(outs), 'the first answer');
      rig.requestStop();
      const all = await rig.guard(Promise.all(outs), 'every request after stop');
      let ok = 0;
      let closed = 0;
      all.forEach((o, i) => {
        if (o.kind === 'ok') {
          expect(rig.correct(reqs[i]!, o.res)).toBe(true);
          ok++;
        } else {
          expect(o.err, String(o.err)).toBeInstanceOf(EngineClosedError);
          expect(rig.ran(reqs[i]!.tag)).toBe(0);
          closed++;
        }
      });
      expect(ok).toBeGreaterThan(0);
      expect(closed).toBeGreaterThan(0);
      await rig.stop();
      rig.expectClean();
    }
  });

  it('with every slot taken submit() rejects OverloadedError at once, and works again once slots come back', { timeout: 30_000 }, async () => {
    const rig = new Rig('slot-lifecycle overload', { models: [{ layout: { ...LAYOUT, slotCount: 8 }, batching: BATCHING }], maxInflightBatches: 1 });
    const hold = rig.req(0, { len: 20, hold: true });
    const held = outcome(rig.submit(hold));
    await rig.holding(1);
    const queued = Array.from({ length: 7 }, () => rig.req(0));
    const queuedOut = queued.map((r) => outcome(rig.submit(r)));
    expect(rig.slabs[0]!.slotsInUse()).toBe(8);
    expect(rig.sub.pendingCount).toBe(8);

    for (let attempt = 0; attempt < 3; attempt++) {
      const extra = rig.req(0);
      let settled: Outcome | undefined;
      void outcome(rig.submit(extra)).then((o) => (settled = o));
      await tick(); // microtasks only: nothing had to come back from the inference thread
      expect(settled?.kind).toBe('err');
      const err = (settled as { err: unknown }).err;
      expect(err).toBeInstanceOf(OverloadedError);
      expect((err as OverloadedError).code).toBe('SLABSERVE_OVERLOADED');
      expect(rig.ran(extra.tag)).toBe(0);
      expect(rig.slabs[0]!.slotsInUse()).toBe(8);
      expect(rig.sub.pendingCount).toBe(8);
    }

    rig.release();
    const outs = await rig.guard(Promise.all([held, ...queuedOut]), 'the held requests');
    outs.forEach((o, i) => expect(o.kind === 'ok' && rig.correct(i === 0 ? hold : queued[i - 1]!, o.res)).toBe(true));
    expect(rig.slabs[0]!.slotsInUse()).toBe(0);

    const again = Array.from({ length: 8 }, () => rig.req(0));
    const againOut = await rig.guard(Promise.all(again.map((r) => outcome(rig.submit(r)))), 'requests after the overload');
    againOut.forEach((o, i) => expect(o.kind === 'ok' && rig.correct(again[i]!, o.res)).toBe(true));

    await rig.stop();
    rig.expectClean();
  });
});
