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
 * its first session in the inference thread too, as the `lone` path: a small
 * batch when nothing of the model is running runs there, without the two
 * thread hops a session thread costs (at one connection those cost 0.83-0.91x
 * the req/s). Every session writes its rows into one private output
 * (Slab.withPrivateOutput): a slot is in one batch at a time, so their writes
 * never overlap.
 */
import type { Slab } from '../shared/slab.js';
import type { LoopRunner } from './inference-loop.js';
import type { BatchStats } from './runner.js';

/** One session of the model: a runner the pool hands batches to. */
export type Instance = Pick<LoopRunner, 'run'> & { release(): Promise<void> };

/**
 * The most padded tokens of a batch the lone path runs (rows x bucket length): a lone request
 * of up to 64 tokens, or a few short ones. A longer run pays the hop to a session thread
 * instead of blocking the loop for its length.
 */
export const LONE_MAX_TOKENS = 64;

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

  /** Runs a batch: on the lone path if it is small and nothing else runs, else on the least busy instance (the lowest index among equals). */
  async run(slots: readonly number[], bucket: number): Promise<BatchStats> {
    if (this.lone && this.idle() && slots.length * this.options.buckets[bucket]! <= LONE_MAX_TOKENS) {
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

  private idle(): boolean {
    return this.loneRunning === 0 && this.running.every((n) => n === 0);
  }

  /** Frees every session (and ends its thread). */
  async release(): Promise<void> {
    const all = this.lone ? [this.lone, ...this.sessions] : this.sessions;
    const results = await Promise.allSettled(all.map((s) => s.release()));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  }
}
