/**
 * A model's instances: onnxruntime sessions of the same model, each running
 * one batch at a time, that the loop sees as one runner able to run
 * `instances` batches at once (Triton's instance_group count).
 *
 * Why: on CPU a narrow model's run takes one core (its operators are too
 * small to split over threads: intra-op-threads.ts), so under load the thread
 * running the session saturates one core while the others idle. Two instances
 * run two batches side by side. Each holds its own copy of the weights
 * (onnxruntime-node cannot share a session between threads).
 *
 * With more than one, every instance runs on a session thread of its own
 * (threaded-runner.ts), so the inference thread only schedules and is free to
 * hand the next batch to whichever instance ends first: a session run in the
 * inference thread blocks it (onnxruntime-node runs synchronously), and while
 * it does, an instance that has ended waits for work. A start-up model keeps
 * its first session in the inference thread too, as the `lone` path: a batch
 * of at most LONE_MAX_TOKENS runs there (and waits for it while it is busy),
 * without the two thread hops a session thread costs (with every batch on
 * session threads: 0.83-0.91x the req/s at one connection, 0.87-0.97x at 4 and
 * 16). So at light load the model runs as with one instance, and the others
 * take the large batches of a heavy one. Every session writes its rows into one private output
 * (Slab.withPrivateOutput): a slot is in one batch at a time, so their writes
 * never overlap.
 */
import type { Slab } from '../shared/slab.js';
import type { LoopRunner } from './inference-loop.js';
import type { BatchStats } from './runner.js';

/** One session of the model: a runner the pool hands batches to. */
export type Instance = Pick<LoopRunner, 'run'> & { release(): Promise<void> };

/**
 * The most padded tokens of a batch the lone path runs (rows x bucket length). Instances on
 * session threads pay off only for the large batches that form under heavy load: a small batch
 * there costs two thread hops and splits the work into smaller, less efficient runs. Measured on
 * the 2-core VM (tiny-embed, wrk, against one instance, side by side): with 64 here, 0.77-0.88x
 * the req/s at 4 connections; with 128, 0.84-0.93x at 16; with 256, 0.94-1.07x at 16 and
 * 1.22-1.36x at 64.
 */
export const LONE_MAX_TOKENS = 256;

export class ModelInstances implements LoopRunner {
  readonly spec: LoopRunner['spec'];
  readonly slab: Slab;
  readonly options: LoopRunner['options'];
  private readonly sessions: Instance[];
  /** Batches running on each instance. */
  private readonly running: number[];
  private readonly lone: Instance | undefined;
  private loneRunning = 0;

  /**
   * `model`: the spec, options and (private-output) slab the loop reads; `sessions`: the
   * instances; `lone`: a session in the calling thread for small batches run alone (none: every
   * batch goes to `sessions`).
   */
  constructor(model: Pick<LoopRunner, 'spec' | 'slab' | 'options'>, sessions: Instance[], lone?: Instance) {
    if (sessions.length === 0) throw new Error('a model needs at least one instance');
    this.spec = model.spec;
    this.slab = model.slab;
    this.options = model.options;
    this.sessions = sessions;
    this.running = sessions.map(() => 0);
    this.lone = lone;
  }

  /** Batches this model runs at once (LoopRunner.instances); the lone path runs only when none does. */
  get instances(): number {
    return this.sessions.length;
  }

  /** Runs a batch: on the lone path if it is small and that path is free, else on the least busy instance (the lowest index among equals). */
  async run(slots: readonly number[], bucket: number): Promise<BatchStats> {
    if (this.lone && this.loneRunning === 0 && this.small(slots.length, bucket)) {
      this.loneRunning++;
      try {
        return await this.lone.run(slots, bucket);
      } finally {
        this.loneRunning--;
      }
    }
    let at = 0;
    for (let i = 1; i < this.running.length; i++) if (this.running[i]! < this.running[at]!) at = i;
    this.running[at]!++;
    try {
      return await this.sessions[at]!.run(slots, bucket);
    } finally {
      this.running[at]!--;
    }
  }

  /**
   * Whether a batch of `rows` in `bucket` may start now (LoopRunner.takes): a small one waits
   * while the lone path is busy, to run there next rather than on an instance (LONE_MAX_TOKENS).
   */
  takes(rows: number, bucket: number): boolean {
    return !this.lone || this.loneRunning === 0 || !this.small(rows, bucket);
  }

  private small(rows: number, bucket: number): boolean {
    return rows * this.options.buckets[bucket]! <= LONE_MAX_TOKENS;
  }

  /** Frees every session (and ends its thread). */
  async release(): Promise<void> {
    const all = this.lone ? [this.lone, ...this.sessions] : this.sessions;
    const results = await Promise.allSettled(all.map((s) => s.release()));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  }
}
