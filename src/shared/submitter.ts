/**
 * The owner side of the slabs: how a thread that accepts requests (a gateway,
 * or the in-process engine) hands token ids to the inference thread and gets
 * each result back, with no message per request.
 *
 * submit():  take a free slot, write ids into it, mark it QUEUED, push its
 *            index on the model's submit ring, ring the inference thread's bell.
 * reserve(): take a request's slots before its inputs are ready (all of them
 *            or none: OverloadedError at once), so it is refused before any
 *            work is spent on it (tokenizing) and cannot lose them meanwhile;
 *            submit() then fills them one by one, release() gives back the rest.
 * listen():  sleep on this owner's doorbell (Atomics.waitAsync); the
 *            inference thread rings it once per finished batch; drain this
 *            owner's completion queues and settle the waiting promises.
 * cancel:    an AbortSignal moves the slot QUEUED|RUNNING -> CANCELLED; the
 *            inference thread never runs it (or drops its result) and frees it.
 *
 * A completion this owner has no request for is freed: a request it gave up
 * after its result was written, or one of a previous thread with this owner
 * index that died (the main thread starts a new one; src/main.ts).
 */
import { predictedWaitMs } from './admission.js';
import { nowMs } from './clock.js';
import type { ControlBlock } from './control.js';
import type { Doorbell } from './doorbell.js';
import {
  CancelledError,
  DeadlineExceededError,
  EngineClosedError,
  InferenceError,
  OverloadedError,
  SlabserveError,
  ValidationError,
} from './errors.js';

/** The inference thread died or hung with this request queued or running; a new one is starting. Retry. (503) */
export class InferenceRestartedError extends SlabserveError {
  constructor(message = 'the inference thread was restarted while this request was queued or running; retry it') {
    super(message, 'SLABSERVE_INFERENCE_RESTARTED', 'unavailable');
  }
}

/**
 * The model cannot run this input: its batch failed, and once split, this
 * input alone still failed while the others of its batch ran. (422)
 */
export class InputFailedError extends SlabserveError {
  constructor(message = 'the model failed on this input (the other inputs batched with it ran); it will fail again if sent again') {
    super(message, 'SLABSERVE_INPUT_FAILED', 'validation');
  }
}
import {
  Account,
  Counter,
  H_CHUNK,
  H_ERROR,
  H_GENERATION,
  H_HOLDER,
  H_LENGTH,
  H_OWNER,
  H_PRIORITY,
  HEADER_I32,
  Slab,
  SlotError,
  SlotState,
  T_DEADLINE,
  T_ENQUEUED,
  T_FINISHED,
  T_STARTED,
} from './slab.js';

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

/**
 * Slots one request took before its inputs were ready: FILLING, owned by
 * this thread, on no queue, so no other request can take them (and a dead
 * gateway's are freed by the main thread as slots it left FILLING).
 * `submit({reservation})` fills them one by one; `release()` gives back those
 * not filled (a request that failed before submitting, or submitted fewer).
 */
export class SlotReservation {
  readonly model: number;
  private readonly slots: number[];
  private readonly giveBack: (slot: number) => void;
  private released = false;

  constructor(model: number, slots: number[], giveBack: (slot: number) => void) {
    this.model = model;
    this.slots = slots;
    this.giveBack = giveBack;
  }

  /** Slots still held. */
  get size(): number {
    return this.slots.length;
  }

  /** One held slot, now the caller's to fill; -1 when none is left (or after release). */
  take(): number {
    return this.released ? -1 : (this.slots.pop() ?? -1);
  }

  /** Gives back every slot not taken. Idempotent. */
  release(): void {
    if (this.released) return;
    this.released = true;
    for (let slot = this.slots.pop(); slot !== undefined; slot = this.slots.pop()) this.giveBack(slot);
  }
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

interface Pending {
  generation: number;
  resolve: (r: SlotResult) => void;
  reject: (e: Error) => void;
  signal?: AbortSignal;
  onAbort?: () => void;
}

export class SlabSubmitter {
  private readonly slabs: Slab[];
  private readonly owner: number;
  private readonly control: ControlBlock;
  private readonly bell: Doorbell;
  /** pending[model][slot]: the request waiting on that slot, if any. */
  private readonly pending: (Pending | undefined)[][];
  private inFlight = 0;
  /** Slots held by reservations, not yet filled or given back. */
  private reserved = 0;
  /** Cancelled requests whose result was already written (model * 2^32 + slot): their completion is still to be drained and freed. */
  private readonly abandoned = new Set<number>();
  private closed = false;
  private listening = false;

  /** Per model: bucket lengths and the batch capacity of each (for the queued-work tallies and admission). */
  private readonly buckets: { lengths: number[]; capacities: number[] }[];
  private readonly onCancel: ((r: CancelReport) => void) | undefined;

  constructor(
    slabs: Slab[],
    control: ControlBlock,
    owner: number,
    opts: { buckets?: { lengths: number[]; capacities: number[] }[]; onCancel?: (r: CancelReport) => void } = {},
  ) {
    this.slabs = slabs;
    this.control = control;
    this.owner = owner;
    this.bell = control.ownerBell(owner);
    this.pending = slabs.map((s) => new Array<Pending | undefined>(s.layout.slotCount));
    this.buckets = slabs.map((s, m) => opts.buckets?.[m] ?? { lengths: [s.layout.maxLength], capacities: [1] });
    this.onCancel = opts.onCancel;
    this.drain(); // completions left for a previous thread with this owner index (it died): free them
  }

  private bucketOf(model: number, length: number): number {
    const lengths = this.buckets[model]!.lengths;
    const b = lengths.findIndex((l) => l >= length);
    return b < 0 ? lengths.length - 1 : b;
  }

  /**
   * Predicted ms for the device to drain `model`'s queue with inputs of
   * `lengths` added, in full batches, from the cost model the inference
   * thread publishes; 0 before it has measured anything.
   */
  predictedWaitMs(model: number, lengths: readonly number[]): number {
    const slab = this.slabs[model]!;
    const { lengths: bucketLengths, capacities } = this.buckets[model]!;
    const request = new Array<number>(bucketLengths.length).fill(0);
    for (const len of lengths) request[this.bucketOf(model, len)]! += 1;
    const queued = bucketLengths.map((_, b) => Atomics.load(slab.accounts, Account.QUEUED_BY_BUCKET + b));
    const costs = bucketLengths.map((_, b) => ({ capacity: capacities[b]!, ...slab.cost(b) }));
    if (costs.every((c) => c.samples === 0)) return 0;
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
   * slots are FILLING and this owner's until submitted or released.
   */
  reserve(model: number, count: number): SlotReservation {
    if (this.closed) throw new EngineClosedError();
    const slab = this.slabs[model];
    if (!slab) throw new ValidationError(`no model with index ${model}`);
    if (!(count >= 1)) throw new ValidationError(`a request needs at least one slot, not ${count}`);
    const popped: number[] = [];
    while (popped.length < count) {
      const slot = slab.free.pop();
      if (slot === -1) break;
      popped.push(slot);
    }
    if (popped.length < count) {
      for (const slot of popped) slab.free.push(slot); // still FREE: nothing else to undo
      throw new OverloadedError(
        count > slab.layout.slotCount
          ? `${count} inputs need more slots than the ${slab.layout.slotCount} this model has (--slots-per-model)`
          : `${count} request slot${count === 1 ? '' : 's'} needed, fewer free of ${slab.layout.slotCount}; retry shortly`,
      );
    }
    for (const slot of popped) this.acquire(slab, slot);
    this.reserved += count;
    return new SlotReservation(model, popped, (slot) => {
      this.reserved--;
      if (slab.transition(slot, SlotState.FILLING, SlotState.FREE) !== SlotState.FILLING) {
        throw new Error(`reserved slot ${slot} is not FILLING (state ${slab.state(slot)})`);
      }
      slab.free.push(slot);
    });
  }

  /** FREE -> FILLING for a slot just popped off the free list, marked as this owner's; returns its new generation. */
  private acquire(slab: Slab, slot: number): number {
    if (slab.transition(slot, SlotState.FREE, SlotState.FILLING) !== SlotState.FREE) {
      throw new Error(`slot ${slot} on the free list is not FREE (state ${slab.state(slot)})`);
    }
    // Owner and holder before the generation moves: the main thread, reclaiming a dead thread's
    // slots, reads the generation around them to tell a slot taken again from one it held.
    slab.setHeader(slot, H_HOLDER, 0);
    slab.setHeader(slot, H_OWNER, this.owner);
    return Atomics.add(slab.headers, slot * HEADER_I32 + H_GENERATION, 1) + 1;
  }

  /**
   * Queues one input (token ids with [CLS]/[SEP], at most the slab's maxLength)
   * for `model`: in a slot of `opts.reservation` when given, else in a free
   * one (rejects with OverloadedError at once when none is free).
   */
  submit(model: number, ids: ArrayLike<number>, typeIds: ArrayLike<number> | null, opts: SubmitOptions): Promise<SlotResult> {
    if (this.closed) return Promise.reject(new EngineClosedError());
    const slab = this.slabs[model];
    if (!slab) return Promise.reject(new ValidationError(`no model with index ${model}`));
    const len = ids.length;
    if (len < 1 || len > slab.layout.maxLength) {
      return Promise.reject(new ValidationError(`input of ${len} tokens does not fit a slot of ${slab.layout.maxLength}`));
    }
    if (opts.signal?.aborted) return Promise.reject(new CancelledError());

    let slot: number;
    let generation: number;
    const held = opts.reservation;
    if (held) {
      if (held.model !== model) return Promise.reject(new Error(`a reservation of model ${held.model} used for model ${model}`));
      slot = held.take();
      if (slot === -1) return Promise.reject(new Error('the reservation holds no slot for this input (released, or fewer slots than inputs)'));
      this.reserved--;
      generation = slab.header(slot, H_GENERATION);
    } else {
      slot = slab.free.pop();
      if (slot === -1) {
        return Promise.reject(new OverloadedError(`all ${slab.layout.slotCount} request slots are in use; retry shortly`));
      }
      generation = this.acquire(slab, slot);
    }
    slab.slotIds(slot).set(ids);
    const types = slab.slotTypeIds(slot);
    if (typeIds) types.set(typeIds);
    else types.fill(0, 0, len);
    slab.setHeader(slot, H_LENGTH, len);
    slab.setHeader(slot, H_PRIORITY, opts.priority ?? 0);
    slab.setHeader(slot, H_CHUNK, opts.chunk ?? 0);
    slab.setHeader(slot, H_ERROR, SlotError.NONE);
    slab.setTime(slot, T_ENQUEUED, nowMs());
    slab.setTime(slot, T_DEADLINE, opts.deadline);

    const promise = new Promise<SlotResult>((resolve, reject) => {
      const p: Pending = { generation, resolve, reject };
      if (opts.signal) {
        p.signal = opts.signal;
        p.onAbort = () => this.cancel(model, slot, p);
        opts.signal.addEventListener('abort', p.onAbort, { once: true });
      }
      this.pending[model]![slot] = p;
    });
    this.inFlight++;
    slab.transition(slot, SlotState.FILLING, SlotState.QUEUED);
    const bucket = this.bucketOf(model, len);
    Atomics.add(slab.accounts, Account.QUEUED_TOKENS, this.buckets[model]!.lengths[bucket]!);
    Atomics.add(slab.accounts, Account.QUEUED_BY_BUCKET + bucket, 1);
    // The ring holds slotCount entries and a slot index is in it at most once: it cannot be full.
    if (!slab.submit.push(slot)) throw new Error('submit ring full: a slot index was queued twice');
    this.control.workerBell.ring();
    this.listen();
    return promise;
  }

  /** Moves a waiting request to CANCELLED and rejects it. */
  private cancel(model: number, slot: number, p: Pending): void {
    if (this.pending[model]![slot] !== p) return; // already settled
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
    this.settle(model, slot, p);
    const reason = p.signal?.reason;
    this.onCancel?.({ model, reason: typeof reason === 'string' ? reason : 'aborted', ran, tokens });
    p.reject(new CancelledError());
  }

  private settle(model: number, slot: number, p: Pending): void {
    this.pending[model]![slot] = undefined;
    this.inFlight--;
    if (p.signal && p.onAbort) p.signal.removeEventListener('abort', p.onAbort);
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
        await this.bell.wait(seen);
      }
      this.listening = false;
      // A completion may have arrived between the last drain and the flag reset.
      this.drain();
    })();
  }

  /** Settles every finished request on this owner's completion queues. */
  drain(): void {
    for (let m = 0; m < this.slabs.length; m++) {
      const slab = this.slabs[m]!;
      const queue = slab.completions[this.owner]!;
      for (let slot = queue.pop(); slot !== -1; slot = queue.pop()) this.complete(m, slab, slot);
    }
  }

  private complete(model: number, slab: Slab, slot: number): void {
    const state = slab.state(slot);
    const p = this.pending[model]![slot];
    if (!p || p.generation !== slab.header(slot, H_GENERATION)) {
      // Its caller cancelled after the result was written, or it was a dead
      // predecessor's (this owner index, an earlier thread): nobody wants it.
      if (!p) this.abandoned.delete(abandonKey(model, slot));
      this.release(slab, slot, state);
      return;
    }
    this.settle(model, slot, p);
    if (state === SlotState.DONE) {
      const result: SlotResult = {
        output: slab.slotOutput(slot).slice(),
        queueMs: slab.time(slot, T_STARTED) - slab.time(slot, T_ENQUEUED),
        inferenceMs: slab.time(slot, T_FINISHED) - slab.time(slot, T_STARTED),
      };
      this.release(slab, slot, state);
      p.resolve(result);
    } else {
      const err = slotError(slab.header(slot, H_ERROR));
      this.release(slab, slot, state);
      p.reject(err);
    }
  }

  private release(slab: Slab, slot: number, state: number): void {
    if (slab.transition(slot, state, SlotState.FREE) !== state) {
      throw new Error(`slot ${slot} changed state while its owner released it`);
    }
    slab.free.push(slot);
  }

  /** Rejects every request still waiting (after the inference thread has stopped). */
  close(reason: SlabserveError = new EngineClosedError()): void {
    this.closed = true;
    this.drain();
    for (let m = 0; m < this.slabs.length; m++) {
      for (let slot = 0; slot < this.pending[m]!.length; slot++) {
        const p = this.pending[m]![slot];
        if (!p) continue;
        this.settle(m, slot, p);
        p.reject(reason);
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
