/**
 * The inference thread from the main thread, shared by the in-process engine
 * and the server: start it and wait for its warm-up; then supervise it
 * (InferenceSupervisor): a thread that dies or hangs is given up, its
 * requests answered 503 (src/main/threads/slot-reclaim.ts), and a new one started on the
 * same slabs. The models it runs are planned in src/main/plan-models.ts.
 */
import type { TracingConfig } from '../../shared/telemetry/tracing.js';
import { Worker } from 'node:worker_threads';
import type { Registry } from 'prom-client';
import { describeDevice, type DeviceInfo } from '../../gpu-worker/device.js';
import { InferenceHold } from '../../gpu-worker/hold.js';
import type { SchedulingOptions } from '../../gpu-worker/inference-loop.js';
import { OPTIONS, type BatchingName, type NamesOf, type ResolvedValues } from '../../shared/options.js';
import type { InferenceFault, InferenceTestHooks, InferenceThreadIds, InferenceWorkerData, InferenceWorkerMessage, ModelOpened, WorkerModel } from '../../gpu-worker/thread.js';
import { nowMs, settlesWithin } from '../../shared/clock.js';
import { WorkerState, type ControlBlock } from '../../shared/control.js';
import { checkIntegerIn, SlabserveError, ValidationError } from '../../shared/errors.js';
import type { ModelPlan } from '../../shared/model-plan.js';
import { RpcPeer } from '../../shared/rpc.js';
import { newFamily, terminateOutsideNativeCalls } from '../../shared/native-gate.js';
import { autoIntraOpThreads, autoModelInstances } from '../../gpu-worker/intra-op-threads.js';
import { keepOnnxruntimeTelemetryOff } from '../onnxruntime-telemetry.js';
import { describeSettings } from '../plan-models.js';
import type { ModelSet } from '../repository/model-set.js';
import { reclaimInference } from './slot-reclaim.js';

export interface InferenceThreadOptions {
  device: string;
  intraOpThreads: number;
  /** Nice value (0-19) of onnxruntime's intra-op threads on CPU; 0: the process's own. */
  intraOpNice: number;
  maxInflightBatches: number;
  /** Sessions of each model running batches side by side; 0: the auto rule (src/gpu-worker/intra-op-threads.ts). */
  modelInstances: number;
  /** Microseconds the inference loop spins before it sleeps (--idle-spin-us). */
  idleSpinUs: number;
  /** Priority classes, their ageing, and the latency target. */
  scheduling: SchedulingOptions;
  log: (line: string) => void;
  /** The control block's epoch this thread is started with (default: the block's current one). */
  epoch?: number;
  /** Test hooks (SLABSERVE_TEST_HOOKS=1 only). */
  testHooks?: InferenceTestHooks;
  /** Log the device and models once ready (default true; a restart logs one line of its own). */
  logStart?: boolean;
  /** The longest the inference loop sleeps when idle (it refreshes the heartbeat then); default the loop's (1 s). */
  idleWakeMs?: number;
  /** Tracing on: a span per batch carrying a sampled request (docs/tracing.md). */
  tracing?: TracingConfig | undefined;
}

export interface InferenceThread {
  worker: Worker;
  /** The native gates of the thread and of its session threads (shared/native-gate.ts): end it with terminateOutsideNativeCalls, never terminate(). */
  gates: SharedArrayBuffer;
  /** Resolves with the device once every model is loaded and warmed up. */
  ready: Promise<DeviceInfo>;
  /** Its kernel thread ids, once ready (per-thread CPU metrics). */
  threads: InferenceThreadIds;
}

/** Starts the inference thread; `ready` settles when warm-up ends (or start-up fails). */
export function startInferenceThread(models: ModelPlan[], control: ControlBlock, opts: InferenceThreadOptions): InferenceThread {
  if (!Number.isInteger(opts.maxInflightBatches) || opts.maxInflightBatches < 1) {
    throw new ValidationError('maxInflightBatches must be a positive integer');
  }
  checkIntegerIn('modelInstances', opts.modelInstances, '0 (auto)', OPTIONS.modelInstances.max!);
  checkIntegerIn('idleSpinUs', opts.idleSpinUs, '0', OPTIONS.idleSpinUs.max!);
  checkIntegerIn('intraOpNice', opts.intraOpNice, '0', 19);
  keepOnnxruntimeTelemetryOff(); // before the thread's first session (src/main/onnxruntime-telemetry.ts)
  const gates = newFamily();
  const workerData: InferenceWorkerData = {
    control: control.buffer,
    gates,
    owners: control.owners,
    device: opts.device,
    intraOpThreads: opts.intraOpThreads,
    intraOpNice: opts.intraOpNice,
    maxInflightBatches: opts.maxInflightBatches,
    modelInstances: opts.modelInstances,
    idleSpinUs: opts.idleSpinUs,
    scheduling: opts.scheduling,
    models: models.map(workerModel),
    epoch: opts.epoch ?? control.epoch,
    ...(opts.idleWakeMs !== undefined ? { idleWakeMs: opts.idleWakeMs } : {}),
    ...(opts.testHooks ? { testHooks: opts.testHooks } : {}),
    ...(opts.tracing ? { tracing: opts.tracing } : {}),
  };
  const worker = new Worker(new URL('../../gpu-worker/thread.js', import.meta.url), { workerData, name: 'slabserve-inference' });
  const threads: InferenceThreadIds = { inference: null, pool: [] };
  const ready = new Promise<DeviceInfo>((res, rej) => {
    const onExit = (code: number) => rej(new Error(`inference thread exited during start-up (code ${code})`));
    worker.once('exit', onExit);
    worker.once('error', rej);
    worker.on('message', (m: InferenceWorkerMessage) => {
      if (m.type === 'ready') {
        worker.off('exit', onExit);
        Object.assign(threads, m.threads);
        if (opts.logStart !== false) {
          if (m.note) opts.log(`slabserve: ${m.note}`);
          opts.log(`slabserve: device ${describeDevice(m.device)}`);
          for (const plan of models) {
            const threads = m.device.kind === 'cpu' ? ` intraOpThreads=${opts.intraOpThreads || `${autoIntraOpThreads(plan.spec.hiddenSize)} (auto)`}` : '';
            const auto = autoModelInstances(m.device.kind, opts.intraOpThreads, plan.spec.hiddenSize);
            const instances = ` instances=${opts.modelInstances || `${auto} (auto)`}`;
            opts.log(`slabserve: model ${plan.spec.name} ${describeSettings(plan)} device=${m.device.label}${threads}${instances} buckets=${plan.batching.buckets.join(',')} maxBatchSize=${plan.batching.maxBatchSize}`);
          }
        }
        res(m.device);
      } else if (m.type === 'fatal') {
        rej(new SlabserveError(`inference thread failed to start: ${m.message}`, 'SLABSERVE_START_FAILED', 'unavailable'));
      } else if (m.type === 'batch-error') {
        opts.log(`slabserve: batch of model ${m.model} failed: ${m.message.split('\n')[0]}`);
      } else if (m.type === 'split') {
        opts.log(
          `slabserve: failed batch of model ${m.model} split in ${m.runs} runs: ${m.ran} input${m.ran === 1 ? '' : 's'} ran, ` +
            `${m.failed} failed${m.ran > 0 ? ' alone (422)' : ' (500: nothing ran)'}`,
        );
      }
    });
  });
  return { worker, gates, ready, threads };
}

/** A plan as the inference thread takes it (no gateway-side fields). */
export function workerModel(plan: ModelPlan): WorkerModel {
  return { id: plan.index, spec: plan.spec, slab: plan.slab, layout: plan.layout, batching: plan.batching };
}

// =================================================================== supervision

/** The longest a model's open and warm-up may take in the inference thread before its load fails. */
const LOAD_RPC_MS = 10 * 60_000;

/** The environment variable that turns the test hooks on (read when a server or an engine starts). */
export const TEST_HOOKS_ENV = 'SLABSERVE_TEST_HOOKS';
/**
 * With the test hooks on, the inference thread starts with the open hold held (holdModelOpen): it
 * opens its start-up models only at releaseModelOpen(), so a test sees the server listening and not
 * ready for as long as it needs, however fast warm-up is.
 */
export const TEST_HOLD_START_ENV = 'SLABSERVE_TEST_HOLD_START';
/** With the test hooks on: the gateway of this index starts only once the server's stop signal fires (tests of a stop mid-start). */
export const TEST_HOLD_GATEWAY_ENV = 'SLABSERVE_TEST_HOLD_GATEWAY';

/**
 * What a test may do to the inference loop through a server or an engine (SLABSERVE_TEST_HOOKS=1):
 * hold it, so that the requests it sends meanwhile all wait, and let it go once they do; then the
 * scheduler sees them all at its next decision, and how many batches they make is no matter of timing.
 */
export interface InferenceHoldHooks {
  /** Resolves once the loop is parked: from then on it takes nothing in and starts no batch, in this thread and its replacements. */
  holdInference(): Promise<void>;
  /** The parked loop goes on. Closing the server or engine releases it too. */
  releaseInference(): void;
  /** Inputs of `model` submitted and not yet taken in by the loop (on its submit ring): while held, every one sent. */
  inputsWaiting(model: string): number;
  /**
   * From now on a model loaded while serving blocks its session thread before it opens (synchronously,
   * as onnxruntime-node's session creation blocks the thread that makes it), until releaseModelOpen().
   */
  holdModelOpen(): void;
  /** Resolves once a session thread is blocked by holdModelOpen. */
  modelOpenParked(): Promise<void>;
  releaseModelOpen(): void;
}

/** A bound only to catch a hang: the loop parks at the end of its round (after a running batch, or a restart's warm-up). */
const PARK_LIMIT_MS = 60_000;

/** Why an inference thread was replaced (the `reason` label of slabserve_inference_restarts_total). */
export type RestartReason = 'crash' | 'oom' | 'exit' | 'run_timeout' | 'heartbeat_timeout';

export interface SupervisionOptions {
  /** A batch run longer than this: the thread is given up and replaced (--inference-timeout-ms). */
  inferenceTimeoutMs: number;
  /** A loop that has not gone round for this long with no run in flight: given up and replaced (--heartbeat-timeout-ms). */
  heartbeatTimeoutMs: number;
  /** Told of every replacement (metrics). */
  onRestart?: (e: RestartEvent) => void;
  /** Enable the inference test hooks (SLABSERVE_TEST_HOOKS=1). */
  enableTestHooks?: boolean;
}

export interface RestartEvent {
  reason: RestartReason;
  detail: string;
  /** Inputs answered 503 (queued, running, or on a submit ring when the thread was given up). */
  answered: number;
}

type MetricsJson = Awaited<ReturnType<Registry['getMetricsAsJSON']>>;

interface ThreadRecord {
  worker: Worker;
  gates: SharedArrayBuffer;
  rpc: RpcPeer;
  epoch: number;
  threads: InferenceThreadIds;
  ready: Promise<DeviceInfo>;
  isReady: boolean;
  exited: boolean;
  /** 'error' event, if any, before it exited. */
  error?: Error;
  exitCode?: number;
  exitedPromise: Promise<void>;
  /** Ids of the models it serves (started with, added since, less those removed). */
  models: Set<number>;
}

/**
 * How often the watchdog reads the heartbeat and the run start (shared memory; no message):
 * a twentieth of the shorter timeout, between 50 ms and a second (a second with the 30 s defaults,
 * so an idle process does not wake for it ten times a second).
 */
function watchMs(o: Pick<SupervisionOptions, 'inferenceTimeoutMs' | 'heartbeatTimeoutMs'>): number {
  return Math.min(1000, Math.max(50, Math.min(o.inferenceTimeoutMs, o.heartbeatTimeoutMs) / 20));
}
/**
 * The longest the idle inference loop sleeps (it wakes to refresh its heartbeat): each wake costs an
 * idle process CPU, so the 30 s default timeout gets one every 5 s, no more.
 */
const IDLE_WAKE_MAX_MS = 5000;
/** Backoff between failed starts of a replacement thread: doubles from this, up to MAX_BACKOFF_MS. */
const FIRST_BACKOFF_MS = 500;
const MAX_BACKOFF_MS = 10_000;
/** Longest a scrape waits for the inference thread's own metrics. */
const METRICS_RPC_MS = 1000;

/**
 * Keeps one live inference thread per process. The first one is started at
 * once (`ready` settles with its warm-up; a start-up failure is not retried).
 * After that, a thread that dies (an uncaught error, out of memory, an exit)
 * or hangs (a batch run past inferenceTimeoutMs, or a loop that has not gone
 * round for heartbeatTimeoutMs while no batch runs) is given up:
 *
 *   1. the control block turns RESTARTING (readiness 503, new requests 503) and
 *      its epoch moves on, so the old thread touches no slot again;
 *   2. the old thread is terminated once neither it nor its session threads
 *      are inside a native call (shared/native-gate.ts: terminated inside one,
 *      a thread aborts the process), and not waited for: a thread stuck in a
 *      native onnxruntime call only ends after that call returns (abandoned;
 *      counted until it exits);
 *   3. every request it held, and every one on a submit ring, is answered 503
 *      (SLABSERVE_INFERENCE_RESTARTED) and cancelled ones are freed
 *      (reclaimInference);
 *   4. a new thread starts on the same slabs, warms up, and turns READY.
 */
export class InferenceSupervisor {
  readonly ready: Promise<DeviceInfo>;
  private readonly models: ModelSet;
  private readonly control: ControlBlock;
  private readonly opts: Omit<InferenceThreadOptions, 'epoch' | 'testHooks' | 'logStart'> & SupervisionOptions;
  private readonly hooks: InferenceTestHooks | undefined;
  private readonly hold = new InferenceHold();
  private readonly openHold = new InferenceHold();
  private current: ThreadRecord;
  private readonly abandonedThreads = new Set<ThreadRecord>();
  private restarting: Promise<void> | null = null;
  private stopping = false;
  private watchdog: NodeJS.Timeout | undefined;
  private restartCount = 0;

  /** Serves `models` as they are now; addModel()/removeModel() change them while it runs. */
  constructor(models: ModelSet, control: ControlBlock, opts: Omit<InferenceThreadOptions, 'epoch' | 'testHooks' | 'logStart'> & SupervisionOptions) {
    for (const [name, v] of [
      ['inferenceTimeoutMs', opts.inferenceTimeoutMs],
      ['heartbeatTimeoutMs', opts.heartbeatTimeoutMs],
    ] as const) {
      if (!Number.isInteger(v) || v < 1) throw new ValidationError(`${name} must be a positive integer (ms), got ${v}`);
    }
    this.models = models;
    this.control = control;
    this.opts = opts;
    this.hooks = opts.enableTestHooks ? { poisonToken: -1, hold: this.hold.buffer, openHold: this.openHold.buffer } : undefined;
    if (this.hooks && process.env[TEST_HOLD_START_ENV] === '1') this.openHold.hold();
    this.current = this.start(true);
    this.ready = this.current.ready.then((device) => {
      this.watchdog = setInterval(() => this.watch(), watchMs(this.opts));
      this.watchdog.unref();
      return device;
    });
    this.ready.catch(() => {});
  }

  /** Replacements so far. */
  get restarts(): number {
    return this.restartCount;
  }

  /** Threads given up that have not exited yet (stuck in a native call). */
  get abandoned(): number {
    return this.abandonedThreads.size;
  }

  /** The live thread's kernel thread ids (none until it is ready). */
  get threads(): InferenceThreadIds {
    return this.current.threads;
  }

  /** The live thread's metrics registry, as JSON ([] while none is ready). */
  metrics(): Promise<MetricsJson> {
    const t = this.current;
    if (!t.isReady || t.exited || this.control.workerState !== WorkerState.READY) return Promise.resolve([] as unknown as MetricsJson);
    return t.rpc.call<MetricsJson>('metrics', undefined, METRICS_RPC_MS); // it answers between runs: do not hold a scrape for a long one
  }

  /** Test hook (SLABSERVE_TEST_HOOKS=1): makes the live thread fail (throw, exit, hang: in its next run of at least `minRows` rows). */
  async testFault(kind: InferenceFault, minRows = 1): Promise<void> {
    if (!this.hooks) throw new Error('test hooks are off: start the server with SLABSERVE_TEST_HOOKS=1');
    await this.current.rpc.call('testFault', { kind, minRows });
  }

  /** Test hook (SLABSERVE_TEST_HOOKS=1): inputs holding token `id` fail in onnxruntime, in this thread and its replacements; -1: none. */
  async testPoison(id: number): Promise<void> {
    if (!this.hooks) throw new Error('test hooks are off: start the server with SLABSERVE_TEST_HOOKS=1');
    this.hooks.poisonToken = id;
    await this.current.rpc.call('testPoison', id);
  }

  /** The hold hooks (InferenceHoldHooks) on this supervisor's threads (SLABSERVE_TEST_HOOKS=1). */
  holdHooks(): InferenceHoldHooks {
    const hooksOn = () => {
      if (!this.hooks) throw new Error('test hooks are off: start with SLABSERVE_TEST_HOOKS=1');
    };
    return {
      holdInference: async () => {
        hooksOn();
        this.hold.hold();
        this.control.workerBell.ring(); // an idle loop ends its round now, and parks
        await this.hold.parked(PARK_LIMIT_MS);
      },
      releaseInference: () => {
        hooksOn();
        this.hold.release();
      },
      holdModelOpen: () => {
        hooksOn();
        this.openHold.hold();
      },
      modelOpenParked: () => {
        hooksOn();
        return this.openHold.parked(PARK_LIMIT_MS);
      },
      releaseModelOpen: () => {
        hooksOn();
        this.openHold.release();
      },
      inputsWaiting: (model) => {
        hooksOn();
        const plan = this.models.byName(model);
        if (!plan) throw new Error(`no model ${model}`);
        return this.models.slab(plan.index)!.submit.size();
      },
    };
  }

  /**
   * No more replacements; the live thread stops after its running batches
   * (requests still queued fail) and this resolves once it has exited. A
   * thread being warmed up as a replacement stops once warm. Abandoned threads
   * are not waited for.
   */
  async stop(): Promise<void> {
    this.stopping = true;
    clearInterval(this.watchdog);
    this.hold.release(); // a test's hold never outlives the thread
    this.openHold.release();
    this.control.requestStop();
    if (this.restarting) await this.restarting;
    const t = this.current;
    await t.ready.catch(() => {});
    // A thread that hangs does not stop either: give it as long as the watchdog would, then terminate it.
    const limit = Math.max(this.opts.inferenceTimeoutMs, this.opts.heartbeatTimeoutMs);
    if (!(await settlesWithin(t.exitedPromise, limit))) {
      this.opts.log(`slabserve: the inference thread did not stop within ${limit} ms; terminating it`);
      this.abandonedThreads.add(t);
      void terminateOutsideNativeCalls(t.worker, t.gates).catch(() => {});
      await settlesWithin(t.exitedPromise, 2000);
    }
    if (this.abandonedThreads.size > 0) {
      this.opts.log(
        `slabserve: ${this.abandonedThreads.size} abandoned inference thread(s) still stuck in a native call; ` +
          'the process cannot exit normally until they return (SIGKILL ends it)',
      );
    }
  }

  /**
   * Opens `plan` (already in the model set's ids, not yet in it) in the live thread, warms it up
   * beside the other models' batches, and serves it; resolves once it takes requests. Rejects with
   * the reason if it cannot be opened, or with a 503 if the thread dies meanwhile (its replacement
   * serves the models that were loaded). Call add() on the model set once this resolves.
   */
  async addModel(plan: ModelPlan): Promise<ModelOpened> {
    const t = await this.liveThread();
    const died = t.exitedPromise.then(() => {
      throw new SlabserveError(`the inference thread ended while it loaded model ${plan.spec.name}; it was restarted without it`, 'SLABSERVE_LOAD_INTERRUPTED', 'unavailable');
    });
    died.catch(() => {}); // only the race below reads it
    const opened = await Promise.race([t.rpc.call<ModelOpened>('addModel', workerModel(plan), LOAD_RPC_MS), died]);
    t.models.add(plan.index);
    return opened;
  }

  /** Stops serving model `id` and frees its session. Call once nothing of it is queued or running (its slots all free). */
  async removeModel(id: number): Promise<void> {
    const t = this.current;
    if (!t.models.has(id)) return; // a replacement started without it
    t.models.delete(id);
    if (t.isReady && !t.exited) await t.rpc.call('removeModel', id, LOAD_RPC_MS).catch(() => {}); // a thread that dies now takes it along
  }

  /** The live thread once ready (after a restart in progress). */
  private async liveThread(): Promise<ThreadRecord> {
    if (this.stopping) throw new SlabserveError('the server is stopping', 'SLABSERVE_NOT_READY', 'unavailable');
    if (this.restarting) await this.restarting;
    await this.current.ready;
    return this.current;
  }

  private start(first: boolean): ThreadRecord {
    const epoch = this.control.epoch;
    const plans = this.models.plans();
    const t = startInferenceThread(plans, this.control, {
      ...this.opts,
      // a quarter of the heartbeat timeout, at most IDLE_WAKE_MAX_MS: readiness never sees a stale heartbeat at rest
      idleWakeMs: Math.min(IDLE_WAKE_MAX_MS, this.opts.heartbeatTimeoutMs / 4),
      epoch,
      logStart: first,
      ...(this.hooks ? { testHooks: { ...this.hooks } } : {}),
    });
    const rec: ThreadRecord = {
      worker: t.worker,
      gates: t.gates,
      rpc: new RpcPeer(t.worker),
      epoch,
      threads: t.threads,
      ready: t.ready,
      isReady: false,
      exited: false,
      exitedPromise: Promise.resolve(),
      models: new Set(plans.map((p) => p.index)),
    };
    rec.exitedPromise = new Promise<void>((resolve) => {
      t.worker.on('error', (err) => (rec.error = err));
      t.worker.once('exit', (code) => {
        rec.exited = true;
        rec.exitCode = code;
        resolve();
        this.onExit(rec);
      });
    });
    t.ready.then(
      () => (rec.isReady = true),
      () => {},
    );
    return rec;
  }

  private onExit(rec: ThreadRecord): void {
    if (this.abandonedThreads.delete(rec)) {
      this.opts.log(`slabserve: abandoned inference thread (epoch ${rec.epoch}) has exited`);
      return;
    }
    if (rec !== this.current || !rec.isReady || this.stopping || this.restarting) return; // a start-up failure, a stop, or a restart in progress (it checks again)
    const reason: RestartReason = rec.error ? ((rec.error as { code?: string }).code === 'ERR_WORKER_OUT_OF_MEMORY' ? 'oom' : 'crash') : 'exit';
    const detail = rec.error ? `uncaught ${rec.error.name}: ${rec.error.message.split('\n')[0]}` : `exited with code ${rec.exitCode}`;
    this.restart(reason, detail);
  }

  /** Reads the heartbeat and the run start; gives up a thread that hangs. */
  private watch(): void {
    if (this.stopping || this.restarting || !this.current.isReady || this.control.workerState !== WorkerState.READY) return;
    const now = nowMs();
    const runStarted = this.control.runStartedAt;
    if (runStarted > 0) {
      const ms = now - runStarted;
      if (ms > this.opts.inferenceTimeoutMs) this.restart('run_timeout', `a batch has run for ${Math.round(ms)} ms (--inference-timeout-ms ${this.opts.inferenceTimeoutMs})`);
    } else {
      const ms = now - this.control.heartbeat;
      if (ms > this.opts.heartbeatTimeoutMs) {
        this.restart('heartbeat_timeout', `its loop has not gone round for ${Math.round(ms)} ms with no batch running (--heartbeat-timeout-ms ${this.opts.heartbeatTimeoutMs})`);
      }
    }
  }

  private restart(reason: RestartReason, detail: string): void {
    this.restarting = this.replace(reason, detail).finally(() => {
      this.restarting = null;
    });
  }

  private async replace(reason: RestartReason, detail: string): Promise<void> {
    for (;;) {
      const old = this.current;
      const since = nowMs();
      this.control.workerState = WorkerState.RESTARTING;
      this.control.nextEpoch(); // the old thread touches no slot from here on
      this.hold.forgetParked();
      if (!old.exited) {
        this.abandonedThreads.add(old);
        void terminateOutsideNativeCalls(old.worker, old.gates).catch(() => {});
      }
      const answered = reclaimInference(this.models.plans(), this.models.slabs, this.control, old.epoch);
      this.restartCount++;
      this.opts.log(`slabserve: inference thread ${reason}: ${detail}; ${answered} input${answered === 1 ? '' : 's'} answered 503; starting a new one (restart ${this.restartCount})`);
      this.opts.onRestart?.({ reason, detail, answered });
      for (let attempt = 0; ; attempt++) {
        if (this.stopping) return;
        this.current = this.start(false);
        try {
          await this.current.ready;
          break;
        } catch (err) {
          const wait = Math.min(MAX_BACKOFF_MS, FIRST_BACKOFF_MS * 2 ** attempt);
          this.opts.log(`slabserve: replacement inference thread failed to start (${(err as Error).message.split('\n')[0]}); retrying in ${wait} ms`);
          await new Promise((r) => setTimeout(r, wait).unref());
        }
      }
      if (this.stopping) return;
      this.opts.log(`slabserve: inference thread ready again after ${Math.round(nowMs() - since)} ms`);
      // Died again between its warm-up and now: replace it again.
      const t = this.current;
      if (!t.exited) return;
      reason = t.error ? 'crash' : 'exit';
      detail = t.error ? `uncaught ${t.error.name}: ${t.error.message.split('\n')[0]}` : `exited with code ${t.exitCode}`;
    }
  }
}

/** The options the inference thread takes, resolved (src/shared/options.ts): the server's and the engine's alike. */
export type InferenceOptionValues = ResolvedValues<Exclude<NamesOf<'engine'>, BatchingName>>;

/** The inference supervisor's options from the option values: the one wiring the server and the engine share. */
export function inferenceOptionsOf(o: InferenceOptionValues, log: (line: string) => void, enableTestHooks: boolean): Omit<InferenceThreadOptions, 'epoch' | 'testHooks' | 'logStart'> & SupervisionOptions {
  return {
    device: o.device,
    intraOpThreads: o.intraOpThreads,
    intraOpNice: o.intraOpNice,
    modelInstances: o.modelInstances,
    idleSpinUs: o.idleSpinUs,
    maxInflightBatches: o.maxInflightBatches,
    scheduling: {
      priorityWeights: o.priorities.map((p) => p.weight),
      priorityAgeingMs: o.priorityAgeingMs,
      ...(o.sloP99Ms !== undefined ? { sloP99Ms: o.sloP99Ms } : {}),
    },
    log,
    inferenceTimeoutMs: o.inferenceTimeoutMs,
    heartbeatTimeoutMs: o.heartbeatTimeoutMs,
    enableTestHooks,
  };
}
