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
 * Each part is prepared (tokenized, looked up in the result cache) when its
 * turn comes, the next one while this one runs, so the device starts on the
 * first part instead of waiting for the whole batch to be tokenized.
 *
 * A later part that finds no free slots (other clients took them) waits for
 * them, up to the request's deadline: the request was accepted, and is not
 * refused halfway. Its first failing part (an input too long, one the model
 * fails on) fails the request and cancels the parts in flight, so it leaves
 * no work behind.
 */
import { Cancellation } from './cancel.js';
import { nowMs } from '../shared/clock.js';
import { CancelledError, DeadlineExceededError, OverloadedError } from '../shared/errors.js';
import { mergeTrace, type RequestRows, type SlabSubmitter, type SubmitInput } from './submitter.js';
import type { SlotReservation } from '../shared/slab.js';
import type { SpanIds } from '../shared/trace-context.js';

/** Parts of one request queued or running at once: one runs while the next waits its turn. */
export const PARTS_IN_FLIGHT = 2;

/** How often a part waiting for free slots looks again, ms. */
const SLOT_POLL_MS = 2;

/** The most slots one part of a large request takes: enough for full batches, a small share of the model's slots. */
export function partSizeFor(slotCount: number, maxBatchSize: number): number {
  return Math.max(1, Math.min(slotCount >> 2, Math.max(maxBatchSize, 32)));
}

/** Rows known without running them (the result cache, shared/result-cache.ts): found before a part runs, stored after. */
export interface PartCache {
  lookUp(inputs: readonly SubmitInput[]): { rows: Float32Array; missing: number[] };
  /** The part's rows: those found, and `ran` (the missing inputs' rows, in order), stored. */
  fill(inputs: readonly SubmitInput[], look: { rows: Float32Array; missing: number[] }, ran: Float32Array): Float32Array;
}

export interface PartedRequest {
  submitter: SlabSubmitter;
  model: number;
  /** Inputs in the whole request. */
  count: number;
  /** Floats in one input's row. */
  width: number;
  /** Inputs [from, to) ready to run (tokenized and checked); `cancel` stops that work if the request ends first. */
  prepare(from: number, to: number, cancel: Cancellation): Promise<readonly SubmitInput[]>;
  /** Told the first part's inputs before it runs: admission on its tokens (throws to refuse). */
  admit?(first: readonly SubmitInput[]): void;
  cache?: PartCache | undefined;
  /** The first part's slots, taken before anything was prepared; or, absent, `takeFirst` takes them once the part is looked up. */
  first?: SlotReservation | undefined;
  /** Slots for the first part, taken at once or refused (429): with the cache, after the lookup, so a part the cache answers needs none. */
  takeFirst?(count: number): SlotReservation;
  partSize: number;
  deadline: number;
  priority: number | undefined;
  cancel: Cancellation | undefined;
  /** The request's sampled span (tracing): each part's slots carry it. */
  trace?: SpanIds | undefined;
}

/** The rows of a parted request, and whether the cache answered every input. */
export type PartedRows = RequestRows & { allCached: boolean };

/** Runs a request part by part (see the header); the rows of all its inputs, in order. */
export async function submitInParts(r: PartedRequest): Promise<PartedRows> {
  const parts = Math.ceil(r.count / r.partSize);
  const out: PartedRows = { rows: new Float32Array(r.count * r.width), width: r.width, queueMs: 0, inferenceMs: 0, allCached: true };
  // Every stage in flight has its own cancellation (a Cancellation has one listener); the caller's, or a failed part, cancels them all.
  const live = new Set<Cancellation>();
  let failure: { err: unknown } | undefined;
  const stop = (reason: string) => {
    for (const c of live) c.cancel(reason);
  };
  r.cancel?.listen(stop);
  const tracked = async <T>(work: (c: Cancellation) => Promise<T>): Promise<T> => {
    const c = new Cancellation();
    live.add(c);
    try {
      return await work(c);
    } finally {
      live.delete(c);
    }
  };
  // Part p's inputs, prepared once, on first ask: a lane asks for the part after its own as it starts one.
  const prepared = new Map<number, Promise<readonly SubmitInput[]>>();
  const inputsOf = (p: number) => {
    let x = prepared.get(p);
    if (!x) {
      x = tracked((c) => r.prepare(p * r.partSize, Math.min(r.count, (p + 1) * r.partSize), c));
      x.catch(() => {}); // a part never run (the request failed first) leaves no unhandled rejection
      prepared.set(p, x);
    }
    return x;
  };
  let next = 0;
  const runPart = async (held: SlotReservation | undefined): Promise<void> => {
    const p = next++;
    if (p + 1 < parts) void inputsOf(p + 1);
    const inputs = await inputsOf(p);
    if (p === 0) r.admit?.(inputs);
    const look = r.cache?.lookUp(inputs);
    const run = look ? look.missing.map((i) => inputs[i]!) : inputs;
    if (run.length === 0) {
      out.rows.set(look!.rows, p * r.partSize * r.width);
      held?.release();
      return;
    }
    out.allCached = false;
    const reservation = held ?? (p === 0 && r.takeFirst ? r.takeFirst(run.length) : await reserveWaiting(r, run.length, () => failure !== undefined));
    try {
      const opts = { deadline: r.deadline, priority: r.priority, reservation, firstInput: p * r.partSize, trace: r.trace };
      const got = await tracked((cancel) => r.submitter.submitRequest(r.model, run, { ...opts, cancel }));
      if (got.trace) mergeTrace(out, got.trace);
      out.rows.set(look ? r.cache!.fill(inputs, look, got.rows) : got.rows, p * r.partSize * r.width);
      out.queueMs = Math.max(out.queueMs, got.queueMs);
      out.inferenceMs = Math.max(out.inferenceMs, got.inferenceMs);
    } finally {
      reservation.release(); // slots the cache made unneeded; nothing else is left once submitted
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
    r.first?.release();
    r.cancel?.unlisten(stop);
  }
  if (failure) throw failure.err;
  return out;
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
