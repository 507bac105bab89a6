/**
 * The inference thread's handle on a model whose session lives on a session
 * thread of its own (session-thread.ts): the loop sees a runner like any
 * other, and each batch it launches becomes one call to that thread, which
 * fills, runs and writes the rows into the private output the two share.
 *
 * Opening happens there too, so a model loaded while serving (a load, a
 * reload, a lazy load) never stops the loop: the other models' batches go on
 * while its file is read, its session created and every bucket warmed.
 */
import { Worker } from 'node:worker_threads';
import { RpcPeer } from '../shared/rpc.js';
import { Slab } from '../shared/slab.js';
import type { BatchStats } from './runner.js';
import type { SessionThreadData, SessionThreadMessage } from './session-thread.js';
import type { WorkerModel } from './worker-model.js';
import type { DeviceInfo } from './device.js';

export interface ThreadedRunnerOptions {
  device: DeviceInfo;
  intraOpThreads: number;
  intraOpNice: number;
  maxInflightBatches: number;
  /** The private output it writes rows into (Slab.withPrivateOutput), shared with the model's other instances; default: its own. */
  output?: SharedArrayBuffer;
  /** Test hooks only: SessionThreadData.openHold. */
  openHold?: SharedArrayBuffer;
}

export class ThreadedRunner {
  readonly spec: WorkerModel['spec'];
  readonly options: WorkerModel['batching'];
  /** The shared slab with the private output the session thread writes. */
  readonly slab: Slab;
  /** The warm-up's timings (they seed the cost model), and how long opening and warming took. */
  readonly opened: Extract<SessionThreadMessage, { type: 'opened' }>;
  private readonly worker: Worker;
  private readonly rpc: RpcPeer;

  private constructor(model: WorkerModel, slab: Slab, worker: Worker, rpc: RpcPeer, opened: ThreadedRunner['opened']) {
    this.spec = model.spec;
    this.options = model.batching;
    this.slab = slab;
    this.worker = worker;
    this.rpc = rpc;
    this.opened = opened;
  }

  /** Starts the model's session thread and resolves once its session is open and warm; rejects with the reason it failed. */
  static async open(model: WorkerModel, shared: Slab, o: ThreadedRunnerOptions): Promise<ThreadedRunner> {
    const { output = new SharedArrayBuffer(shared.privateOutputBytes), ...rest } = o;
    const data: SessionThreadData = { model, output, ...rest };
    const worker = new Worker(new URL('./session-thread.js', import.meta.url), { workerData: data, name: `slabserve-session-${model.spec.name}` });
    const rpc = new RpcPeer(worker);
    let opened: ThreadedRunner['opened'];
    let onMessage: ((m: SessionThreadMessage) => void) | undefined;
    try {
      opened = await new Promise((resolve, reject) => {
        onMessage = (m) => {
          if (m.type === 'opened') resolve(m);
          else if (m.type === 'failed') reject(new Error(m.message));
        };
        worker.on('message', onMessage);
        worker.once('error', reject);
        worker.once('exit', (code) => reject(new Error(`the session thread of ${model.spec.name} exited (code ${code}) while opening`)));
      });
    } catch (err) {
      await worker.terminate();
      throw err;
    }
    worker.off('message', onMessage!); // from now on its messages are RPC
    worker.removeAllListeners('error');
    worker.removeAllListeners('exit');
    // A thread that ends while serving (an uncaught error) fails its batches: the loop splits and answers them.
    const gone = (why: string) => rpc.close(`the session thread of ${model.spec.name} ${why}`);
    worker.on('error', (err) => gone(`failed: ${err.message}`));
    worker.on('exit', (code) => gone(`exited (code ${code})`));
    return new ThreadedRunner(model, shared.withPrivateOutput(output), worker, rpc, opened);
  }

  /** One batch, on the session thread; no time limit here (the main thread's watchdog bounds a run). */
  run(slots: readonly number[], bucket: number): Promise<BatchStats> {
    return this.rpc.call<BatchStats>('run', { slots, bucket }, 0);
  }

  /** Frees the session, then ends the thread. */
  async release(): Promise<void> {
    try {
      await this.rpc.call('release');
    } finally {
      await this.worker.terminate();
    }
  }
}
