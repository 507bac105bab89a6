/**
 * The owner side of the slabs: how a thread that accepts requests (a gateway,
 * or the in-process engine) hands token ids to the inference thread and gets
 * each result back, with no message per request. The slot transitions
 * themselves (claim, enqueue, release) are the slab's (shared/slab.ts); this
 * keeps which request waits on which slot.
 *
 * submitRequest(): claim a free slot per input (or take them from a
 *            reservation), write the inputs in, queue them, ring the
 *            inference thread's bell once; one promise for all the rows.
 * reserve(): claim a request's slots before its inputs are ready (all of them
 *            or none: OverloadedError at once), so it is refused before any
 *            work is spent on it (tokenizing) and cannot lose them meanwhile.
 * listen():  sleep on this owner's doorbell (Atomics.waitAsync); the
 *            inference thread rings it once per finished batch; drain this
 *            owner's completion queues and settle the waiting promises.
 * cancel:    moves the slot QUEUED|RUNNING -> CANCELLED; the inference
 *            thread never runs it (or drops its result) and frees it.
 *
 * A completion this owner has no request for is freed: a request it gave up
 * after its result was written, or one of a previous thread with this owner
 * index that died (the main thread starts a new one; src/main/server.ts).
 */
import { readBatchSpan, TRACE_I32, type SpanIds } from '../shared/trace-context.js';
import { predictedWaitMs, type BucketCost } from './admission.js';
import { bucketFor } from '../shared/batching.js';
import { Cancellation } from './cancel.js';
import { nowMs } from '../shared/clock.js';
import { LoneWait, type LoneWaitOptions } from './lone-wait.js';
import type { ControlBlock } from '../shared/control.js';
import type { Doorbell } from '../shared/doorbell.js';
import {
  CancelledError,
  DeadlineExceededError,
  EngineClosedError,
  InferenceError,
  InferenceRestartedError,
  InputFailedError,
  ModelUnloadedError,
  OverloadedError,
  SlabserveError,
  ValidationError,
} from '../shared/errors.js';
import {
  Account,
  Counter,
  H_ERROR,
  H_GENERATION,
  H_LENGTH,
  H_TOKEN_PAGE,
  Slab,
  SlotError,
  SlotReservation,
  SlotState,
  T_ENQUEUED,
  T_FINISHED,
  T_STARTED,
  type SlotInput,
} from '../shared/slab.js';

export interface SubmitOptions {
  /** Epoch ms after which the request must not run. */
  deadline: number;
  /** Priority class index (0 = interactive). */
  priority?: number;
  /** Which chunk of its client request this input is (for interleaving large requests). */
  chunk?: number;
  signal?: AbortSignal;
  /** Fill one of these slots (taken by {@link SlabSubmitter.reserve}) instead of taking a free one. */
  reservation?: SlotReservation;
}

/** One input of a request (its slot's contents: shared/slab.ts). */
export type SubmitInput = SlotInput;

/** How one request (all its inputs) is submitted: {@link SlabSubmitter.submitRequest}. */
export interface RequestSubmitOptions {
  /** Epoch ms after which the request must not run. */
  deadline: number;
  /** Priority class index (0 = interactive). */
  priority?: number;
  /** Cancels every input of the request still queued or running. */
  cancel?: Cancellation | undefined;
  /** Fill these slots (taken by {@link SlabSubmitter.reserve}) instead of taking free ones. */
  reservation?: SlotReservation | undefined;
  /** These inputs' place in their client request (a later part of a large one: core/client-batches.ts); default 0. */
  firstInput?: number | undefined;
  /** The request's sampled span, for its batches' spans to link to (tracing on); absent: not traced. */
  trace?: SpanIds | undefined;
}

/** One request's rows: input i's row is `rows.subarray(i * width, (i + 1) * width)` (a copy, out of the slab). */
export interface RequestRows {
  rows: Float32Array;
  width: number;
  /** Longest any of its inputs waited for its batch, ms. */
  queueMs: number;
  /** Longest batch run among its inputs, ms. */
  inferenceMs: number;
  /** With token pages taken (reserve's `tokens`): each input's token vectors, [length x tokenWidth] (copies). */
  tokens?: Float32Array[];
  tokenWidth?: number;
  /** A traced request: when its first input was queued, and its batches' run (epoch ms), and those batches' spans (each once). */
  trace?: RequestTrace;
}

export interface RequestTrace {
  enqueuedAt: number;
  startedAt: number;
  finishedAt: number;
  batches: SpanIds[];
}

/** `part` (a slot's, or a part of a client batch's) into a traced request's: the earliest queueing and start, the latest end, every batch once. */
export function mergeTrace(r: RequestRows, part: RequestTrace): void {
  const m = (r.trace ??= { enqueuedAt: Infinity, startedAt: Infinity, finishedAt: 0, batches: [] });
  m.enqueuedAt = Math.min(m.enqueuedAt, part.enqueuedAt);
  m.startedAt = Math.min(m.startedAt, part.startedAt);
  m.finishedAt = Math.max(m.finishedAt, part.finishedAt);
  for (const b of part.batches) if (!m.batches.some((x) => x.spanId === b.spanId)) m.batches.push(b);
}

/** A traced slot's times and the batch span it ran in, into its request's (RequestRows.trace). */
function traceOf(r: RequestRows, slab: Slab, slot: number): void {
  const batch = readBatchSpan(slab.traces, slot * TRACE_I32);
  const times = { enqueuedAt: slab.time(slot, T_ENQUEUED), startedAt: slab.time(slot, T_STARTED), finishedAt: slab.time(slot, T_FINISHED) };
  mergeTrace(r, { ...times, batches: batch ? [batch] : [] });
}

/** Why a request was cancelled and what it cost: `ran` when the device had already run it (work wasted). */
export interface CancelReport {
  model: number;
  reason: string;
  ran: boolean;
  tokens: number;
}

export interface SlotResult {
  /** A copy of the slot's output row. */
  output: Float32Array;
  /** Time queued before its batch started, ms. */
  queueMs: number;
  /** Time its batch ran, ms. */
  inferenceMs: number;
}

/** One submitted request: its slots, and the promise of all their rows. Settled once: rows, or the first error. */
class Ticket {
  readonly model: number;
  readonly slots: Int32Array;
  readonly generations: Int32Array;
  readonly result: RequestRows;
  /** Inputs not yet answered. */
  remaining: number;
  settled = false;
  resolve!: (r: RequestRows) => void;
  reject!: (e: Error) => void;
  readonly promise: Promise<RequestRows>;
  cancel: Cancellation | undefined;
  onCancel: ((reason: string) => void) | undefined;
  /** Whether its request is traced: its rows carry their batches' spans and times. */
  traced = false;

  constructor(model: number, count: number, width: number) {
    this.model = model;
    this.slots = new Int32Array(count);
    this.generations = new Int32Array(count);
    this.result = { rows: new Float32Array(count * width), width, queueMs: 0, inferenceMs: 0 };
    this.remaining = count;
    this.promise = new Promise<RequestRows>((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
    });
  }
}

export class SlabSubmitter {
  /** By model id (ModelPlan.index), as every per-model array here: holes where a model was removed. */
  private readonly slabs: Slab[];
  private readonly owner: number;
  private readonly control: ControlBlock;
  private readonly bell: Doorbell;
  /** pending[model][slot]: the request waiting on that slot, if any, and which of its inputs the slot holds. */
  private readonly pending: (Ticket | undefined)[][] = [];
  private readonly pendingInput: Int32Array[] = [];
  /** Inputs submitted and not yet settled. */
  private inFlight = 0;
  /** Slots held by reservations, not yet filled or given back. */
  private reserved = 0;
  /** Cancelled requests whose result was already written (model * 2^32 + slot): their completion is still to be drained and freed. */
  private readonly abandoned = new Set<number>();
  private closed = false;
  private listening = false;
  /** How this thread waits for the answer to a request alone in the server (gateway threads only: lone-wait.ts). */
  private readonly loneWait: LoneWait | undefined;

  /** Per model: bucket lengths and the batch capacity of each (for the queued-work tallies and admission). */
  private readonly buckets: { lengths: number[]; capacities: number[] }[] = [];
  /** Per model: scratch for predictedWaitMs (no allocation per request). */
  private readonly waitScratch: { request: Int32Array; queued: Int32Array; costs: BucketCost[] }[] = [];
  private readonly onCancel: ((r: CancelReport) => void) | undefined;

  constructor(
    slabs: Slab[],
    control: ControlBlock,
    owner: number,
    opts: { buckets?: { lengths: number[]; capacities: number[] }[]; onCancel?: (r: CancelReport) => void; loneWait?: LoneWaitOptions } = {},
  ) {
    this.control = control;
    this.owner = owner;
    this.bell = control.ownerBell(owner);
    this.loneWait = opts.loneWait && opts.loneWait.maxUs > 0 ? new LoneWait(this.bell, opts.loneWait) : undefined;
    this.slabs = [];
    slabs.forEach((slab, id) => this.addModel(id, slab, opts.buckets?.[id]));
    this.onCancel = opts.onCancel;
    this.drain(); // completions left for a previous thread with this owner index (it died): free them
  }

  /** Submits to one more model from now on: model id `id` (ModelPlan.index), its slab and its buckets. */
  addModel(id: number, slab: Slab, buckets: { lengths: number[]; capacities: number[] } = { lengths: [slab.layout.maxLength], capacities: [1] }): void {
    if (this.slabs[id]) throw new Error(`model ${id} is submitted to already`);
    this.slabs[id] = slab;
    this.pending[id] = new Array<Ticket | undefined>(slab.layout.slotCount);
    this.pendingInput[id] = new Int32Array(slab.layout.slotCount);
    this.buckets[id] = buckets;
    this.waitScratch[id] = {
      request: new Int32Array(buckets.lengths.length),
      queued: new Int32Array(buckets.lengths.length),
      costs: buckets.capacities.map((capacity) => ({ capacity, fixedMs: 0, perRowMs: 0 })),
    };
  }

  /**
   * Forgets model `id` (unloaded): false, and nothing changes, while this owner still waits on
   * any of its inputs. Its completions are drained first.
   */
  removeModel(id: number): boolean {
    const slab = this.slabs[id];
    if (!slab) return true;
    const queue = slab.completions[this.owner]!;
    for (let slot = queue.pop(); slot !== -1; slot = queue.pop()) this.complete(id, slab, slot);
    if (this.pending[id]!.some((t) => t !== undefined)) return false;
    for (const key of this.abandoned) if (Math.floor(key / 2 ** 32) === id) return false;
    delete this.slabs[id];
    delete this.pending[id];
    delete this.pendingInput[id];
    delete this.buckets[id];
    delete this.waitScratch[id];
    return true;
  }

  /** The bucket an input of `length` tokens is queued in (the one rule, shared/batching.ts); submitRequest refused longer ones. */
  private bucketOf(model: number, length: number): number {
    const b = bucketFor(this.buckets[model]!.lengths, length);
    if (b < 0) throw new RangeError(`an input of ${length} tokens is longer than model ${model}'s longest bucket`);
    return b;
  }

  /**
   * Predicted ms for the device to drain `model`'s queue with `inputs` added,
   * in full batches, from the cost model the inference thread publishes; 0
   * before it has measured anything.
   */
  predictedWaitMs(model: number, inputs: readonly { ids: ArrayLike<number> }[] = []): number {
    const slab = this.slabs[model]!;
    const { request, queued, costs } = this.waitScratch[model]!;
    let measured = false;
    for (let b = 0; b < costs.length; b++) {
      const c = slab.cost(b);
      costs[b]!.fixedMs = c.fixedMs;
      costs[b]!.perRowMs = c.perRowMs;
      if (c.samples > 0) measured = true;
      queued[b] = Atomics.load(slab.accounts, Account.QUEUED_BY_BUCKET + b);
      request[b] = 0;
    }
    if (!measured) return 0;
    for (const x of inputs) request[this.bucketOf(model, x.ids.length)]! += 1;
    // Plus what is left of the batch running now.
    return predictedWaitMs(queued, request, costs) + Math.max(0, slab.counters[Counter.BUSY_UNTIL]! - nowMs());
  }

  /** Inputs submitted by this owner and not yet settled, plus slots reserved for requests still being prepared (tokenized). */
  get pendingCount(): number {
    return this.inFlight + this.reserved;
  }

  /** Free slots of `model` right now (another thread may take some the next moment). */
  freeSlots(model: number): number {
    return this.slabs[model]?.free.size() ?? 0;
  }

  /**
   * Takes `count` free slots of `model` for one request, all or none: with
   * fewer free, rejects with OverloadedError at once and holds nothing. The
   * slots are FILLING and this owner's until submitted or released. With
   * `tokens`, each slot takes a page of the model's token area too (its
   * inputs' token vectors come back in RequestRows.tokens), all or none.
   */
  reserve(model: number, count: number, tokens = false): SlotReservation {
    if (this.closed) throw new EngineClosedError();
    const slab = this.slabs[model];
    if (!slab) throw new ModelUnloadedError();
    if (!(count >= 1)) throw new ValidationError(`a request needs at least one slot, not ${count}`);
    const slots = slab.claim(count, this.owner, tokens);
    this.reserved += count;
    return new SlotReservation(model, slab, slots, () => this.reserved--);
  }

  /**
   * Queues one request: an input per slot (token ids with [CLS]/[SEP], at most
   * the slab's maxLength each), in the slots of `opts.reservation` when given,
   * else in free ones taken now (all or none: OverloadedError at once). One
   * promise for all its rows; the first input that fails fails the request
   * and cancels the others, so a request never leaves work behind.
   */
  submitRequest(model: number, inputs: readonly SubmitInput[], opts: RequestSubmitOptions): Promise<RequestRows> {
    if (this.closed) return Promise.reject(new EngineClosedError());
    const slab = this.slabs[model];
    if (!slab) return Promise.reject(new ModelUnloadedError());
    const n = inputs.length;
    if (n < 1) return Promise.reject(new ValidationError('a request needs at least one input'));
    for (const x of inputs) {
      const len = x.ids.length;
      if (len < 1 || len > slab.layout.maxLength) return Promise.reject(new ValidationError(`input of ${len} tokens does not fit a slot of ${slab.layout.maxLength}`));
    }
    if (opts.cancel?.cancelled) return Promise.reject(new CancelledError());
    const held = opts.reservation;
    if (held && (held.model !== model || held.size < n)) {
      return Promise.reject(new Error(`the request's reserved slots (${held.size} of model ${held.model}) do not fit its ${n} inputs of model ${model}`));
    }
    const t = new Ticket(model, n, slab.layout.outputWidth);
    t.traced = opts.trace !== undefined;
    let slots: SlotReservation;
    try {
      slots = held ?? this.reserve(model, n);
    } catch (err) {
      return Promise.reject(err);
    }
    this.loneWait?.submitted(slab, this.inFlight > 0);
    const request = { deadline: opts.deadline, priority: opts.priority ?? 0, input: opts.firstInput ?? 0, trace: opts.trace ?? null };
    const lengths = this.buckets[model]!.lengths;
    for (let i = 0; i < n; i++, request.input++) {
      const slot = slots.take();
      t.slots[i] = slot;
      t.generations[i] = slab.enqueue(slot, inputs[i]!, request, lengths);
      this.pending[model]![slot] = t;
      this.pendingInput[model]![slot] = i;
    }
    this.reserved -= n;
    this.inFlight += n;
    if (!held) slots.release(); // nothing is left in it
    this.control.workerBell.ring(); // once per request, however many inputs
    if (opts.cancel) {
      t.cancel = opts.cancel;
      t.onCancel = (reason) => this.cancelTicket(t, reason);
      opts.cancel.listen(t.onCancel);
    }
    this.listen();
    return t.promise;
  }

  /**
   * Queues one input (token ids with [CLS]/[SEP], at most the slab's
   * maxLength) for `model`: {@link submitRequest} for a request of one input,
   * cancelled by an AbortSignal. Its row is a copy.
   */
  async submit(model: number, ids: ArrayLike<number>, typeIds: ArrayLike<number> | null, opts: SubmitOptions): Promise<SlotResult> {
    const { cancellation, stop } = Cancellation.following(opts.signal);
    try {
      const r = await this.submitRequest(model, [{ ids, typeIds }], { deadline: opts.deadline, priority: opts.priority ?? 0, cancel: cancellation, reservation: opts.reservation });
      return { output: r.rows, queueMs: r.queueMs, inferenceMs: r.inferenceMs };
    } finally {
      stop();
    }
  }

  /** Cancels every input of `t` still waiting and rejects it (the client went away, or a sibling failed). */
  private cancelTicket(t: Ticket, reason: string, err: Error = new CancelledError()): void {
    if (t.settled) return;
    t.settled = true;
    t.cancel?.unlisten(t.onCancel!);
    for (let i = 0; i < t.slots.length; i++) {
      const slot = t.slots[i]!;
      if (this.pending[t.model]![slot] === t) this.cancelSlot(t.model, slot, reason);
    }
    t.reject(err);
  }

  /** Moves one waiting input to CANCELLED (the inference thread frees it), or marks its finished result abandoned. */
  private cancelSlot(model: number, slot: number, reason: string): void {
    const slab = this.slabs[model]!;
    const tokens = slab.header(slot, H_LENGTH); // before the slot can be freed and reused
    // Queued or running: the inference thread will see CANCELLED and free the slot.
    // Done or failed already: its completion is on our queue; drain() frees it
    // when it finds no pending request for it.
    let ran = true;
    if (slab.transition(slot, SlotState.QUEUED, SlotState.CANCELLED) === SlotState.QUEUED) {
      ran = false; // never reaches the device: its work is saved
    } else if (slab.transition(slot, SlotState.RUNNING, SlotState.CANCELLED) !== SlotState.RUNNING) {
      // DONE or FAILED: the inference thread may not have pushed the completion
      // yet, so keep listening until drain() has freed it.
      this.abandoned.add(abandonKey(model, slot));
    }
    this.pending[model]![slot] = undefined;
    this.inFlight--;
    this.onCancel?.({ model, reason, ran, tokens });
  }

  /** Keeps one loop draining this owner's completions while requests are in flight. */
  private listen(): void {
    if (this.listening) return;
    this.listening = true;
    void (async () => {
      while (this.inFlight + this.abandoned.size > 0) {
        const seen = this.bell.read();
        this.drain();
        if (this.inFlight + this.abandoned.size === 0) break;
        if (this.mayWaitLone()) {
          // After the turn that submitted it: its handler has finished, and what it wrote is sent.
          await new Promise<void>((resolve) => setImmediate(resolve));
          if (this.mayWaitLone() && this.loneWait!.wait(seen)) continue;
        }
        await this.bell.wait(seen);
      }
      this.listening = false;
      // A completion may have arrived between the last drain and the flag reset.
      this.drain();
    })();
  }

  /** Whether this thread would hold itself for its one request in flight: a lone caller's, alone in the server (lone-wait.ts). */
  private mayWaitLone(): boolean {
    return this.loneWait !== undefined && this.inFlight === 1 && this.abandoned.size === 0 && this.loneWait.applies();
  }

  /** Settles every finished request on this owner's completion queues. */
  drain(): void {
    for (let m = 0; m < this.slabs.length; m++) {
      const slab = this.slabs[m];
      if (!slab) continue;
      const queue = slab.completions[this.owner]!;
      for (let slot = queue.pop(); slot !== -1; slot = queue.pop()) this.complete(m, slab, slot);
    }
  }

  private complete(model: number, slab: Slab, slot: number): void {
    const state = slab.state(slot);
    const t = this.pending[model]![slot];
    const i = this.pendingInput[model]![slot]!;
    if (!t || t.generations[i] !== slab.header(slot, H_GENERATION)) {
      // Its caller cancelled after the result was written, or it was a dead
      // predecessor's (this owner index, an earlier thread): nobody wants it.
      if (!t) this.abandoned.delete(abandonKey(model, slot));
      slab.release(slot, state);
      return;
    }
    this.pending[model]![slot] = undefined;
    this.inFlight--;
    if (state !== SlotState.DONE) {
      const err = slotError(slab.header(slot, H_ERROR));
      slab.release(slot, state);
      this.cancelTicket(t, 'request_failed', err); // its other inputs are cancelled
      return;
    }
    const r = t.result;
    r.rows.set(slab.slotOutput(slot), i * r.width);
    const page = slab.header(slot, H_TOKEN_PAGE);
    if (page > 0) {
      (r.tokens ??= new Array<Float32Array>(t.slots.length))[i] = slab.pageTokens(page - 1, slab.header(slot, H_LENGTH)).slice();
      r.tokenWidth = slab.layout.tokenWidth!;
    }
    const started = slab.time(slot, T_STARTED);
    r.queueMs = Math.max(r.queueMs, started - slab.time(slot, T_ENQUEUED));
    r.inferenceMs = Math.max(r.inferenceMs, slab.time(slot, T_FINISHED) - started);
    if (t.traced) traceOf(r, slab, slot);
    slab.release(slot, state);
    if (--t.remaining === 0 && !t.settled) {
      t.settled = true;
      t.cancel?.unlisten(t.onCancel!);
      t.resolve(r);
    }
  }

  /** Rejects every request still waiting (after the inference thread has stopped). */
  close(reason: SlabserveError = new EngineClosedError()): void {
    this.closed = true;
    this.drain();
    for (let m = 0; m < this.slabs.length; m++) {
      if (!this.pending[m]) continue;
      for (let slot = 0; slot < this.pending[m]!.length; slot++) {
        const t = this.pending[m]![slot];
        if (!t) continue;
        this.pending[m]![slot] = undefined;
        this.inFlight--;
        if (t.settled) continue;
        t.settled = true;
        t.cancel?.unlisten(t.onCancel!);
        t.reject(reason);
      }
    }
    this.bell.ring(); // wake the listen loop so it sees nothing is in flight
  }
}

const abandonKey = (model: number, slot: number) => model * 2 ** 32 + slot;

function slotError(code: number): SlabserveError {
  switch (code) {
    case SlotError.RESTARTED:
      return new InferenceRestartedError();
    case SlotError.INPUT:
      return new InputFailedError();
    case SlotError.DEADLINE:
      return new DeadlineExceededError('request deadline passed while it was queued; it was not run');
    case SlotError.SHUTDOWN:
      return new EngineClosedError('the inference thread stopped before running this request');
    default:
      return new InferenceError('the batch holding this request failed to run');
  }
}
