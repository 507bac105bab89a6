/**
 * The batch scheduler: a pure function from (what is queued, the clock,
 * whether the device is idle) to the next decision. No I/O, no timers, no
 * shared memory: the inference loop feeds it and acts on its answer, and the
 * tests drive it with a virtual clock.
 *
 * Policy (the knobs are Triton's dynamic-batcher knobs, named as in TEI):
 *  - Requests are grouped by model and by length bucket: a batch holds one
 *    bucket of one model, padded to the bucket's length, so one long input
 *    never pads a batch of short ones.
 *  - A bucket's batch holds at most min(maxBatchSize, maxBatchTokens / bucket)
 *    requests (maxBatchTokens counts padded tokens: what the device computes).
 *  - A batch closes when it is full, when its oldest request has waited
 *    maxBatchDelayMs, or at once when the device is idle: a lone request never
 *    waits for company that is not coming.
 *  - Among the batches that may close, the one whose oldest request is oldest
 *    goes first, across buckets and models, so no length and no model starves.
 */

export interface BatchingOptions {
  /** Most requests in one batch. */
  maxBatchSize: number;
  /** Longest a request waits for its batch to fill while the device is busy. */
  maxBatchDelayMs: number;
  /** Most padded tokens (batch size x bucket length) in one batch. */
  maxBatchTokens: number;
  /** Padded lengths, ascending; the last is the longest input accepted. */
  buckets: number[];
}

export const DEFAULT_BATCHING: Omit<BatchingOptions, 'buckets'> = {
  maxBatchSize: 32,
  maxBatchDelayMs: 5,
  maxBatchTokens: 16384,
};

/** Powers of two from 8 up to maxLength (maxLength itself is always the last bucket). */
export function defaultBuckets(maxLength: number): number[] {
  const out: number[] = [];
  for (let b = 8; b < maxLength; b *= 2) out.push(b);
  out.push(maxLength);
  return out;
}

/** Index of the smallest bucket that holds `length` tokens, or -1 if none does. */
export function bucketFor(buckets: readonly number[], length: number): number {
  for (let i = 0; i < buckets.length; i++) if (length <= buckets[i]!) return i;
  return -1;
}

/** How many requests fit in one batch of the given bucket length. */
export function batchCapacity(opts: BatchingOptions, bucketLength: number): number {
  return Math.max(1, Math.min(opts.maxBatchSize, Math.floor(opts.maxBatchTokens / bucketLength)));
}

export interface QueuedRequest {
  slot: number;
  /** Real tokens. */
  length: number;
  /** Epoch ms when it was queued. */
  enqueuedAt: number;
  /** Epoch ms after which it must not run. */
  deadline: number;
}

export interface ModelQueue {
  options: BatchingOptions;
  /** One FIFO per bucket, oldest first; index matches options.buckets. */
  buckets: QueuedRequest[][];
}

export type Decision =
  /** Run the first `count` requests of `queues[model].buckets[bucket]`. */
  | { kind: 'run'; model: number; bucket: number; count: number }
  /** Nothing may close before `untilMs` unless new work arrives. */
  | { kind: 'wait'; untilMs: number }
  /** Nothing is queued. */
  | { kind: 'idle' };

export function decide(queues: readonly ModelQueue[], nowMs: number, deviceIdle: boolean): Decision {
  let best: { model: number; bucket: number; count: number; oldest: number } | null = null;
  let wakeAt = Infinity;
  for (let m = 0; m < queues.length; m++) {
    const q = queues[m]!;
    for (let b = 0; b < q.buckets.length; b++) {
      const fifo = q.buckets[b]!;
      if (fifo.length === 0) continue;
      const capacity = batchCapacity(q.options, q.options.buckets[b]!);
      const oldest = fifo[0]!.enqueuedAt;
      const closesAt = oldest + q.options.maxBatchDelayMs;
      const mayClose = deviceIdle || fifo.length >= capacity || nowMs >= closesAt;
      if (!mayClose) {
        wakeAt = Math.min(wakeAt, closesAt);
        continue;
      }
      if (best === null || oldest < best.oldest) {
        best = { model: m, bucket: b, count: Math.min(fifo.length, capacity), oldest };
      }
    }
  }
  if (best) return { kind: 'run', model: best.model, bucket: best.bucket, count: best.count };
  return wakeAt === Infinity ? { kind: 'idle' } : { kind: 'wait', untilMs: wakeAt };
}
