/**
 * Large client batches, streamed through the slots a part at a time.
 *
 * A request of many inputs (up to --max-client-batch-size, a bound on memory,
 * not on the batcher) never holds more than `partSize` slots per part and
 * `PARTS_IN_FLIGHT` parts at once: its first part's slots are taken, and it
 * is refused, like any request's (Infer.hold: 429 at once when none are
 * free); each later part takes its slots as an earlier part's come back. So
 * a client with 1,000 texts gets one answer, in order, and interactive callers
 * keep finding free slots meanwhile. Its inputs carry their index in the
 * whole request (the slab's H_CHUNK), so the scheduler puts its later inputs
 * after other clients' (scheduler.ts `orderKey`), and its priority class and
 * deadline, so weighted fair queueing and admission treat it as any request.
 *
 * A later part that finds no free slots (other clients took them) waits for
 * them, up to the request's deadline: the request was accepted, and is not
 * refused halfway. Its first failing part fails the request and cancels the
 * parts in flight, so it leaves no work behind.
 */
import { Cancellation } from '../shared/cancel.js';
import { nowMs } from '../shared/clock.js';
import { CancelledError, DeadlineExceededError, OverloadedError } from '../shared/errors.js';
import type { RequestRows, SlabSubmitter, SlotReservation, SubmitInput } from '../shared/submitter.js';

/** Parts of one request queued or running at once: one runs while the next waits its turn. */
export const PARTS_IN_FLIGHT = 2;

/** How often a part waiting for free slots looks again, ms. */
const SLOT_POLL_MS = 2;

/** The most slots one part of a large request takes: enough for full batches, a small share of the model's slots. */
export function partSizeFor(slotCount: number, maxBatchSize: number): number {
  return Math.max(1, Math.min(slotCount >> 2, Math.max(maxBatchSize, 32)));
}

export interface PartedRequest {
  submitter: SlabSubmitter;
  model: number;
  inputs: readonly SubmitInput[];
  /** The first part's slots, taken before the inputs were tokenized. */
  first: SlotReservation;
  partSize: number;
  deadline: number;
  priority: number | undefined;
  cancel: Cancellation | undefined;
}

/** Runs `r.inputs` part by part (see the header); the rows of all of them, in order. */
export async function submitInParts(r: PartedRequest): Promise<RequestRows> {
  const n = r.inputs.length;
  const parts = Math.ceil(n / r.partSize);
  const out = { rows: undefined as Float32Array | undefined, width: 0, queueMs: 0, inferenceMs: 0 };
  // Each part has its own cancellation (a Cancellation has one listener); the caller's, or a failed part, cancels them all.
  const live = new Set<Cancellation>();
  let failure: { err: unknown } | undefined;
  const stop = (reason: string) => {
    for (const c of live) c.cancel(reason);
  };
  r.cancel?.listen(stop);
  let next = 0;
  const runPart = async (held: SlotReservation | undefined): Promise<void> => {
    const from = next++ * r.partSize;
    const part = r.inputs.slice(from, Math.min(n, from + r.partSize));
    const reservation = held ?? (await reserveWaiting(r, part.length, () => failure !== undefined));
    const cancel = new Cancellation();
    live.add(cancel);
    try {
      const got = await r.submitter.submitRequest(r.model, part, { deadline: r.deadline, priority: r.priority, cancel, reservation, firstInput: from });
      out.rows ??= new Float32Array(n * got.width);
      out.rows.set(got.rows, from * got.width);
      out.width = got.width;
      out.queueMs = Math.max(out.queueMs, got.queueMs);
      out.inferenceMs = Math.max(out.inferenceMs, got.inferenceMs);
    } finally {
      live.delete(cancel);
      reservation.release(); // nothing is left in it once submitted; all of it if the wait failed
    }
  };
  /** One lane: parts one after another, each taking the slots the lane's previous part gave back. */
  const lane = async (held: SlotReservation | undefined): Promise<void> => {
    try {
      for (let first = true; next < parts && !failure; first = false) await runPart(first ? held : undefined);
    } catch (err) {
      failure ??= { err };
      stop('sibling_failed');
    }
  };
  try {
    await Promise.all([lane(r.first), ...Array.from({ length: Math.min(PARTS_IN_FLIGHT, parts) - 1 }, () => lane(undefined))]);
  } finally {
    r.first.release();
    r.cancel?.unlisten(stop);
  }
  if (failure) throw failure.err;
  return { rows: out.rows!, width: out.width, queueMs: out.queueMs, inferenceMs: out.inferenceMs };
}

/** `count` slots for a later part: taken as soon as they are free, up to the deadline (or the caller's cancel). */
async function reserveWaiting(r: PartedRequest, count: number, givenUp: () => boolean): Promise<SlotReservation> {
  for (;;) {
    if (r.cancel?.cancelled || givenUp()) throw new CancelledError();
    try {
      return r.submitter.reserve(r.model, count);
    } catch (err) {
      if (!(err instanceof OverloadedError)) throw err;
    }
    if (nowMs() >= r.deadline) throw new DeadlineExceededError('the rest of the client batch found no free slots before its deadline');
    await new Promise((resolve) => setTimeout(resolve, SLOT_POLL_MS));
  }
}
