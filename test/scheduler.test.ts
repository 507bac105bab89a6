import { describe, expect, it } from 'vitest';
import { MAX_BUCKETS } from '../dist/src/shared/slab.js';
import {
  batchCapacity,
  bucketFor,
  decide,
  defaultBuckets,
  enqueue,
  FairShare,
  orderKey,
  type BatchingOptions,
  type Decision,
  type ModelQueue,
  type QueuedRequest,
  type SchedulerContext,
  type SloModel,
} from '../src/gpu-worker/scheduler.js';

const opts = (o: Partial<BatchingOptions> = {}): BatchingOptions => ({
  maxBatchSize: 4,
  maxBatchDelayMs: 5,
  maxBatchTokens: 16384,
  buckets: [8, 16, 32],
  ...o,
});

type TestQueue = ModelQueue & { add(at: number, length: number, extra?: Partial<QueuedRequest>): QueuedRequest };

/** A virtual-clock queue with `classes` priority classes; add() files a request under its class and bucket. */
function queue(o: BatchingOptions, classes = 2): TestQueue {
  let slot = 0;
  const q: TestQueue = {
    options: o,
    byClass: Array.from({ length: classes }, () => o.buckets.map(() => [] as QueuedRequest[])),
    add(at, length, extra = {}) {
      const deadline = extra.deadline ?? at + 30_000;
      const r: QueuedRequest = { slot: slot++, length, enqueuedAt: at, deadline, priority: 0, key: deadline, ...extra };
      enqueue(q.byClass[r.priority]![bucketFor(o.buckets, length)]!, r);
      return r;
    },
  };
  return q;
}

const ctx = (nowMs: number, deviceIdle: boolean, extra: Partial<SchedulerContext> = {}): SchedulerContext => ({
  nowMs,
  deviceIdle,
  fair: new FairShare([4, 1]),
  ageingMs: 10_000,
  ...extra,
});

/** Applies a run decision the way the inference loop does. */
function take(qs: ModelQueue[], d: Decision): QueuedRequest[] {
  if (d.kind !== 'run') throw new Error(`expected a run, got ${JSON.stringify(d)}`);
  return qs[d.model]!.byClass[d.priority]![d.bucket]!.splice(0, d.count);
}

describe('buckets', () => {
  it('defaults to powers of two up to the max length', () => {
    expect(defaultBuckets(512)).toEqual([8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512]);
    expect(defaultBuckets(100)).toEqual([8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 100]);
    expect(defaultBuckets(32768).length).toBeLessThanOrEqual(MAX_BUCKETS); // the slab's limit, for the longest contexts
  });
  it('files a length under the smallest bucket that holds it', () => {
    expect(bucketFor([8, 16, 32], 1)).toBe(0);
    expect(bucketFor([8, 16, 32], 8)).toBe(0);
    expect(bucketFor([8, 16, 32], 9)).toBe(1);
    expect(bucketFor([8, 16, 32], 33)).toBe(-1);
  });
  it('caps a batch by padded tokens as well as by size', () => {
    expect(batchCapacity(opts({ maxBatchSize: 32, maxBatchTokens: 256 }), 8)).toBe(32);
    expect(batchCapacity(opts({ maxBatchSize: 32, maxBatchTokens: 256 }), 32)).toBe(8);
    expect(batchCapacity(opts({ maxBatchSize: 32, maxBatchTokens: 256 }), 512)).toBe(1);
  });
});

describe('decide without a latency target (virtual clock)', () => {
  it('is idle with nothing queued', () => {
    expect(decide([queue(opts())], ctx(0, true))).toEqual({ kind: 'idle' });
    expect(decide([queue(opts())], ctx(0, false))).toEqual({ kind: 'idle' });
  });

  it('dispatches a lone request at once when the device is idle', () => {
    const q = queue(opts());
    q.add(100, 5);
    expect(decide([q], ctx(100, true))).toEqual({ kind: 'run', model: 0, priority: 0, bucket: 0, count: 1 });
  });

  it('waits for company while the device is busy, until the oldest request has waited maxBatchDelayMs', () => {
    const q = queue(opts({ maxBatchDelayMs: 5 }));
    q.add(100, 5);
    q.add(102, 6);
    expect(decide([q], ctx(103, false))).toEqual({ kind: 'wait', untilMs: 105 });
    expect(decide([q], ctx(104.999, false)).kind).toBe('wait');
    expect(decide([q], ctx(105, false))).toEqual({ kind: 'run', model: 0, priority: 0, bucket: 0, count: 2 });
  });

  it('closes a full batch at once even while the device is busy', () => {
    const q = queue(opts({ maxBatchSize: 4 }));
    for (let i = 0; i < 6; i++) q.add(100, 5);
    const d = decide([q], ctx(100, false));
    expect(d).toEqual({ kind: 'run', model: 0, priority: 0, bucket: 0, count: 4 });
    expect(take([q], d).map((r) => r.slot)).toEqual([0, 1, 2, 3]);
    expect(decide([q], ctx(100, false))).toEqual({ kind: 'wait', untilMs: 105 });
  });

  it('closes a batch when the token budget is reached', () => {
    const q = queue(opts({ maxBatchSize: 32, maxBatchTokens: 64 })); // bucket 32 holds 2 rows
    q.add(0, 20);
    expect(decide([q], ctx(0, false)).kind).toBe('wait');
    q.add(0, 30);
    expect(decide([q], ctx(0, false))).toEqual({ kind: 'run', model: 0, priority: 0, bucket: 2, count: 2 });
  });

  it('never mixes buckets: a long input does not pad short ones', () => {
    const q = queue(opts());
    q.add(0, 4);
    q.add(1, 30);
    q.add(2, 5);
    expect(take([q], decide([q], ctx(10, true))).map((r) => r.length)).toEqual([4, 5]);
    expect(take([q], decide([q], ctx(10, true))).map((r) => r.length)).toEqual([30]);
  });

  it('serves the bucket holding the oldest request first', () => {
    const q = queue(opts({ maxBatchSize: 2 }));
    q.add(0, 30); // oldest, bucket 32
    q.add(1, 4);
    q.add(2, 4); // bucket 8 is full
    expect(decide([q], ctx(10, true))).toEqual({ kind: 'run', model: 0, priority: 0, bucket: 2, count: 1 });
  });

  it('does not starve a rare length under a steady stream of short requests', () => {
    const q = queue(opts({ maxBatchSize: 4, maxBatchDelayMs: 5 }));
    const rare = q.add(0, 30);
    let served = -1;
    for (let t = 0; t < 100 && served < 0; t++) {
      for (let i = 0; i < 4; i++) q.add(t, 6);
      const d = decide([q], ctx(t, false));
      if (d.kind === 'run' && take([q], d).includes(rare)) served = t;
    }
    expect(served).toBeGreaterThanOrEqual(0);
    expect(served).toBeLessThanOrEqual(5);
  });

  it('shares the device between models, oldest first', () => {
    const a = queue(opts());
    const b = queue(opts());
    a.add(0, 5);
    b.add(1, 5);
    a.add(2, 5);
    const qs = [a, b];
    const order: number[] = [];
    for (let i = 0; i < 2; i++) {
      const d = decide(qs, ctx(10, true));
      if (d.kind !== 'run') throw new Error('expected run');
      order.push(d.model);
      take(qs, d);
    }
    expect(order).toEqual([0, 1]);
    expect(decide(qs, ctx(10, true))).toEqual({ kind: 'idle' });
  });

  it('reports the earliest window to close across models and buckets', () => {
    const a = queue(opts({ maxBatchDelayMs: 10 }));
    const b = queue(opts({ maxBatchDelayMs: 2 }));
    a.add(0, 5);
    b.add(3, 20);
    expect(decide([a, b], ctx(4, false))).toEqual({ kind: 'wait', untilMs: 5 });
  });
});

describe('ordering within a bucket', () => {
  it('earliest deadline first', () => {
    const q = queue(opts({ maxBatchSize: 2 }));
    q.add(0, 5, { deadline: 900 });
    q.add(1, 5, { deadline: 100 });
    q.add(2, 5, { deadline: 500 });
    expect(take([q], decide([q], ctx(10, true))).map((r) => r.deadline)).toEqual([100, 500]);
  });

  it("a large client request's later chunks yield to other clients' requests", () => {
    const q = queue(opts({ maxBatchSize: 8 }));
    const quantum = 3;
    // 24 inputs of one request, 8 a chunk, all with deadline 1000; then a lone request arrives, same timeout.
    for (let i = 0; i < 24; i++) q.add(0, 5, { deadline: 1000, key: orderKey(1000, Math.floor(i / 8), quantum), slot: i });
    q.add(1, 5, { deadline: 1001, key: orderKey(1001, 0, quantum), slot: 99 });
    const first = take([q], decide([q], ctx(2, true))).map((r) => r.slot);
    const second = take([q], decide([q], ctx(2, true))).map((r) => r.slot);
    expect(first).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(second[0]).toBe(99); // not behind all 24
  });
});

describe('priority classes', () => {
  it('weighted fair sharing: interactive gets its weight of the device, bulk still progresses', () => {
    const q = queue(opts({ maxBatchSize: 4 }));
    const fair = new FairShare([4, 1]);
    for (let i = 0; i < 400; i++) {
      q.add(0, 5, { priority: 0 });
      q.add(0, 5, { priority: 1 });
    }
    const served = [0, 0];
    for (let i = 0; i < 50; i++) {
      const d = decide([q], ctx(1, true, { fair }));
      if (d.kind !== 'run') throw new Error('expected run');
      const batch = take([q], d);
      served[d.priority]! += batch.length;
      fair.charge(d.priority, batch.length * 8);
    }
    expect(served[0]! / served[1]!).toBeCloseTo(4, 0);
    expect(served[1]).toBeGreaterThan(0);
  });

  it('ageing: a bulk request older than ageingMs goes first', () => {
    const q = queue(opts());
    const fair = new FairShare([4, 1]);
    fair.charge(1, 1e6); // bulk has had far more than its share
    q.add(0, 5, { priority: 1 });
    q.add(2000, 5, { priority: 0 });
    expect(decide([q], ctx(2001, true, { fair, ageingMs: 1000 }))).toMatchObject({ kind: 'run', priority: 1 });
    expect(decide([q], ctx(2001, true, { fair, ageingMs: 5000 }))).toMatchObject({ kind: 'run', priority: 0 });
  });

  it('a class that was idle does not bank credit', () => {
    const fair = new FairShare([1, 1]);
    fair.charge(0, 1000);
    fair.activate(1, [0]);
    expect(fair.served[1]).toBe(1000);
  });
});

describe('with a latency target', () => {
  const slo = (over: Partial<SloModel> = {}): SloModel => ({
    targetMs: 50,
    costMs: (_m, _b, rows) => 2 + 0.5 * rows,
    arrivalsPerMs: () => 0,
    utilization: () => 0.9,
    ...over,
  });

  it('at low load an idle device dispatches at once', () => {
    const q = queue(opts({ maxBatchSize: 32 }));
    q.add(100, 5);
    // few arrivals expected
    expect(decide([q], ctx(100, true, { slo: slo({ arrivalsPerMs: () => 0.01 }) }))).toMatchObject({ kind: 'run', count: 1 });
    // many arrivals, but the device is mostly idle: latency is worth more than device time
    expect(decide([q], ctx(100, true, { slo: slo({ arrivalsPerMs: () => 2, utilization: () => 0.3 }) }))).toMatchObject({ kind: 'run', count: 1 });
  });

  it('under load an idle device waits for company while the target allows, then dispatches', () => {
    const q = queue(opts({ maxBatchSize: 32 }));
    q.add(100, 5);
    const busy = slo({ arrivalsPerMs: () => 2 }); // 2 per ms: 31 more in 15.5 ms
    const d = decide([q], ctx(100, true, { slo: busy }));
    expect(d.kind).toBe('wait');
    // Follow the wake-ups on the virtual clock (no arrivals come, though the rate says they will).
    let now = 100;
    let next: Decision = d;
    while (next.kind === 'wait') {
      expect(next.untilMs).toBeGreaterThan(now);
      now = next.untilMs;
      next = decide([q], ctx(now, true, { slo: busy }));
    }
    expect(next.kind).toBe('run');
    // never plans past the target: 80% of 50 ms minus a full batch's 18 ms
    expect(now).toBeLessThanOrEqual(100 + 50 * 0.8 - 18 + 1e-9);
  });

  it('an urgent batch (no slack left) goes before a more efficient one', () => {
    const q = queue(opts({ maxBatchSize: 32 }));
    q.add(0, 30); // bucket 32, old
    for (let i = 0; i < 32; i++) q.add(40, 6); // a full, efficient batch in bucket 8
    expect(decide([q], ctx(45, true, { slo: slo() }))).toMatchObject({ kind: 'run', bucket: 2 });
  });

  it('otherwise prefers the batch with the most real tokens per predicted ms', () => {
    const q = queue(opts({ maxBatchSize: 32 }));
    q.add(0, 12); // bucket 16, one row
    for (let i = 0; i < 32; i++) q.add(1, 6); // bucket 8, full
    expect(decide([q], ctx(2, true, { slo: slo() }))).toMatchObject({ kind: 'run', bucket: 0, count: 32 });
  });
});
