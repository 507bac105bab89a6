/**
 * A slab: one SharedArrayBuffer per model holding fixed-size request slots,
 * the queues that move slot indices between threads, and the counters the
 * inference thread keeps for metrics. Every thread maps the same buffer, so a
 * request travels as a slot index; its token ids are written once by the
 * submitting thread and read once by the inference thread.
 *
 * Layout (each region 64-byte aligned):
 *   submit ring   IndexQueue  slot indices queued for the inference thread
 *   free list     IndexQueue  slot indices ready to be taken
 *   completions   IndexQueue  x owners: finished slots, one queue per owner thread
 *   headers       Int32  x HEADER_I32 per slot   (state, generation, ...)
 *   times         Float64 x TIMES_F64 per slot   (enqueued at, deadline)
 *   ids           Int32  x maxLength per slot    token ids
 *   typeIds       Uint8  x maxLength per slot    token type ids (0 or 1 for BERT)
 *   output        Float32 x outputWidth per slot the row the model returned
 *   token free    IndexQueue  pages of the token area ready to be taken (models with per-token outputs)
 *   tokens        Float32 x maxLength x tokenWidth per page: one input's token vectors
 *   traces        Int32 x TRACE_I32 per slot     the request span it carries, the batch span it ran in (trace-context.ts)
 *   counters      Float64 x COUNTERS             written by the inference thread only
 *   costs         Float64 x MAX_BUCKETS x 3      the fitted cost model (fixed ms, ms per row, samples)
 *   accounts      Int32 x ACCOUNTS               shared tallies (queued padded tokens), Atomics only
 *
 * Slot life cycle (every transition is an Atomics.compareExchange, so a cancel
 * racing a completion has exactly one winner):
 *
 *   FREE -> FILLING -> QUEUED -> RUNNING -> DONE | FAILED  -> FREE   (owner frees)
 *                        |          |
 *                        +----------+-> CANCELLED -> FREE          (inference thread frees)
 *
 * Who frees a slot: the side that sees it last. The owner frees DONE and
 * FAILED slots after reading them; a cancelled slot may still sit in the
 * inference thread's queue, so that thread frees it when it meets it. A slot
 * index is therefore never in two places at once, and the generation counter
 * (bumped on every acquire) lets an owner check that a completion belongs to
 * the request it is waiting for.
 */
import { TRACE_I32, writeRequestSpan, type SpanIds } from './trace-context.js';
import { IndexQueue } from './index-queue.js';
import { bucketFor } from './batching.js';
import { nowMs } from './clock.js';
import { OverloadedError } from './errors.js';

export const SlotState = {
  FREE: 0,
  FILLING: 1,
  QUEUED: 2,
  RUNNING: 3,
  DONE: 4,
  FAILED: 5,
  CANCELLED: 6,
} as const;
export type SlotStateValue = (typeof SlotState)[keyof typeof SlotState];

/** Why a slot ended FAILED (header field H_ERROR). */
export const SlotError = {
  NONE: 0,
  INFERENCE: 1, // the batch run threw
  DEADLINE: 2, // dropped before running: its deadline had passed
  SHUTDOWN: 3, // the inference thread stopped before running it
  RESTARTED: 4, // the inference thread died or hung with it queued or running; a new one was started
  INPUT: 5, // its batch failed, and split in halves, this input alone still failed while others ran
} as const;

// Header fields (int32 each).
export const H_STATE = 0;
export const H_GENERATION = 1;
export const H_LENGTH = 2; // real tokens, [CLS] and [SEP] included
export const H_PRIORITY = 3;
export const H_OWNER = 4;
export const H_ERROR = 5;
/** Which chunk of its client request this input is (INTERLEAVE_CHUNK inputs a chunk). */
export const H_CHUNK = 6;
/** Inputs of one client request per chunk: a large request is interleaved with others chunk by chunk. */
export const INTERLEAVE_CHUNK = 8;
/**
 * Which inference thread holds the slot (written by that thread, reset by the
 * owner at submit): 0 none (the owner's, or on the submit ring), else
 * {@link holderMark} of the thread's epoch, and whether the slot has left its
 * queues (into a batch, or expired or cancelled). When a thread dies, this
 * tells the main thread which slots were that thread's to answer.
 */
export const H_HOLDER = 7;
/**
 * Leading tokens left out of the pooling (the model runs on them all): an
 * instruction prompt's, [CLS] with it, for a model whose pooling config says
 * include_prompt false. 0 for every other input.
 */
export const H_POOL_FROM = 8;
/**
 * The slot's page of the token area plus one (0: none): a request for token
 * vectors (/embed_all) takes a page with each slot, the inference thread
 * writes the input's token vectors there, the owner copies them out, and the
 * page goes back with the slot ({@link Slab.freeSlot}).
 */
export const H_TOKEN_PAGE = 9;
/**
 * Leading tokens the attention sees, when fewer than H_LENGTH (0: all): the
 * rest run with attention mask 0 and still give a vector (ColBERT's query
 * expansion: [MASK] tokens that attend but are not attended to).
 */
export const H_ATTENDED = 10;
export const HEADER_I32 = 11;

/** H_HOLDER of a slot taken by the inference thread of `epoch`: queued there, or dequeued (in a batch, or leaving). */
export function holderMark(epoch: number, dequeued: boolean): number {
  return 1 + 2 * epoch + (dequeued ? 1 : 0);
}

// Time fields (float64 each, epoch ms from clock.nowMs()).
export const T_ENQUEUED = 0;
export const T_DEADLINE = 1;
export const T_STARTED = 2; // when its batch started running
export const T_FINISHED = 3; // when its batch finished
export const TIMES_F64 = 4;

/** Counters the inference thread bumps after each batch (float64, single writer). */
export const Counter = {
  BATCHES: 0,
  ROWS: 1,
  REAL_TOKENS: 2,
  PADDED_TOKENS: 3,
  FAILED_BATCHES: 4,
  RUN_MS: 5, // summed wall time of batch runs
  DROPPED_EXPIRED: 6,
  CANCELLED_SKIPPED: 7,
  QUEUED: 8, // requests waiting in the scheduler (a gauge)
  EXPIRED_TOKENS: 9,
  BUSY_UNTIL: 10, // epoch ms when the batch running now is predicted to end (admission adds what is left of it) // real tokens of requests dropped because their deadline passed (work saved)
  SPLIT_RUNS: 11, // runs of half a failed batch (or a half of a half...), retried to find the inputs that fail
  ISOLATED_INPUTS: 12, // inputs failed alone while the rest of their batch ran (SlotError.INPUT)
  RUN_CORES: 13, // cores one run of this model keeps busy (intra-op threads on CPU, 0 on a GPU), set when it is served
} as const;
const COUNTERS = 16;

/** Cost model, per bucket: [fixed ms, ms per row, samples]. */
export const MAX_BUCKETS = 64;
export const COST_FIXED = 0;
export const COST_PER_ROW = 1;
export const COST_SAMPLES = 2;
const COST_F64 = 3;

/** Shared tallies updated with Atomics by owners and the inference thread. */
export const Account = {
  QUEUED_TOKENS: 0, // padded tokens submitted and not yet taken into a batch (or dropped)
  QUEUED_BY_BUCKET: 8, // + bucket index: requests submitted into that bucket and not yet taken
} as const;
const ACCOUNTS = 8 + MAX_BUCKETS;

export interface SlabLayout {
  slotCount: number;
  maxLength: number;
  outputWidth: number;
  owners: number;
  /** Pages of the token area (one input's token vectors each; at most slotCount); 0 or absent: none. */
  tokenPages?: number;
  /** Floats per token vector in the token area. */
  tokenWidth?: number;
}

const ALIGN = 64;
const align = (n: number) => Math.ceil(n / ALIGN) * ALIGN;

function offsets(l: SlabLayout) {
  let at = 0;
  const take = (bytes: number) => {
    const start = at;
    at = align(at + bytes);
    return start;
  };
  const q = IndexQueue.byteLength(l.slotCount);
  const submit = take(q);
  const free = take(q);
  const completions = Array.from({ length: l.owners }, () => take(q));
  const headers = take(l.slotCount * HEADER_I32 * 4);
  const times = take(l.slotCount * TIMES_F64 * 8);
  const ids = take(l.slotCount * l.maxLength * 4);
  const typeIds = take(l.slotCount * l.maxLength);
  const output = take(l.slotCount * l.outputWidth * 4);
  const pages = l.tokenPages ?? 0;
  const tokenFree = take(pages > 0 ? IndexQueue.byteLength(pages) : 0);
  const tokens = take(pages * l.maxLength * (l.tokenWidth ?? 0) * 4);
  const traces = take(l.slotCount * TRACE_I32 * 4);
  const counters = take(COUNTERS * 8);
  const costs = take(MAX_BUCKETS * COST_F64 * 8);
  const accounts = take(ACCOUNTS * 4);
  return { submit, free, completions, headers, times, ids, typeIds, output, tokenFree, tokens, traces, counters, costs, accounts, total: at };
}

export class Slab {
  readonly buffer: SharedArrayBuffer;
  readonly layout: SlabLayout;
  readonly submit: IndexQueue;
  readonly free: IndexQueue;
  readonly completions: IndexQueue[];
  readonly headers: Int32Array;
  readonly times: Float64Array;
  readonly ids: Int32Array;
  readonly typeIds: Uint8Array;
  readonly output: Float32Array;
  /** Free pages of the token area (null: the model has none). */
  readonly tokenFree: IndexQueue | null;
  readonly tokens: Float32Array;
  /** Each slot's trace context (TRACE_I32 words at slot * TRACE_I32: trace-context.ts). */
  readonly traces: Int32Array;
  readonly counters: Float64Array;
  readonly costs: Float64Array;
  readonly accounts: Int32Array;

  /**
   * Allocates and initialises a slab: every slot FREE and on the free list. In `reuse` when given
   * and of exactly this layout's size (a buffer an unloaded model no thread touches any more: zeroed
   * first), else in a new SharedArrayBuffer.
   */
  static create(layout: SlabLayout, reuse?: SharedArrayBuffer): Slab {
    validateLayout(layout);
    const bytes = Slab.byteLength(layout);
    let buffer: SharedArrayBuffer;
    if (reuse && reuse.byteLength === bytes) {
      new Uint8Array(reuse).fill(0);
      buffer = reuse;
    } else buffer = new SharedArrayBuffer(bytes);
    const slab = new Slab(buffer, layout);
    slab.submit.init();
    slab.free.init();
    for (const q of slab.completions) q.init();
    for (let s = 0; s < layout.slotCount; s++) slab.free.push(s);
    if (slab.tokenFree) {
      slab.tokenFree.init();
      for (let p = 0; p < layout.tokenPages!; p++) slab.tokenFree.push(p);
    }
    return slab;
  }

  /** Bytes a slab of `layout` takes. */
  static byteLength(layout: SlabLayout): number {
    return offsets(layout).total;
  }

  /** Maps a slab another thread created (no initialisation). */
  constructor(buffer: SharedArrayBuffer, layout: SlabLayout) {
    const o = offsets(layout);
    if (buffer.byteLength < o.total) throw new RangeError('slab buffer is smaller than its layout');
    this.buffer = buffer;
    this.layout = layout;
    this.submit = new IndexQueue(buffer, o.submit, layout.slotCount);
    this.free = new IndexQueue(buffer, o.free, layout.slotCount);
    this.completions = o.completions.map((at) => new IndexQueue(buffer, at, layout.slotCount));
    this.headers = new Int32Array(buffer, o.headers, layout.slotCount * HEADER_I32);
    this.times = new Float64Array(buffer, o.times, layout.slotCount * TIMES_F64);
    this.ids = new Int32Array(buffer, o.ids, layout.slotCount * layout.maxLength);
    this.typeIds = new Uint8Array(buffer, o.typeIds, layout.slotCount * layout.maxLength);
    this.output = new Float32Array(buffer, o.output, layout.slotCount * layout.outputWidth);
    this.tokenFree = layout.tokenPages ? new IndexQueue(buffer, o.tokenFree, layout.tokenPages) : null;
    this.tokens = new Float32Array(buffer, o.tokens, (layout.tokenPages ?? 0) * layout.maxLength * (layout.tokenWidth ?? 0));
    this.traces = new Int32Array(buffer, o.traces, layout.slotCount * TRACE_I32);
    this.counters = new Float64Array(buffer, o.counters, COUNTERS);
    this.costs = new Float64Array(buffer, o.costs, MAX_BUCKETS * COST_F64);
    this.accounts = new Int32Array(buffer, o.accounts, ACCOUNTS);
  }

  /** The cost model's coefficients for bucket index `b` (written by the inference thread). */
  cost(b: number): { fixedMs: number; perRowMs: number; samples: number } {
    const at = b * COST_F64;
    return { fixedMs: this.costs[at + COST_FIXED]!, perRowMs: this.costs[at + COST_PER_ROW]!, samples: this.costs[at + COST_SAMPLES]! };
  }

  setCost(b: number, fixedMs: number, perRowMs: number, samples: number): void {
    const at = b * COST_F64;
    this.costs[at + COST_FIXED] = fixedMs;
    this.costs[at + COST_PER_ROW] = perRowMs;
    this.costs[at + COST_SAMPLES] = samples;
  }

  state(slot: number): number {
    return Atomics.load(this.headers, slot * HEADER_I32 + H_STATE);
  }

  /** Atomically moves `slot` from `from` to `to`; returns the state it found (=== from on success). */
  transition(slot: number, from: number, to: number): number {
    return Atomics.compareExchange(this.headers, slot * HEADER_I32 + H_STATE, from, to);
  }

  header(slot: number, field: number): number {
    return Atomics.load(this.headers, slot * HEADER_I32 + field);
  }

  setHeader(slot: number, field: number, value: number): void {
    Atomics.store(this.headers, slot * HEADER_I32 + field, value);
  }

  time(slot: number, field: number): number {
    return this.times[slot * TIMES_F64 + field]!;
  }

  setTime(slot: number, field: number, value: number): void {
    this.times[slot * TIMES_F64 + field] = value;
  }

  /** Token ids of `slot` (a view, first `length` entries are real). */
  slotIds(slot: number): Int32Array {
    const n = this.layout.maxLength;
    return this.ids.subarray(slot * n, slot * n + n);
  }

  slotTypeIds(slot: number): Uint8Array {
    const n = this.layout.maxLength;
    return this.typeIds.subarray(slot * n, slot * n + n);
  }

  slotOutput(slot: number): Float32Array {
    const w = this.layout.outputWidth;
    return this.output.subarray(slot * w, slot * w + w);
  }

  /** The first `length` token vectors of page `page` (a view). */
  pageTokens(page: number, length: number): Float32Array {
    const size = this.layout.maxLength * (this.layout.tokenWidth ?? 0);
    return this.tokens.subarray(page * size, page * size + length * (this.layout.tokenWidth ?? 0));
  }

  /**
   * FREE now (or never taken): its token page, if it holds one, goes back to
   * the token area, then the slot onto the free list. Every side that frees a
   * slot frees it here, so a page never outlives its slot.
   */
  freeSlot(slot: number): void {
    const page = this.header(slot, H_TOKEN_PAGE);
    if (page > 0) {
      this.setHeader(slot, H_TOKEN_PAGE, 0);
      this.tokenFree!.push(page - 1);
    }
    this.free.push(slot);
  }

  /**
   * Takes `count` free slots for `owner`, all or none, each with a page of the
   * token area when `pages`: FREE -> FILLING, marked as the owner's, its
   * generation moved. With fewer free, OverloadedError and nothing is held.
   */
  claim(count: number, owner: number, pages: boolean): number[] {
    const slots = popAll(this.free, count);
    const { slotCount, tokenPages = 0 } = this.layout;
    if (!slots) {
      throw new OverloadedError(
        count > slotCount
          ? `${count} inputs need more slots than the ${slotCount} this model has (--slots-per-model)`
          : `${count} request slot${count === 1 ? '' : 's'} needed, fewer free of ${slotCount}; retry shortly`,
      );
    }
    const taken = pages ? popAll(this.tokenFree, count) : null;
    if (pages && !taken) {
      for (const slot of slots) this.free.push(slot); // still FREE, and holding no page
      throw new OverloadedError(
        count > tokenPages
          ? `${count} inputs of token vectors need more than the ${tokenPages} the model's token area holds at once (--token-output-mb)`
          : `${count} inputs of token vectors need room in the model's token area, fewer of its ${tokenPages} free; retry shortly`,
      );
    }
    for (const [i, slot] of slots.entries()) {
      if (this.transition(slot, SlotState.FREE, SlotState.FILLING) !== SlotState.FREE) {
        throw new Error(`slot ${slot} on the free list is not FREE (state ${this.state(slot)})`);
      }
      // Owner and holder before the generation moves: the main thread, reclaiming a dead thread's
      // slots, reads the generation around them to tell a slot taken again from one it held.
      this.setHeader(slot, H_HOLDER, 0);
      this.setHeader(slot, H_OWNER, owner);
      Atomics.add(this.headers, slot * HEADER_I32 + H_GENERATION, 1);
      if (taken) this.setHeader(slot, H_TOKEN_PAGE, taken[i]! + 1);
    }
    return slots;
  }

  /** Gives back a claimed slot that was never queued: FILLING -> FREE. */
  unclaim(slot: number): void {
    if (this.transition(slot, SlotState.FILLING, SlotState.FREE) !== SlotState.FILLING) {
      throw new Error(`reserved slot ${slot} is not FILLING (state ${this.state(slot)})`);
    }
    this.freeSlot(slot);
  }

  /**
   * Writes one input into a claimed slot and queues it for the inference
   * thread: FILLING -> QUEUED, counted in its bucket of `bucketLengths`,
   * pushed on the submit ring. Returns the slot's generation, which its
   * completion must still carry.
   */
  enqueue(slot: number, x: SlotInput, request: SlotRequest, bucketLengths: readonly number[]): number {
    const len = x.ids.length;
    const bucket = bucketFor(bucketLengths, len);
    if (bucket < 0) throw new RangeError(`an input of ${len} tokens is longer than the longest bucket, ${bucketLengths.at(-1)}`);
    this.slotIds(slot).set(x.ids);
    const types = this.slotTypeIds(slot);
    if (x.typeIds) types.set(x.typeIds);
    else types.fill(0, 0, len);
    this.setHeader(slot, H_LENGTH, len);
    this.setHeader(slot, H_POOL_FROM, x.poolFrom ?? 0);
    this.setHeader(slot, H_ATTENDED, x.attended ?? 0);
    this.setHeader(slot, H_PRIORITY, request.priority);
    this.setHeader(slot, H_CHUNK, Math.floor(request.input / INTERLEAVE_CHUNK));
    this.setHeader(slot, H_ERROR, SlotError.NONE);
    writeRequestSpan(this.traces, slot * TRACE_I32, request.trace);
    this.setTime(slot, T_ENQUEUED, nowMs());
    this.setTime(slot, T_DEADLINE, request.deadline);
    const generation = this.header(slot, H_GENERATION);
    this.transition(slot, SlotState.FILLING, SlotState.QUEUED);
    Atomics.add(this.accounts, Account.QUEUED_TOKENS, bucketLengths[bucket]!);
    Atomics.add(this.accounts, Account.QUEUED_BY_BUCKET + bucket, 1);
    // The ring holds slotCount entries and a slot index is in it at most once: it cannot be full.
    if (!this.submit.push(slot)) throw new Error('submit ring full: a slot index was queued twice');
    return generation;
  }

  /** Frees a slot its owner has read (or given up): `state` -> FREE. */
  release(slot: number, state: number): void {
    if (this.transition(slot, state, SlotState.FREE) !== state) {
      throw new Error(`slot ${slot} changed state while its owner released it`);
    }
    this.freeSlot(slot);
  }

  /**
   * This slab with private output and token regions: every other region is shared.
   * The inference thread gives its runners this view, so a batch writes its
   * rows here first and the loop copies them into the shared slots only after
   * checking the slots are still its own (a thread the main thread gave up,
   * returning late from a run, then writes into memory nobody reads).
   * `buffer` (privateOutputBytes long) puts those regions in memory the caller
   * shares with a session thread that runs the model (session-thread.ts).
   */
  withPrivateOutput(buffer?: SharedArrayBuffer): Slab {
    const view = new Slab(this.buffer, this.layout);
    const tokensAt = align(this.output.byteLength);
    const mem = buffer ?? new ArrayBuffer(this.privateOutputBytes);
    (view as { output: Float32Array }).output = new Float32Array(mem, 0, this.output.length);
    (view as { tokens: Float32Array }).tokens = new Float32Array(mem, tokensAt, this.tokens.length);
    return view;
  }

  /** Bytes the private output and token regions of this slab take (withPrivateOutput). */
  get privateOutputBytes(): number {
    return align(this.output.byteLength) + this.tokens.byteLength;
  }

  /** Slots not on the free list: being filled, queued, running, or waiting to be read. */
  slotsInUse(): number {
    return this.layout.slotCount - this.free.size();
  }

  /** Pages of the token area taken (with their slots, by requests for token vectors). */
  tokenPagesInUse(): number {
    return this.tokenFree ? (this.layout.tokenPages ?? 0) - this.tokenFree.size() : 0;
  }
}

function validateLayout(l: SlabLayout): void {
  for (const [k, v] of Object.entries(l)) {
    const optional = k === 'tokenPages' || k === 'tokenWidth';
    if (!Number.isInteger(v) || v < (optional ? 0 : 1)) throw new RangeError(`slab ${k} must be a ${optional ? 'whole number' : 'positive integer'}, got ${v}`);
  }
  if ((l.tokenPages ?? 0) > l.slotCount) throw new RangeError(`slab tokenPages (${l.tokenPages}) must not exceed slotCount (${l.slotCount})`);
  if ((l.tokenPages ?? 0) > 0 && !((l.tokenWidth ?? 0) > 0)) throw new RangeError('slab tokenWidth must be positive where there are token pages');
}

/** One input as its owner queues it: token ids with the special tokens, their type ids (null: all 0). */
export interface SlotInput {
  ids: ArrayLike<number>;
  typeIds: ArrayLike<number> | null;
  /** Leading tokens the pooling leaves out (H_POOL_FROM); default 0. */
  poolFrom?: number | undefined;
  /** Leading tokens the attention sees when fewer than all (H_ATTENDED: ColBERT's query expansion); default all. */
  attended?: number | undefined;
}

/** What a queued input carries of its request. */
export interface SlotRequest {
  /** Epoch ms after which it must not run. */
  deadline: number;
  /** Priority class index (0 = interactive). */
  priority: number;
  /** Its place among its client request's inputs (large requests are interleaved by chunks of these). */
  input: number;
  /** The request's sampled span, or null. */
  trace: SpanIds | null;
}

/**
 * Slots one request claimed before its inputs were ready: FILLING, its
 * owner's, on no queue, so no other request can take them (and a dead
 * gateway's are freed by the main thread as slots it left FILLING).
 * `take()` hands them out to fill; `release()` gives back those not taken.
 */
export class SlotReservation {
  readonly model: number;
  private readonly slab: Slab;
  private readonly slots: number[];
  private readonly onGiveBack: () => void;
  private released = false;

  /** `onGiveBack`: called for each slot given back unfilled. */
  constructor(model: number, slab: Slab, slots: number[], onGiveBack: () => void) {
    this.model = model;
    this.slab = slab;
    this.slots = slots;
    this.onGiveBack = onGiveBack;
  }

  /** Slots still held. */
  get size(): number {
    return this.released ? 0 : this.slots.length;
  }

  /** One held slot, now the caller's to fill; -1 when none is left (or after release). */
  take(): number {
    return this.released ? -1 : (this.slots.pop() ?? -1);
  }

  /** Takes over `other`'s slots (of the same model): a request that needs more once tokenized keeps one reservation. */
  absorb(other: SlotReservation): void {
    if (other.model !== this.model) throw new Error(`slots of model ${other.model} cannot join a reservation of model ${this.model}`);
    if (this.released) return other.release();
    for (let slot = other.take(); slot >= 0; slot = other.take()) this.slots.push(slot);
    other.release();
  }

  /** Gives back every slot not taken. Idempotent. */
  release(): void {
    if (this.released) return;
    this.released = true;
    for (let slot = this.slots.pop(); slot !== undefined; slot = this.slots.pop()) {
      this.onGiveBack();
      this.slab.unclaim(slot);
    }
  }
}

/** `count` entries of `queue`, all or none (those popped go back). */
function popAll(queue: IndexQueue | null, count: number): number[] | null {
  const popped: number[] = [];
  while (queue && popped.length < count) {
    const v = queue.pop();
    if (v === -1) break;
    popped.push(v);
  }
  if (popped.length === count) return popped;
  for (const v of popped) queue!.push(v);
  return null;
}
