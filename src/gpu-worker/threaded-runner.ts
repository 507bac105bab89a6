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
import { settlesWithin } from '../shared/clock.js';
import { RpcPeer } from '../shared/rpc.js';
import { terminateOutsideNativeCalls, type NativeGate, type SessionCells } from '../shared/native-gate.js';
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
  /** Where its native gate comes from: a cell of the inference thread's family (shared/native-gate.ts). */
  cells: SessionCells;
  /** Test hooks only: SessionThreadData.openHold. */
  openHold?: SharedArrayBuffer;
}

/** The session thread behind a ThreadedRunner: its worker, the RPC to it, its exit, and its native gate. */
interface SessionThread {
  worker: Worker;
  rpc: RpcPeer;
  exited: Promise<void>;
  gate: NativeGate;
  cells: SessionCells;
}

/** How long a released session thread may take to end of itself before it is terminated. */
const RELEASE_EXIT_MS = 5000;

export class ThreadedRunner {
  readonly spec: WorkerModel['spec'];
  readonly options: WorkerModel['batching'];
  /** The shared slab with the private output the session thread writes. */
  readonly slab: Slab;
  /** The warm-up's timings (they seed the cost model), and how long opening and warming took. */
  readonly opened: Extract<SessionThreadMessage, { type: 'opened' }>;
  private readonly thread: SessionThread;

  private constructor(model: WorkerModel, slab: Slab, opened: ThreadedRunner['opened'], thread: SessionThread) {
    this.spec = model.spec;
    this.options = model.batching;
    this.slab = slab;
    this.opened = opened;
    this.thread = thread;
  }

  /** Starts the model's session thread and resolves once its session is open and warm; rejects with the reason it failed. */
  static async open(model: WorkerModel, shared: Slab, o: ThreadedRunnerOptions): Promise<ThreadedRunner> {
    const { output = new SharedArrayBuffer(shared.privateOutputBytes), cells, ...rest } = o;
    const gate = cells.take();
    const data: SessionThreadData = { model, output, gate: { family: gate.family, index: gate.index }, ...rest };
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
      await terminateOutsideNativeCalls(worker, gate.family, [gate.index]); // it failed or ended: no call is inside
      throw err; // its cell stays sealed, not handed out again
    }
    worker.off('message', onMessage!); // from now on its messages are RPC
    worker.removeAllListeners('error');
    worker.removeAllListeners('exit');
    // A thread that ends while serving (an uncaught error) fails its batches: the loop splits and answers them.
    const gone = (why: string) => rpc.close(`the session thread of ${model.spec.name} ${why}`);
    worker.on('error', (err) => gone(`failed: ${err.message}`));
    const exited = new Promise<void>((resolve) =>
      worker.on('exit', (code) => {
        gone(`exited (code ${code})`);
        resolve();
      }),
    );
    return new ThreadedRunner(model, shared.withPrivateOutput(output), opened, { worker, rpc, exited, gate, cells });
  }

  /** One batch, on the session thread; no time limit here (the main thread's watchdog bounds a run). */
  run(slots: readonly number[], bucket: number): Promise<BatchStats> {
    return this.thread.rpc.call<BatchStats>('run', { slots, bucket }, 0);
  }

  /**
   * Frees the session; the thread then ends of itself, and its gate's cell is handed out again.
   * Where that fails, the thread is terminated once its cell shows no native call inside.
   */
  async release(): Promise<void> {
    const { worker, rpc, exited, gate, cells } = this.thread;
    try {
      await rpc.call('release');
      if (await settlesWithin(exited, RELEASE_EXIT_MS)) {
        cells.give(gate);
        return;
      }
    } catch {
      // the session thread is gone, or its session's release failed
    }
    await terminateOutsideNativeCalls(worker, gate.family, [gate.index]);
  }
}
