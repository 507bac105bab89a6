/**
 * The inference thread's loop: take slot indices off the models' submit rings,
 * queue them by length bucket, ask the scheduler what to run, run it, write
 * each row back, and ring each owner's doorbell once per finished batch.
 *
 * Up to `maxInflightBatches` batches are handed to the device before the
 * first ends (default 1: onnxruntime-node runs synchronously on this thread,
 * so requests that arrive during a run wait in the ring and form the next
 * batch the moment it ends; see docs/architecture.md).
 */
import { nowMs } from '../shared/clock.js';
import type { ControlBlock } from '../shared/control.js';
import {
  Counter,
  H_ERROR,
  H_LENGTH,
  H_OWNER,
  SlotError,
  SlotState,
  T_DEADLINE,
  T_ENQUEUED,
  T_FINISHED,
  T_STARTED,
} from '../shared/slab.js';
import type { BatchStats, ModelRunner } from './runner.js';
import { bucketFor, decide, type ModelQueue, type QueuedRequest } from './scheduler.js';

export interface LoopOptions {
  maxInflightBatches: number;
  /** Called when a batch fails (the loop goes on). */
  onBatchError?: (model: string, error: unknown) => void;
  /** Called after every successful batch (metrics). */
  onBatch?: (model: number, bucket: number, stats: BatchStats) => void;
}

/** Wake at least this often to refresh the heartbeat and sweep expired requests. */
const IDLE_WAKE_MS = 250;

export class InferenceLoop {
  private readonly runners: ModelRunner[];
  private readonly control: ControlBlock;
  private readonly options: LoopOptions;
  private readonly queues: ModelQueue[];
  private inflight = 0;
  /** Owners to wake after the current completion pass (bit per owner index). */
  private readonly ownersToWake = new Set<number>();

  constructor(runners: ModelRunner[], control: ControlBlock, options: LoopOptions) {
    this.runners = runners;
    this.control = control;
    this.options = options;
    this.queues = runners.map((r) => ({ options: r.options, buckets: r.options.buckets.map(() => [] as QueuedRequest[]) }));
  }

  /** Runs until the control block's stop flag is set, then fails what is still queued. */
  async run(): Promise<void> {
    const bell = this.control.workerBell;
    while (!this.control.stopRequested()) {
      const seen = bell.read();
      this.intake();
      const now = nowMs(); // after intake, so nothing taken in is judged by a stale clock
      this.control.heartbeat = now;
      this.sweep(now);
      let timeout = IDLE_WAKE_MS;
      while (this.inflight < this.options.maxInflightBatches) {
        const d = decide(this.queues, nowMs(), this.inflight === 0);
        if (d.kind === 'run') {
          this.launch(d.model, d.bucket, d.count);
          continue;
        }
        if (d.kind === 'wait') timeout = Math.min(timeout, Math.max(0, d.untilMs - nowMs()));
        break;
      }
      this.publishQueueDepth();
      // A submit or a finished batch rings the bell; otherwise wake when a batch window closes.
      await bell.wait(seen, timeout);
    }
    await this.shutdown();
  }

  /** Moves newly submitted slots from the rings into their bucket FIFOs. */
  private intake(): void {
    for (let m = 0; m < this.runners.length; m++) {
      const slab = this.runners[m]!.slab;
      const buckets = this.runners[m]!.options.buckets;
      for (let slot = slab.submit.pop(); slot !== -1; slot = slab.submit.pop()) {
        const length = slab.header(slot, H_LENGTH);
        const b = bucketFor(buckets, length);
        if (b < 0) {
          // Owners validate lengths; this guards the device against a bad writer.
          this.finish(m, slot, SlotState.FAILED, SlotError.INFERENCE);
          continue;
        }
        this.queues[m]!.buckets[b]!.push({
          slot,
          length,
          enqueuedAt: slab.time(slot, T_ENQUEUED),
          deadline: slab.time(slot, T_DEADLINE),
        });
      }
    }
    this.wakeOwners();
  }

  /** Drops cancelled requests (freeing their slots) and fails expired ones before they reach the device. */
  private sweep(now: number): void {
    for (let m = 0; m < this.queues.length; m++) {
      const slab = this.runners[m]!.slab;
      for (const fifo of this.queues[m]!.buckets) {
        let kept = 0;
        for (const q of fifo) {
          const state = slab.state(q.slot);
          if (state === SlotState.CANCELLED) {
            this.freeCancelled(m, q.slot);
          } else if (q.deadline <= now) {
            this.expire(m, q.slot);
          } else {
            fifo[kept++] = q;
          }
        }
        fifo.length = kept;
      }
    }
    this.wakeOwners();
  }

  private launch(model: number, bucket: number, count: number): void {
    const runner = this.runners[model]!;
    const slab = runner.slab;
    const taken = this.queues[model]!.buckets[bucket]!.splice(0, count);
    const slots: number[] = [];
    const now = nowMs();
    for (const q of taken) {
      if (q.deadline <= now) {
        this.expire(model, q.slot); // its deadline passed since the sweep: it must not run
        continue;
      }
      const found = slab.transition(q.slot, SlotState.QUEUED, SlotState.RUNNING);
      if (found === SlotState.QUEUED) slots.push(q.slot);
      else if (found === SlotState.CANCELLED) this.freeCancelled(model, q.slot);
    }
    if (slots.length === 0) {
      this.wakeOwners();
      return;
    }
    this.inflight++;
    this.control.inflightBatches = this.inflight;
    const started = nowMs();
    runner
      .run(slots, bucket)
      .then(
        (stats) => {
          const c = slab.counters;
          c[Counter.BATCHES]! += 1;
          c[Counter.ROWS]! += stats.rows;
          c[Counter.REAL_TOKENS]! += stats.realTokens;
          c[Counter.PADDED_TOKENS]! += stats.paddedTokens;
          c[Counter.RUN_MS]! += stats.runMs;
          this.options.onBatch?.(model, bucket, stats);
          this.completeBatch(model, slots, started, SlotState.DONE, SlotError.NONE);
        },
        (err: unknown) => {
          slab.counters[Counter.FAILED_BATCHES]! += 1;
          this.options.onBatchError?.(runner.spec.name, err);
          this.completeBatch(model, slots, started, SlotState.FAILED, SlotError.INFERENCE);
        },
      )
      .finally(() => {
        this.inflight--;
        this.control.inflightBatches = this.inflight;
        this.control.workerBell.ring(); // the loop may now launch the next batch
      });
  }

  private completeBatch(model: number, slots: number[], started: number, state: number, error: number): void {
    const slab = this.runners[model]!.slab;
    const finished = nowMs();
    for (const slot of slots) {
      slab.setTime(slot, T_STARTED, started);
      slab.setTime(slot, T_FINISHED, finished);
      this.finish(model, slot, state, error, SlotState.RUNNING);
    }
    this.wakeOwners();
  }

  /** Fails a queued request whose deadline has passed; it never reaches the device. */
  private expire(model: number, slot: number): void {
    if (this.finish(model, slot, SlotState.FAILED, SlotError.DEADLINE, SlotState.QUEUED)) {
      this.runners[model]!.slab.counters[Counter.DROPPED_EXPIRED]! += 1;
    }
  }

  /**
   * Ends a request: `from` -> `state` and onto its owner's completion queue.
   * If its owner cancelled it meanwhile, the slot is freed instead (returns false).
   */
  private finish(model: number, slot: number, state: number, error: number, from: number = SlotState.QUEUED): boolean {
    const slab = this.runners[model]!.slab;
    slab.setHeader(slot, H_ERROR, error);
    const found = slab.transition(slot, from, state);
    if (found === SlotState.CANCELLED) {
      this.freeCancelled(model, slot);
      return false;
    }
    if (found !== from) throw new Error(`slot ${slot} was ${found}, expected ${from}`);
    const owner = slab.header(slot, H_OWNER);
    slab.completions[owner]!.push(slot);
    this.ownersToWake.add(owner);
    return true;
  }

  private freeCancelled(model: number, slot: number): void {
    const slab = this.runners[model]!.slab;
    if (slab.transition(slot, SlotState.CANCELLED, SlotState.FREE) === SlotState.CANCELLED) {
      slab.counters[Counter.CANCELLED_SKIPPED]! += 1;
      slab.free.push(slot);
    }
  }

  /** One notify per owner per pass, however many of its requests finished. */
  private wakeOwners(): void {
    for (const owner of this.ownersToWake) this.control.ownerBell(owner).ring();
    this.ownersToWake.clear();
  }

  private publishQueueDepth(): void {
    for (let m = 0; m < this.queues.length; m++) {
      let n = 0;
      for (const fifo of this.queues[m]!.buckets) n += fifo.length;
      this.runners[m]!.slab.counters[Counter.QUEUED] = n;
    }
  }

  /** Lets running batches finish, then fails every request still queued or still arriving. */
  private async shutdown(): Promise<void> {
    while (this.inflight > 0) {
      const seen = this.control.workerBell.read();
      if (this.inflight > 0) await this.control.workerBell.wait(seen, IDLE_WAKE_MS);
    }
    this.intake();
    for (let m = 0; m < this.queues.length; m++) {
      for (const fifo of this.queues[m]!.buckets) {
        for (const q of fifo) this.finish(m, q.slot, SlotState.FAILED, SlotError.SHUTDOWN);
        fifo.length = 0;
      }
    }
    this.publishQueueDepth();
    this.wakeOwners();
  }
}
