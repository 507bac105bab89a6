/**
 * Entry point of an inference thread (one per device). It maps the slabs and
 * the control block, opens one onnxruntime session per model on its device,
 * warms every bucket shape, reports ready, and runs the batching loop until
 * the control block says stop.
 *
 * Messages to the parent (control only, never per request):
 *   { type: 'ready', device, models }   after warm-up
 *   { type: 'batch-error', model, message }
 *   { type: 'split', model, failed, ran, runs }  a failed batch, split: inputs that failed alone, inputs that ran
 *   { type: 'fatal', message }           start-up failed; the thread exits
 *   { type: 'stopped' }
 *
 * The main thread supervises it (src/main/threads/inference-supervisor.ts): a thread that dies
 * or hangs is given up (the control block's epoch moves on) and replaced.
 * Runners write rows into a private output region; the loop copies them into
 * the shared slots only while this thread is the live one.
 *
 * Test hooks (workerData.testHooks, only when the server runs with
 * SLABSERVE_TEST_HOOKS=1; inert otherwise): RPC `testFault` makes this thread's
 * next batch run throw an uncaught error, exit, or hang, or stalls its loop
 * now; RPC `testPoison` makes inputs holding a given token id fail in onnxruntime;
 * the hold cell (./hold.ts: shared memory, the same cell in every replacement
 * thread) parks the loop before it takes in new work, until the main thread lets it go.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { Registry } from 'prom-client';
import { nowMs } from '../shared/clock.js';
import { ControlBlock, WorkerState } from '../shared/control.js';
import { inferenceMetrics, traceDropMetric } from '../shared/telemetry/metrics.js';
import { startThreadTracing, type TracingConfig } from '../shared/telemetry/tracing.js';
import { batchTracing } from './batch-trace.js';
import { RpcPeer, type RpcHandlers } from '../shared/rpc.js';
import { Counter, H_LENGTH, Slab } from '../shared/slab.js';
import { claimThreadsStarted, nameThread } from '../shared/threads.js';
import { cudaMissing, cudaUnavailableMessage, describeCpu, describeCuda, parseDevice, type DeviceInfo } from './device.js';
import { InferenceHold } from './hold.js';
import { IDLE_WAKE_MS, InferenceLoop, type LoopRunner, type SchedulingOptions } from './inference-loop.js';
import { trimHeap } from './memory-trim.js';
import { NativeGate, SessionCells } from '../shared/native-gate.js';
import { collectStartupGarbage } from '../shared/gc.js';
import type { WorkerModel } from './worker-model.js';
import { ModelRunner } from './runner.js';
import type { GraphFusions } from './graph.js';
import { ThreadedRunner } from './threaded-runner.js';
import { ModelInstances } from './model-instances.js';
import { autoModelInstances, coresPerRun } from './intra-op-threads.js';
import { batchCapacity, type BatchingOptions } from './scheduler.js';

export type { WorkerModel } from './worker-model.js';

export interface InferenceWorkerData {
  control: SharedArrayBuffer;
  /** Native gates (shared/native-gate.ts): cell 0 this thread's, the others its session threads'. */
  gates: SharedArrayBuffer;
  owners: number;
  device: string;
  intraOpThreads: number;
  /** Nice value of onnxruntime's intra-op pool threads on CPU (0: the process's own). */
  intraOpNice: number;
  maxInflightBatches: number;
  /** Instances of each model (model-instances.ts); 0: autoModelInstances. */
  modelInstances: number;
  scheduling: SchedulingOptions;
  /** The models to open at start; addModel() opens more while it runs. */
  models: WorkerModel[];
  /** The control block's epoch when this thread was started: it is the live thread while the block holds it. */
  epoch: number;
  /** The longest its loop sleeps when idle (LoopOptions.idleWakeMs). */
  idleWakeMs?: number;
  /** How long its loop spins before it sleeps (LoopOptions.idleSpinUs). */
  idleSpinUs: number;
  /** Test hooks, present only when the server runs with SLABSERVE_TEST_HOOKS=1. */
  testHooks?: InferenceTestHooks;
  /** Tracing on (--otlp-endpoint, OTEL_EXPORTER_OTLP_*): a span per batch carrying a sampled request. */
  tracing?: TracingConfig;
}

/** What addModel answers: how long the model took to open and warm up, and what it cost in memory. */
export interface ModelOpened {
  openMs: number;
  warmUpMs: number;
  /** Resident memory of the process after the warm-up minus before the session was created (other threads' churn included). */
  rssBytes: number;
  /** On CUDA: device memory in use after the warm-up minus before (nvidia-smi; other processes' included); null elsewhere. */
  deviceBytes: number | null;
}

/** What a test may do to an inference thread (SLABSERVE_TEST_HOOKS=1 only). */
export interface InferenceTestHooks {
  /** Inputs holding this token id fail in onnxruntime (the id is swapped for one past the vocabulary); -1: none. */
  poisonToken: number;
  /** The hold cell (InferenceHold): the supervisor's, the same for every thread it starts. */
  hold: SharedArrayBuffer;
  /** The open hold (InferenceHold.parkBlocking): a session thread blocks before it opens its model while held. */
  openHold: SharedArrayBuffer;
}

/**
 * During the next batch run of at least `minRows` rows (its slots RUNNING, others queued):
 * throw, an uncaught error; exit, process.exit; hang, the thread blocks for good.
 * stall: the loop blocks now, outside a run.
 */
export type InferenceFault = 'throw' | 'exit' | 'hang' | 'stall';

export type InferenceWorkerMessage =
  | { type: 'ready'; device: DeviceInfo; note?: string; threads: InferenceThreadIds }
  | { type: 'batch-error'; model: string; message: string }
  | { type: 'split'; model: string; failed: number; ran: number; runs: number }
  | { type: 'fatal'; message: string }
  | { type: 'stopped' };

/** Kernel thread ids: this thread, and onnxruntime's intra-op pool threads (the ones it created while its sessions opened). */
export interface InferenceThreadIds {
  inference: number | null;
  pool: number[];
}

const data = workerData as InferenceWorkerData;
/**
 * This thread's kernel name while it opens its sessions: onnxruntime's pool
 * threads inherit it when they are created, and no other thread has it (an
 * abandoned predecessor has another epoch). Once they are found, this thread
 * is called "inference" and they "onnxruntime" (what top -H shows).
 */
const OPENING_THREAD_NAME = `opening-${data.epoch}`;
nameThread(OPENING_THREAD_NAME);
const post = (m: InferenceWorkerMessage) => parentPort!.postMessage(m);
const control = new ControlBlock(data.control, data.owners);
/** Whether this thread is still the live one (the main thread has not given it up). */
const live = () => control.epoch === data.epoch;
/** This thread's native calls (its own sessions, malloc_trim) go through this gate; its session threads get cells of their own. */
const ownGate = new NativeGate(data.gates, 0);
const sessionCells = new SessionCells(data.gates);
/** malloc_trim (a native call) through this thread's gate. */
const trimNative = () => ownGate.runSync(trimHeap);
/** A model served: its plan, its shared slab, and its runner (on a private output), in this thread or on a session thread. */
interface Served {
  model: WorkerModel;
  shared: Slab;
  runner: LoopRunner & { release(): Promise<void> };
}
/** A model's per-batch histograms, bound to its label once (cell metrics: shared/telemetry/metric-cells.ts). */
function batchCells(model: string) {
  const labels = { model };
  return {
    size: metrics.batchSize.cell(labels),
    duration: metrics.batchDuration.cell(labels),
    fill: metrics.fillRatio.cell(labels),
    padding: metrics.paddingEfficiency.cell(labels),
  };
}
/** Every model served, by id, with its batch histograms. */
const served = new Map<number, Served & { cells: ReturnType<typeof batchCells> }>();

/** A start-up model opened in this thread: its first instance, and the private output its other instances will share. */
interface OpenedModel {
  model: WorkerModel;
  shared: Slab;
  runner: ModelRunner;
  output: SharedArrayBuffer;
}

/** Opens one start-up model's session on `device`, in this thread (not yet warmed up, not yet in the loop). */
async function openModel(model: WorkerModel, device: DeviceInfo): Promise<OpenedModel> {
  const shared = new Slab(model.slab, model.layout);
  const output = new SharedArrayBuffer(shared.privateOutputBytes);
  const runner = await ModelRunner.create(model.spec, shared.withPrivateOutput(output), model.batching, device, { intraOpThreads: data.intraOpThreads, gate: ownGate }, data.maxInflightBatches);
  return { model, shared, runner, output };
}

/** How many instances of `model` run on `device` (--model-instances, or its auto rule). */
function instancesOf(model: WorkerModel, device: DeviceInfo): number {
  return data.modelInstances || autoModelInstances(device.kind, data.intraOpThreads, model.spec.hiddenSize);
}

/** Opens `count` instances of a model on session threads of their own, all writing into `output`; all or none. */
async function openThreaded(model: WorkerModel, shared: Slab, device: DeviceInfo, count: number, output: SharedArrayBuffer): Promise<ThreadedRunner[]> {
  const options = {
    device,
    intraOpThreads: data.intraOpThreads,
    intraOpNice: data.intraOpNice,
    maxInflightBatches: data.maxInflightBatches,
    output,
    cells: sessionCells,
    ...(data.testHooks ? { openHold: data.testHooks.openHold } : {}),
  };
  const results = await Promise.allSettled(Array.from({ length: count }, () => ThreadedRunner.open(model, shared, options)));
  const opened = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (!failed) return opened;
  await Promise.allSettled(opened.map((r) => r.release()));
  throw failed.reason;
}

/** Warms a start-up model up while its instances on session threads (if more than one) open and warm up, then serves it. */
async function serveOpened(loop: InferenceLoop, o: OpenedModel, device: DeviceInfo): Promise<void> {
  const count = instancesOf(o.model, device);
  const [timings, threaded] = await Promise.all([o.runner.warmUp(), openThreaded(o.model, o.shared, device, count > 1 ? count : 0, o.output)]);
  // One instance: it runs in this thread. More: on their session threads, this one's session the lone path.
  const runner = count > 1 ? new ModelInstances(o.runner, threaded, o.runner) : new ModelInstances(o.runner, [o.runner]);
  serve(loop, { model: o.model, shared: o.shared, runner }, timings, device, o.runner.fusions);
  if (count > 1) trimNative(); // what the session threads' opening freed, as addModel does
}

/** Opens every start-up model on the requested device; with `auto`, falls back to CPU when CUDA cannot be used. */
async function openRunners(): Promise<{ opened: OpenedModel[]; device: DeviceInfo; note?: string }> {
  const want = parseDevice(data.device);
  // Test hooks only: while the open hold is held (TEST_HOLD_START_ENV), the start-up models wait here.
  if (data.testHooks) new InferenceHold(data.testHooks.openHold).parkBlocking();
  const open = (device: DeviceInfo) => Promise.all(data.models.map((m) => openModel(m, device)));
  if (want.kind === 'cpu') return { opened: await open(describeCpu()), device: describeCpu() };
  // No CUDA session unless the pre-flight passes: a failing one prints onnxruntime's own errors.
  const missing = cudaMissing();
  if (missing && want.kind === 'cuda') throw new Error(cudaUnavailableMessage(missing));
  if (missing) return { opened: await open(describeCpu()), device: describeCpu(), note: `auto: ${missing.reason}, using CPU` };
  const gpu = describeCuda(want.id);
  try {
    return { opened: await open(gpu), device: gpu };
  } catch (err) {
    if (want.kind === 'cuda') throw err;
    return { opened: await open(describeCpu()), device: describeCpu(), note: `auto: CUDA unavailable (${(err as Error).message.split('\n')[0]}), using CPU` };
  }
}

const registry = new Registry();
const metrics = inferenceMetrics(registry);
const tracing = data.tracing ? startThreadTracing(data.tracing) : null;
if (tracing) traceDropMetric(registry, tracing.dropped);

/**
 * Finds onnxruntime's intra-op pool threads, names them, and on CPU gives them
 * the nice value `data.intraOpNice`. Run once the sessions are open: they are
 * the threads named like this one (OPENING_THREAD_NAME).
 * Reniced, a pool thread spinning through a run (runner.ts, INTRA_OP_SPINNING)
 * gives way to a gateway thread that has a request to answer.
 */
function claimPoolThreads(device: DeviceInfo): InferenceThreadIds {
  const { own, pool } = claimThreadsStarted(OPENING_THREAD_NAME, 'inference', 'onnxruntime', device.kind === 'cpu' ? data.intraOpNice : 0);
  return { inference: own, pool };
}

async function main(): Promise<void> {
  // Answers metrics scrapes; its port listener also keeps this thread alive
  // while the loop sleeps in Atomics.waitAsync. The model handlers join once the loop runs.
  const handlers: RpcHandlers = { metrics: () => registry.getMetricsAsJSON(), ...(data.testHooks ? testHookHandlers(data.testHooks) : {}) };
  new RpcPeer(parentPort!, handlers);
  let device: DeviceInfo;
  let loop: InferenceLoop;
  try {
    const opened = await openRunners();
    const threads = claimPoolThreads(opened.device);
    device = opened.device;
    loop = createLoop(device);
    for (const o of opened.opened) await serveOpened(loop, o, device);
    if (live()) {
      control.heartbeat = Date.now();
      control.workerState = WorkerState.READY;
    }
    post({ type: 'ready', device: opened.device, threads, ...(opened.note ? { note: opened.note } : {}) });
    collectStartupGarbage();
  } catch (err) {
    if (live()) control.workerState = WorkerState.FAILED;
    post({ type: 'fatal', message: (err as Error).message });
    process.exit(1);
  }
  Object.assign(handlers, modelHandlers(loop, device));
  await loop.run();
  // Settled, not thrown: a thread given up has its gates sealed (AbandonedError), and an uncaught
  // error in a thread being terminated is fatal to the process.
  await Promise.allSettled([...served.values()].map((s) => s.runner.release()));
  await tracing?.shutdown().catch(() => {}); // the last batch spans, waiting at most its grace
  if (live()) control.workerState = WorkerState.STOPPED;
  post({ type: 'stopped' });
  parentPort!.removeAllListeners('message');
  parentPort!.close();
}

/** Hands a warm model to the loop, its cost model seeded with the warm-up's timings. */
function serve(loop: InferenceLoop, o: Served, timings: { bucket: number; rows: number; ms: number }[], device: DeviceInfo, fusions: GraphFusions): void {
  o.shared.counters[Counter.RUN_CORES] = coresPerRun(device.kind, data.intraOpThreads, o.model.spec.hiddenSize);
  metrics.fusedLayerNorms.set({ model: o.model.spec.name }, fusions.layerNorms);
  metrics.fusedAttentions.set({ model: o.model.spec.name }, fusions.attentions);
  loop.addModel(o.model.id, data.testHooks ? hooked(o.runner) : o.runner, o.shared);
  for (const t of timings) loop.seedCost(o.model.id, t.bucket, t.rows, t.ms);
  served.set(o.model.id, { ...o, cells: batchCells(o.model.spec.name) });
}

/**
 * RPC from the main thread while the loop runs (src/main/repository/repository.ts):
 *   addModel(WorkerModel) -> ModelOpened   opens, warms up and serves one more model
 *   removeModel(id)                        stops serving an idle model and frees its session
 * A model added while serving opens, warms up and runs on a session thread of its own
 * (threaded-runner.ts): this thread's loop goes on serving the others meanwhile.
 */
function modelHandlers(loop: InferenceLoop, device: DeviceInfo): RpcHandlers {
  return {
    addModel: async (arg) => {
      const model = arg as WorkerModel;
      if (served.has(model.id)) throw new Error(`model ${model.id} is served already`);
      const deviceUsed = () => (device.kind === 'cuda' ? (describeCuda(device.id).memoryUsedBytes ?? null) : null);
      const deviceBefore = deviceUsed();
      const rssBefore = process.memoryUsage.rss();
      const shared = new Slab(model.slab, model.layout);
      const [first, ...others] = await openThreaded(model, shared, device, instancesOf(model, device), new SharedArrayBuffer(shared.privateOutputBytes));
      serve(loop, { model, shared, runner: new ModelInstances(first!, [first!, ...others]) }, first!.opened.timings, device, first!.opened.fusions);
      // What opening freed (graph optimization's copies of the weights) stays in the session thread's
      // own malloc arena otherwise, a large part of a big model's RSS (docs/model-repository.md).
      trimNative();
      const deviceAfter = deviceUsed();
      const deviceBytes = deviceBefore !== null && deviceAfter !== null ? deviceAfter - deviceBefore : null;
      // Its instances opened side by side: the slowest one is how long the model took.
      const openMs = Math.max(first!.opened.openMs, ...others.map((r) => r.opened.openMs));
      const warmUpMs = Math.max(first!.opened.warmUpMs, ...others.map((r) => r.opened.warmUpMs));
      return { openMs, warmUpMs, rssBytes: process.memoryUsage.rss() - rssBefore, deviceBytes } satisfies ModelOpened;
    },
    removeModel: async (arg) => {
      const id = arg as number;
      const s = served.get(id);
      if (!s) return;
      loop.removeModel(id);
      served.delete(id);
      metrics.fusedLayerNorms.remove({ model: s.model.spec.name });
      metrics.fusedAttentions.remove({ model: s.model.spec.name });
      await s.runner.release();
      trimNative(); // the session's memory back to the system, not kept in malloc's free lists
    },
  };
}

// ------------------------------------------------------------------ test hooks (SLABSERVE_TEST_HOOKS=1 only)

/** What the next batch run of at least `minRows` rows does (test hooks). */
let nextRunFault: { kind: 'throw' | 'exit' | 'hang'; minRows: number } | null = null;

/** Blocks this thread for good (until it is terminated): what a run stuck on the device looks like from outside. */
function blockForever(): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);
}

function testHookHandlers(hooks: InferenceTestHooks) {
  return {
    testFault: (arg: unknown) => {
      const { kind, minRows = 1 } = arg as { kind: InferenceFault; minRows?: number };
      switch (kind) {
        case 'throw':
        case 'exit':
        case 'hang':
          nextRunFault = { kind, minRows };
          break;
        case 'stall':
          setImmediate(blockForever);
          break;
        default:
          throw new Error(`unknown test fault ${String(kind)}`);
      }
    },
    testPoison: (id: unknown) => {
      hooks.poisonToken = Number(id);
    },
  };
}

/** A runner whose runs obey the test hooks: hang, or swap the poison token for an id onnxruntime refuses. */
function hooked(r: LoopRunner): LoopRunner {
  const hooks = data.testHooks!;
  return {
    spec: r.spec,
    slab: r.slab,
    options: r.options,
    ...(r.instances !== undefined ? { instances: r.instances } : {}),
    ...(r.takes ? { takes: r.takes.bind(r) } : {}),
    run: (slots, bucket, queued) => {
      const fault = nextRunFault && slots.length >= nextRunFault.minRows ? nextRunFault.kind : null;
      if (fault) nextRunFault = null;
      // Queued before onnxruntime's own setImmediate: the thread goes while this batch is RUNNING.
      if (fault === 'throw') {
        setImmediate(() => {
          throw new Error('slabserve test hook: inference thread fault');
        });
      } else if (fault === 'exit') setImmediate(() => process.exit(70));
      else if (fault === 'hang') blockForever();
      if (hooks.poisonToken >= 0) {
        for (const slot of slots) {
          const ids = r.slab.slotIds(slot);
          const len = r.slab.header(slot, H_LENGTH);
          for (let i = 0; i < len; i++) if (ids[i] === hooks.poisonToken) ids[i] = 1 << 30;
        }
      }
      return r.run(slots, bucket, queued);
    },
  };
}

/** LoopOptions.hold from the hold cell: parked, the loop keeps its heartbeat fresh (it is held, not hung). */
function holdHook(hooks: InferenceTestHooks): () => Promise<void> | undefined {
  const hold = new InferenceHold(hooks.hold);
  const stay = () => {
    if (!live() || control.stopRequested()) return false;
    control.heartbeat = nowMs();
    return true;
  };
  return () => hold.park(stay, data.idleWakeMs ?? IDLE_WAKE_MS);
}

function createLoop(device: DeviceInfo): InferenceLoop {
  return new InferenceLoop([], control, {
    ...(data.testHooks ? { hold: holdHook(data.testHooks) } : {}),
    maxInflightBatches: data.maxInflightBatches,
    scheduling: data.scheduling,
    epoch: data.epoch,
    ...(data.idleWakeMs !== undefined ? { idleWakeMs: data.idleWakeMs } : {}),
    idleSpinUs: data.idleSpinUs,
    splitFailedBatches: true,
    onSplit: (model, outcome) => post({ type: 'split', model, ...outcome }),
    onBatchError: (model, error) => {
      metrics.batchFailures.inc({ model });
      post({ type: 'batch-error', model, message: (error as Error)?.message ?? String(error) });
    },
    ...(tracing ? { traceBatch: batchTracing(tracing, device.label) } : {}),
    onBatch: (m, bucket, stats) => {
      const { model, cells } = served.get(m)!;
      const batching = model.batching;
      cells.size.observe(stats.rows);
      cells.duration.observe(stats.runMs / 1000);
      cells.fill.observe(stats.rows / batchCapacity(batching, batching.buckets[bucket]!));
      cells.padding.observe(stats.realTokens / stats.paddedTokens);
    },
  });
}

void main();
