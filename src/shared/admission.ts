/**
 * Admission control: refuse at once the work that would only time out.
 *
 * Queued work is counted in padded tokens (what the device computes), not in
 * requests, so a client batch of 64 texts weighs 64 inputs and a single short
 * input is not refused while a large list is accepted. The predicted wait is
 * that work divided by the best rate the device drains it (padded tokens per
 * ms at full batches, from the cost model): a lower bound, so a request is
 * refused only when even the best case misses its limit. The limit is the
 * request's remaining deadline, or the latency target when one is set (then
 * the server sheds load instead of letting every request be late).
 */

export interface AdmissionInput {
  /** Padded tokens already queued for the model. */
  queuedTokens: number;
  /** Padded tokens this request adds. */
  requestTokens: number;
  /** Best drain rate, padded tokens per ms; 0 when unknown (then everything is admitted). */
  tokensPerMs: number;
  /** Ms until the request's deadline. */
  remainingMs: number;
  /** Latency target, ms (--slo-p99-ms), if any. */
  targetMs?: number;
}

export type AdmissionDecision = { admit: true; predictedWaitMs: number } | { admit: false; predictedWaitMs: number; retryAfterSeconds: number };

export function admission(a: AdmissionInput): AdmissionDecision {
  if (!(a.tokensPerMs > 0)) return { admit: true, predictedWaitMs: 0 };
  const predictedWaitMs = (Math.max(0, a.queuedTokens) + a.requestTokens) / a.tokensPerMs;
  const limitMs = a.targetMs === undefined ? a.remainingMs : Math.min(a.targetMs, a.remainingMs);
  if (predictedWaitMs <= limitMs) return { admit: true, predictedWaitMs };
  // When would the queue have drained enough for this request to fit its limit?
  const excessMs = predictedWaitMs - limitMs;
  return { admit: false, predictedWaitMs, retryAfterSeconds: Math.max(1, Math.ceil(excessMs / 1000)) };
}
