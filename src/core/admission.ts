/**
 * Admission control: refuse at once the work that would only time out.
 *
 * Queued work is counted per length bucket, in inputs (a client batch of 64
 * texts weighs 64 inputs in their buckets, so a single short input is not
 * refused while a large list is accepted). The predicted wait is the time the
 * device needs to drain that work in full batches, from the online cost model
 * (ms = fixed + perRow x rows per bucket), the request's own inputs included.
 * The limit is the request's remaining deadline, or the latency target when
 * one is set (then the server sheds load instead of letting every request be
 * late).
 */

export interface BucketCost {
  /** Most rows in one batch of this bucket. */
  capacity: number;
  fixedMs: number;
  perRowMs: number;
}

/** Ms to run `rows` requests of one bucket in full batches (the last one partial). */
export function drainMs(rows: number, c: BucketCost): number {
  if (rows <= 0) return 0;
  const full = Math.floor(rows / c.capacity);
  const rest = rows - full * c.capacity;
  return full * (c.fixedMs + c.perRowMs * c.capacity) + (rest > 0 ? c.fixedMs + c.perRowMs * rest : 0);
}

/** Predicted ms to drain the queue with the request added: `queued[b] + request[b]` rows per bucket. */
export function predictedWaitMs(queued: ArrayLike<number>, request: ArrayLike<number>, costs: readonly BucketCost[]): number {
  let ms = 0;
  for (let b = 0; b < costs.length; b++) ms += drainMs(Math.max(0, queued[b] ?? 0) + (request[b] ?? 0), costs[b]!);
  return ms;
}

export interface AdmissionInput {
  /** predictedWaitMs() for the queue with this request in it; 0 when the device is not measured yet. */
  predictedWaitMs: number;
  /** Ms until the request's deadline. */
  remainingMs: number;
  /** Latency target, ms (--slo-p99-ms), if any. */
  targetMs?: number;
}

export type AdmissionDecision = { admit: true; predictedWaitMs: number } | { admit: false; predictedWaitMs: number; retryAfterSeconds: number };

/**
 * The share of its limit a request may be predicted to wait: the prediction
 * counts the work queued ahead of it, but under load each batch of another
 * bucket also carries requests that arrive later, so real waits run longer.
 */
export const ADMISSION_SHARE = 0.75;

export function admission(a: AdmissionInput): AdmissionDecision {
  const predictedWaitMs = a.predictedWaitMs;
  const limitMs = ADMISSION_SHARE * (a.targetMs === undefined ? a.remainingMs : Math.min(a.targetMs, a.remainingMs));
  if (predictedWaitMs <= limitMs) return { admit: true, predictedWaitMs };
  // When would the queue have drained enough for this request to fit its limit?
  const excessMs = predictedWaitMs - limitMs;
  return { admit: false, predictedWaitMs, retryAfterSeconds: Math.max(1, Math.ceil(excessMs / 1000)) };
}
