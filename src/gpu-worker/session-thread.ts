/**
 * Entry point of a session thread: one model's onnxruntime session, opened
 * and warmed up while the inference thread that started it keeps serving the
 * other models, then running that model's batches when the loop hands them
 * over (threaded-runner.ts, one call per batch).
 *
 * Why a thread: onnxruntime-node's InferenceSession.create and run are
 * synchronous native calls (its promise only defers them with setImmediate),
 * so they block the thread that makes them. In the inference thread, a large
 * model's create blocks it for seconds and each warm-up run blocks it again,
 * and the models already served stall for the whole load
 * (docs/model-repository.md has the figures). A session cannot move between
 * threads, so the thread that opens it is the one that runs it.
 *
 * Messages to the parent: { type: 'opened', openMs, warmUpMs, timings, fusions } once warm, or
 * { type: 'failed', message }; then RPC `run` and `release` (after which the thread ends).
 */
import { parentPort, workerData } from 'node:worker_threads';
import { RpcPeer } from '../shared/rpc.js';
import { Slab } from '../shared/slab.js';
import { claimThreadsStarted, nameThread } from '../shared/threads.js';
import type { DeviceInfo } from './device.js';
import { InferenceHold } from './hold.js';
import { collectStartupGarbage } from '../shared/gc.js';
import { ModelRunner } from './runner.js';
import type { GraphFusions } from './graph.js';
import { NativeGate } from '../shared/native-gate.js';
import type { WorkerModel } from './worker-model.js';

export interface SessionThreadData {
  model: WorkerModel;
  /** The private output region the inference thread shares with this one (Slab.withPrivateOutput). */
  output: SharedArrayBuffer;
  device: DeviceInfo;
  intraOpThreads: number;
  /** Nice value of onnxruntime's intra-op pool threads on CPU (0: the process's own). */
  intraOpNice: number;
  maxInflightBatches: number;
  /** This thread's native gate (shared/native-gate.ts): a cell of its inference thread's family. */
  gate: { family: SharedArrayBuffer; index: number };
  /** Test hooks only (SLABSERVE_TEST_HOOKS=1): while this InferenceHold is held, the thread blocks before it opens the model. */
  openHold?: SharedArrayBuffer;
}

export type WarmUpTimings = Awaited<ReturnType<ModelRunner['warmUp']>>;

export type SessionThreadMessage =
  | { type: 'opened'; openMs: number; warmUpMs: number; timings: WarmUpTimings; fusions: GraphFusions }
  | { type: 'failed'; message: string };

const data = workerData as SessionThreadData;
const post = (m: SessionThreadMessage) => parentPort!.postMessage(m);
/** What onnxruntime's pool threads inherit while the session opens (at most 15 bytes kept). */
const OPENING = `opening-s${data.model.id}`;

async function main(): Promise<void> {
  nameThread(OPENING);
  let runner: ModelRunner;
  let openMs: number;
  let warmUpMs: number;
  let timings: WarmUpTimings;
  try {
    const slab = new Slab(data.model.slab, data.model.layout).withPrivateOutput(data.output);
    if (data.openHold) new InferenceHold(data.openHold).parkBlocking();
    const started = performance.now();
    const gate = new NativeGate(data.gate.family, data.gate.index);
    runner = await ModelRunner.create(data.model.spec, slab, data.model.batching, data.device, { intraOpThreads: data.intraOpThreads, gate }, data.maxInflightBatches);
    openMs = performance.now() - started;
    timings = await runner.warmUp();
    warmUpMs = performance.now() - started - openMs;
  } catch (err) {
    post({ type: 'failed', message: (err as Error).message });
    return; // nothing holds the thread: it ends
  }
  // The main thread finds these by their names (slabserve_thread_cpu_seconds_total).
  claimThreadsStarted(OPENING, 'session', 'onnxruntime', data.device.kind === 'cpu' ? data.intraOpNice : 0);
  new RpcPeer(parentPort!, {
    run: (arg) => {
      const { slots, bucket } = arg as { slots: number[]; bucket: number };
      return runner.run(slots, bucket);
    },
    // Then the thread ends of itself, once the answer is posted: never terminated (native-gate.ts).
    release: async () => {
      await runner.release();
      setImmediate(() => parentPort!.close());
    },
  });
  post({ type: 'opened', openMs, warmUpMs, timings, fusions: runner.fusions });
  collectStartupGarbage();
}

void main();
