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
 * without the two thread hops a session thread costs (every batch on session
 * threads serves fewer requests at one to 16 connections), unless the load is heavy (HEAVY_QUEUE requests queued): then every
 * batch runs on the instances. So at light load the model runs as with one
 * instance, and the instances take the large batches, and all of a heavy
 * load. Every session writes its rows into one private output
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
 * there costs two thread hops and splits the work into smaller, less efficient runs. A lower
 * bound serves fewer requests than one instance at 4 to 16 connections; this one serves as many
 * at 16 and more at 64 (docs/tuning.md, Model instances, has the figures).
 */
export const LONE_MAX_TOKENS = 256;

/**
 * From this many requests of the model queued when a batch starts, the load is heavy: the lone path
 * is left alone and every batch runs on the instances, one a core, whatever its size. Under heavy
 * load batches form in every bucket at once, most of them under LONE_MAX_TOKENS: held back for the
 * lone path, they run one at a time while the instances idle (a core left partly idle at 64
 * connections). Every batch on the instances serves more requests under heavy load, for more CPU
 * per request, but fewer at one to four connections; this rule keeps the gain at 64 connections
 * and light loads as they were, CPU per request the same. A bound of 8 costs more CPU per request
 * at 16 connections, which flip between the two ways (docs/tuning.md, Model instances, has the
 * figures).
 */
export const HEAVY_QUEUE = 16;

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

  /**
   * Runs a batch, `queued` requests of the model waiting when it was launched (LoopRunner.run): on
   * the lone path if the load is light, the batch small and that path free, else on the least busy
   * instance (the lowest index among equals).
   */
  async run(slots: readonly number[], bucket: number, queued = 0): Promise<BatchStats> {
    if (this.forLone(slots.length, bucket, queued) && this.loneRunning === 0) {
      this.loneRunning++;
      try {
        return await this.lone!.run(slots, bucket); // forLone: there is one
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
   * Whether a batch of `rows` in `bucket` may start now, `queued` requests of the model waiting
   * (LoopRunner.takes): under a light load a small one waits while the lone path is busy, to run
   * there next rather than on an instance (LONE_MAX_TOKENS); under a heavy one (HEAVY_QUEUE) it
   * starts on an instance.
   */
  takes(rows: number, bucket: number, queued: number): boolean {
    return !this.forLone(rows, bucket, queued) || this.loneRunning === 0;
  }

  /** Whether a batch of `rows` in `bucket` belongs on the lone path: there is one, the load is light and the batch small. */
  private forLone(rows: number, bucket: number, queued: number): boolean {
    return this.lone !== undefined && queued < HEAVY_QUEUE && rows * this.options.buckets[bucket]! <= LONE_MAX_TOKENS;
  }

  /** Frees every session (and ends its thread). */
  async release(): Promise<void> {
    const all = this.lone ? [this.lone, ...this.sessions] : this.sessions;
    const results = await Promise.allSettled(all.map((s) => s.release()));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  }
}
