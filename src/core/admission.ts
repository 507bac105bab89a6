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
import { OverloadedError, ValidationError } from '../shared/errors.js';
import type { ServedModel } from './served-model.js';

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

/**
 * A pipeline's admission: slots held for a request before its inputs are tokenized, and the
 * refusals (429) of work that would only time out, decided by {@link admission}.
 */
/** Where slots come from (the submitter): taken for a request, counted free, and the wait the queue predicts. */
export interface SlotSource<R extends { release(): void }> {
  reserve(model: number, count: number, tokenRows: boolean): R;
  predictedWaitMs(model: number): number;
  freeSlots(model: number): number;
}

export class Admission<R extends { release(): void }> {
  constructor(
    private readonly submitter: SlotSource<R>,
    /** Latency target (--slo-p99-ms); absent, each request's deadline is the limit. */
    private readonly targetMs: number | undefined,
  ) {}

  /**
   * Takes `count` slots of `model` for one request before its inputs are tokenized, and refuses
   * it at once (429) when fewer are free, or when the work already queued, without its own inputs
   * (whose token counts are not known yet), would make it miss its deadline or the latency target.
   * So a request that will be refused never waits for the tokenizer pool, and one admitted cannot
   * lose its slots while it is tokenized.
   */
  hold(model: ServedModel, count: number, timeoutMs: number, tokenRows = false): R {
    if (!(count >= 1)) throw new ValidationError('inputs must not be empty');
    const held = this.submitter.reserve(model.plan.index, count, tokenRows);
    try {
      this.admitWait(this.submitter.predictedWaitMs(model.plan.index), timeoutMs);
    } catch (err) {
      held.release();
      throw err;
    }
    return held;
  }

  /** `held` grown to `count` slots (a chunked request's windows, known once tokenized): all or none, 429 when fewer are free. */
  grow(held: R & { size: number; absorb(other: R): void }, model: ServedModel, count: number, tokenRows = false): void {
    if (held.size >= count) return;
    held.absorb(this.submitter.reserve(model.plan.index, count - held.size, tokenRows));
  }

  /** Refuses at once (429) a request the queue ahead of it would make miss its deadline or the latency target. */
  admitWait(predictedWaitMs: number, timeoutMs: number): void {
    const d = admission({ predictedWaitMs, remainingMs: timeoutMs, ...(this.targetMs !== undefined ? { targetMs: this.targetMs } : {}) });
    if (!d.admit) {
      throw new OverloadedError(`predicted wait ${Math.round(d.predictedWaitMs)} ms exceeds the ${this.targetMs !== undefined ? 'latency target' : "request's deadline"}; retry later`, d.retryAfterSeconds);
    }
  }

  /**
   * The early refusal, before a request's body is read: when none of the models it may go to has
   * a free slot, or, with a latency target, when each one's queued work alone would miss it. A
   * model `mayHit` says the result cache may answer is never refused here. Null: it may go on.
   */
  refusalOf(candidates: readonly ServedModel[], mayHit: (m: ServedModel) => boolean): OverloadedError | null {
    if (candidates.every((m) => this.submitter.freeSlots(m.plan.index) === 0 && !mayHit(m))) {
      return new OverloadedError('every request slot of the model is in use; retry shortly');
    }
    if (this.targetMs === undefined) return null; // the limit is the request's deadline, which its body may set
    let refusal: OverloadedError | null = null;
    for (const m of candidates) {
      const d = admission({ predictedWaitMs: this.submitter.predictedWaitMs(m.plan.index), remainingMs: Infinity, targetMs: this.targetMs });
      if (d.admit || mayHit(m)) return null;
      refusal ??= new OverloadedError(`predicted wait ${Math.round(d.predictedWaitMs)} ms exceeds the latency target; retry later`, d.retryAfterSeconds);
    }
    return refusal;
  }
}
