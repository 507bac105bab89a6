import { describe, expect, it } from 'vitest';
import {
  batchCapacity,
  bucketFor,
  decide,
  defaultBuckets,
  type BatchingOptions,
  type ModelQueue,
  type QueuedRequest,
} from '../src/gpu-worker/scheduler.js';

const opts = (o: Partial<BatchingOptions> = {}): BatchingOptions => ({
  maxBatchSize: 4,
  maxBatchDelayMs: 5,
  maxBatchTokens: 16384,
  buckets: [8, 16, 32],
  ...o,
});

/** A virtual-clock queue: enqueue(at, length) files the request under its bucket. */
function queue(o: BatchingOptions): ModelQueue & { enqueue(at: number, length: number): QueuedRequest } {
  let slot = 0;
  const q = {
    options: o,
    buckets: o.buckets.map(() => [] as QueuedRequest[]),
    enqueue(at: number, length: number) {
      const r = { slot: slot++, length, enqueuedAt: at, deadline: at + 30_000 };
      q.buckets[bucketFor(o.buckets, length)]!.push(r);
      return r;
    },
  };
  return q;
}

/** Applies a run decision the way the inference loop does. */
function take(qs: ModelQueue[], d: ReturnType<typeof decide>): QueuedRequest[] {
  if (d.kind !== 'run') throw new Error(`expected a run, got ${d.kind}`);
  return qs[d.model]!.buckets[d.bucket]!.splice(0, d.count);
}

describe('buckets', () => {
  it('defaults to powers of two up to the max length', () => {
    expect(defaultBuckets(512)).toEqual([8, 16, 32, 64, 128, 256, 512]);
    expect(defaultBuckets(100)).toEqual([8, 16, 32, 64, 100]);
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

describe('decide (virtual clock)', () => {
  it('is idle with nothing queued', () => {
    expect(decide([queue(opts())], 0, true)).toEqual({ kind: 'idle' });
    expect(decide([queue(opts())], 0, false)).toEqual({ kind: 'idle' });
  });

  it('dispatches a lone request at once when the device is idle', () => {
    const q = queue(opts());
    q.enqueue(100, 5);
    expect(decide([q], 100, true)).toEqual({ kind: 'run', model: 0, bucket: 0, count: 1 });
  });

  it('waits for company while the device is busy, until the oldest request has waited maxBatchDelayMs', () => {
    const q = queue(opts({ maxBatchDelayMs: 5 }));
    q.enqueue(100, 5);
    q.enqueue(102, 6);
    expect(decide([q], 103, false)).toEqual({ kind: 'wait', untilMs: 105 });
    expect(decide([q], 104.999, false).kind).toBe('wait');
    expect(decide([q], 105, false)).toEqual({ kind: 'run', model: 0, bucket: 0, count: 2 });
  });

  it('closes a full batch at once even while the device is busy', () => {
    const q = queue(opts({ maxBatchSize: 4 }));
    for (let i = 0; i < 6; i++) q.enqueue(100, 5);
    const d = decide([q], 100, false);
    expect(d).toEqual({ kind: 'run', model: 0, bucket: 0, count: 4 });
    expect(take([q], d).map((r) => r.slot)).toEqual([0, 1, 2, 3]);
    // the remaining two wait for company again
    expect(decide([q], 100, false)).toEqual({ kind: 'wait', untilMs: 105 });
  });

  it('closes a batch when the token budget is reached', () => {
    const q = queue(opts({ maxBatchSize: 32, maxBatchTokens: 64 })); // bucket 32 holds 2 rows
    q.enqueue(0, 20);
    expect(decide([q], 0, false).kind).toBe('wait');
    q.enqueue(0, 30);
    expect(decide([q], 0, false)).toEqual({ kind: 'run', model: 0, bucket: 2, count: 2 });
  });

  it('never mixes buckets: a long input does not pad short ones', () => {
    const q = queue(opts());
    q.enqueue(0, 4);
    q.enqueue(1, 30);
    q.enqueue(2, 5);
    const first = take([q], decide([q], 10, true));
    expect(first.map((r) => r.length)).toEqual([4, 5]);
    const second = take([q], decide([q], 10, true));
    expect(second.map((r) => r.length)).toEqual([30]);
  });

  it('serves the bucket holding the oldest request first', () => {
    const q = queue(opts({ maxBatchSize: 2 }));
    q.enqueue(0, 30); // oldest, bucket 32
    q.enqueue(1, 4);
    q.enqueue(2, 4); // bucket 8 is full
    expect(decide([q], 10, true)).toEqual({ kind: 'run', model: 0, bucket: 2, count: 1 });
  });

  it('does not starve a rare length under a steady stream of short requests', () => {
    const q = queue(opts({ maxBatchSize: 4, maxBatchDelayMs: 5 }));
    const rare = q.enqueue(0, 30);
    let served = -1;
    // Every ms four short requests arrive (a full batch each time) and the device stays busy.
    for (let t = 0; t < 100 && served < 0; t++) {
      for (let i = 0; i < 4; i++) q.enqueue(t, 6);
      const d = decide([q], t, false);
      if (d.kind === 'run' && take([q], d).includes(rare)) served = t;
    }
    expect(served).toBeGreaterThanOrEqual(0);
    expect(served).toBeLessThanOrEqual(5); // as soon as its delay expires it is the oldest
  });

  it('shares the device between models, oldest first', () => {
    const a = queue(opts());
    const b = queue(opts());
    a.enqueue(0, 5);
    b.enqueue(1, 5);
    a.enqueue(2, 5);
    const qs = [a, b];
    const order: number[] = [];
    for (let i = 0; i < 2; i++) {
      const d = decide(qs, 10, true);
      if (d.kind !== 'run') throw new Error('expected run');
      order.push(d.model);
      take(qs, d);
    }
    expect(order).toEqual([0, 1]);
    expect(decide(qs, 10, true)).toEqual({ kind: 'idle' });
  });

  it('reports the earliest window to close across models and buckets', () => {
    const a = queue(opts({ maxBatchDelayMs: 10 }));
    const b = queue(opts({ maxBatchDelayMs: 2 }));
    a.enqueue(0, 5);
    b.enqueue(3, 20);
    expect(decide([a, b], 4, false)).toEqual({ kind: 'wait', untilMs: 5 });
  });
});
