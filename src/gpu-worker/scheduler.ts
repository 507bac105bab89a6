/**
 * The batch scheduler: a pure function from (what is queued, the clock,
 * whether the device is idle, the policy's state) to the next decision. No
 * I/O, no timers, no shared memory: the inference loop feeds it and acts on
 * its answer, and the tests drive it with a virtual clock.
 *
 * Policy (the knobs are Triton's dynamic-batcher knobs, named as in TEI):
 *  - Requests are grouped by model and by length bucket: a batch holds one
 *    bucket of one model, padded to the bucket's length, so one long input
 *    never pads a batch of short ones.
 *  - A bucket's batch holds at most min(maxBatchSize, maxBatchTokens / bucket)
 *    requests (maxBatchTokens counts padded tokens: what the device computes).
 *  - Within a bucket, earliest deadline first (a large client batch's later
 *    chunks sort after other clients' requests: see `orderKey`).
 *  - Priority classes (interactive, bulk, ...) share the device by weighted
 *    fair queueing on padded tokens; a request older than `ageingMs` puts its
 *    class first, so no class starves.
 *  - Without a latency target, a batch closes when it is full, when its oldest
 *    request has waited maxBatchDelayMs, or at once when the device is idle;
 *    the batch with the oldest request goes first.
 *  - With a latency target (--slo-p99-ms), an idle device still dispatches at
 *    once at low load (device busy under half the time); above that it waits
 *    only if the arrival rate says the batch would fill (or gain at least one
 *    more request) within the oldest request's slack. Among the batches that
 *    may close, an urgent one (no slack left) goes first, otherwise the one
 *    that serves the most real tokens per predicted millisecond.
 */

export type { BatchingOptions, PadTo } from '../shared/batching.js';
export { PAD_TO } from '../shared/batching.js';
import type { BatchingOptions } from '../shared/batching.js';

export { defaultBuckets } from '../shared/options.js';
export { bucketFor } from '../shared/batching.js';

/** How many requests fit in one batch of the given bucket length. */
export function batchCapacity(opts: BatchingOptions, bucketLength: number): number {
  return Math.max(1, Math.min(opts.maxBatchSize, Math.floor(opts.maxBatchTokens / bucketLength)));
}

/**
 * Sort key within a bucket: the deadline, pushed back by `chunk` quanta for
 * the later chunks of a large client request, so that other clients'
 * requests arriving meanwhile go between its chunks instead of after all of it.
 */
export function orderKey(deadline: number, chunk: number, quantumMs: number): number {
  return deadline + chunk * quantumMs;
}

export interface QueuedRequest {
  slot: number;
  /** Real tokens. */
  length: number;
  /** Epoch ms when it was queued. */
  enqueuedAt: number;
  /** Epoch ms after which it must not run. */
  deadline: number;
  /** Priority class index (0 = interactive, 1 = bulk by default). */
  priority: number;
  /** Order within its queue (orderKey): ascending. */
  key: number;
}

export interface ModelQueue {
  options: BatchingOptions;
  /** byClass[class][bucket]: requests ordered by key. */
  byClass: QueuedRequest[][][];
}

/** Inserts `r` into `queue` keeping it ordered by key (FIFO among equal keys). */
export function enqueue(queue: QueuedRequest[], r: QueuedRequest): void {
  let i = queue.length;
  while (i > 0 && queue[i - 1]!.key > r.key) i--; // arrivals are nearly in order: scan from the end
  queue.splice(i, 0, r);
}

/** Weighted fair sharing between priority classes, in padded tokens served. */
export interface FairShareState {
  weights: number[];
  /** Padded tokens served per class, divided by nothing: compare served/weight. */
  served: number[];
}

export class FairShare implements FairShareState {
  readonly weights: number[];
  readonly served: number[];
  constructor(weights: number[]) {
    if (weights.length === 0 || weights.some((w) => !(w > 0))) throw new RangeError('priority weights must be positive');
    this.weights = [...weights];
    this.served = weights.map(() => 0);
  }

  /** A class that was idle joins at the level of the busiest active class: no credit saved up while idle. */
  activate(cls: number, active: readonly number[]): void {
    let floor = Infinity;
    for (const c of active) if (c !== cls) floor = Math.min(floor, this.served[c]! / this.weights[c]!);
    if (floor !== Infinity) this.served[cls] = Math.max(this.served[cls]!, floor * this.weights[cls]!);
  }

  charge(cls: number, paddedTokens: number): void {
    this.served[cls]! += paddedTokens;
  }
}

/** What a latency target needs from the measurements (all in ms). */
export interface SloModel {
  /** The end-to-end latency to keep requests under. */
  targetMs: number;
  /** Predicted run time of a batch of `rows` in `bucket` of `model`. */
  costMs(model: number, bucket: number, rows: number): number;
  /** Recent arrivals per ms into `bucket` of `model` (all classes). */
  arrivalsPerMs(model: number, bucket: number, nowMs: number): number;
  /** Recent share of time the device was busy, 0..1. */
  utilization(nowMs: number): number;
}

/** Below this device utilization an idle device never waits: latency is worth more than device time. */
export const SLO_WAIT_UTILIZATION = 0.5;

export interface SchedulerContext {
  nowMs: number;
  deviceIdle: boolean;
  fair: FairShareState;
  /** A class whose oldest request has waited this long goes first. */
  ageingMs: number;
  slo?: SloModel;
}

export type Decision =
  /** Run the first `count` requests of `queues[model].byClass[priority][bucket]`. */
  | { kind: 'run'; model: number; priority: number; bucket: number; count: number }
  /** Nothing may close before `untilMs` unless new work arrives. */
  | { kind: 'wait'; untilMs: number }
  /** Nothing is queued. */
  | { kind: 'idle' };

/** The share of the target a batch may plan to use: the rest is margin for the tail. */
const SLO_PLANNING_SHARE = 0.8;

interface Candidate {
  model: number;
  bucket: number;
  count: number;
  oldest: number;
  /** Higher goes first. */
  rank: number;
}

export function decide(queues: readonly ModelQueue[], ctx: SchedulerContext): Decision {
  const now = ctx.nowMs;
  const classes = ctx.fair.weights.length;
  // Oldest request of each class, to order classes (ageing) and skip empty ones.
  const oldestOf = new Array<number>(classes).fill(Infinity);
  for (const q of queues) {
    for (let c = 0; c < classes; c++) for (const fifo of q.byClass[c] ?? []) for (const r of fifo) oldestOf[c] = Math.min(oldestOf[c]!, r.enqueuedAt);
  }
  const active = [...Array(classes).keys()].filter((c) => oldestOf[c] !== Infinity);
  if (active.length === 0) return { kind: 'idle' };
  active.sort((a, b) => {
    const agedA = now - oldestOf[a]! >= ctx.ageingMs;
    const agedB = now - oldestOf[b]! >= ctx.ageingMs;
    if (agedA !== agedB) return agedA ? -1 : 1;
    if (agedA && agedB) return oldestOf[a]! - oldestOf[b]!;
    return ctx.fair.served[a]! / ctx.fair.weights[a]! - ctx.fair.served[b]! / ctx.fair.weights[b]! || a - b;
  });

  let wakeAt = Infinity;
  for (const c of active) {
    let best: Candidate | null = null;
    for (let m = 0; m < queues.length; m++) {
      const q = queues[m]!;
      const byBucket = q.byClass[c] ?? [];
      for (let b = 0; b < byBucket.length; b++) {
        const fifo = byBucket[b]!;
        if (fifo.length === 0) continue;
        const capacity = batchCapacity(q.options, q.options.buckets[b]!);
        const count = Math.min(fifo.length, capacity);
        let oldest = Infinity;
        for (const r of fifo) oldest = Math.min(oldest, r.enqueuedAt);
        const full = fifo.length >= capacity;
        const windowEnds = oldest + q.options.maxBatchDelayMs;

        let mayClose: boolean;
        let rank: number;
        if (!ctx.slo) {
          mayClose = ctx.deviceIdle || full || now >= windowEnds;
          rank = -oldest; // oldest first
          if (!mayClose) wakeAt = Math.min(wakeAt, windowEnds);
        } else {
          const slo = ctx.slo;
          const runNow = slo.costMs(m, b, count);
          const slack = slo.targetMs * SLO_PLANNING_SHARE - (now - oldest) - runNow;
          if (full || slack <= 0) {
            mayClose = true;
          } else if (ctx.deviceIdle && slo.utilization(now) < SLO_WAIT_UTILIZATION) {
            mayClose = true; // low load: the device has time to spare, so nothing waits
          } else if (ctx.deviceIdle) {
            // Wait for company only if it is coming within the slack of the oldest request.
            const rate = slo.arrivalsPerMs(m, b, now);
            const slackIfFull = slo.targetMs * SLO_PLANNING_SHARE - (now - oldest) - slo.costMs(m, b, capacity);
            const fillMs = rate > 0 ? (capacity - fifo.length) / rate : Infinity;
            const waitMs = Math.min(slackIfFull, fillMs);
            mayClose = !(waitMs > 0 && rate * waitMs >= 1);
            if (!mayClose) wakeAt = Math.min(wakeAt, now + waitMs);
          } else {
            mayClose = now >= windowEnds;
            if (!mayClose) wakeAt = Math.min(wakeAt, windowEnds);
          }
          let realTokens = 0;
          for (let i = 0; i < count; i++) realTokens += fifo[i]!.length;
          // Urgent batches (slack gone) first, most urgent first; then the most real tokens per predicted ms.
          rank = slack <= 0 ? 1e12 - slack : realTokens / Math.max(runNow, 1e-3);
        }
        if (mayClose && (best === null || rank > best.rank)) best = { model: m, bucket: b, count, oldest, rank };
      }
    }
    if (best) return { kind: 'run', model: best.model, priority: c, bucket: best.bucket, count: best.count };
  }
  return wakeAt === Infinity ? { kind: 'idle' } : { kind: 'wait', untilMs: wakeAt };
}
