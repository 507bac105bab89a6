/**
 * The slabserve process: loads the model repository, starts the inference
 * thread and the gateway threads, serves /metrics for all of them, and drains
 * on SIGTERM. `slabserve serve` (src/cli.ts) calls startServer().
 *
 *   main thread      config, slabs, supervision, metrics aggregation, drain
 *   gateway threads  uWebSockets.js on one shared port (src/gateway/thread.ts)
 *   inference thread one per device (src/gpu-worker/thread.ts)
 *
 * Supervision: an inference thread that dies or hangs is replaced by
 * InferenceSupervisor (src/main/threads/inference-supervisor.ts); a gateway thread that dies
 * (an uncaught error: it closes its sockets and ends) by GatewaySupervisor
 * (src/main/threads/gateway-supervisor.ts), its slots released and its listen socket back on
 * the port. This file wires them together: metrics, /info, the drain.
 *
 * Test hooks: with SLABSERVE_TEST_HOOKS=1 in the environment when the server
 * starts, `server.testHooks` can make the threads fail, hold the inference
 * loop while a test queues its requests, and set the cost model admission
 * reads (tests only; absent otherwise, and the threads carry no hook).
 */
import { resolveTracing, type TracingConfig } from '../shared/telemetry/tracing.js';
import { lookup } from 'node:dns/promises';
import { createServer as createNetServer, type AddressInfo } from 'node:net';
import { cpus } from 'node:os';
import { AggregatorRegistry, collectDefaultMetrics, Registry } from 'prom-client';
import { describeModel, slabStats } from './engine.js';
import type { GatewayWorkerData } from '../gateway/thread.js';
import { GATEWAY_OPTIONS } from '../gateway/options.js';
import type { GrpcListen } from '../gateway/grpc/server.js';
import { quietListenSockets } from './drain/accept-queue.js';
import { checkDevice, describeCuda, type DeviceInfo } from '../gpu-worker/device.js';
import type { UwsChoice } from '../gateway/uws.js';
import { checkNativeBinaries } from './native-binaries.js';
import type { BatchingOptions } from '../gpu-worker/scheduler.js';
import type { InferenceFault } from '../gpu-worker/thread.js';
import { GatewaySupervisor } from './threads/gateway-supervisor.js';
import { inferenceOptionsOf, InferenceSupervisor, TEST_HOLD_GATEWAY_ENV, TEST_HOLD_START_ENV, TEST_HOOKS_ENV, type InferenceHoldHooks } from './threads/inference-supervisor.js';
import { ModelRepository } from './repository/repository.js';
import type { RepositoryAnswer, RepositoryOp } from '../shared/repository-protocol.js';
import { ModelSet } from './repository/model-set.js';
import { ModelBudget } from './repository/model-budget.js';
import { loadModels, locateHubModel, locateModels, modelsDirOf, planningOf, planWhileServing, type Planning } from './plan-models.js';
import type { ModelPlan } from '../shared/model-plan.js';
import { nowMs } from '../shared/clock.js';
import { ControlBlock, WorkerState } from '../shared/control.js';
import { checkIntegerIn, SlabserveError, ValidationError } from '../shared/errors.js';
import { cacheMetrics, processMetrics, repositoryMetrics, supervisionMetrics } from '../shared/telemetry/metrics.js';
import { cacheLayoutOf, KEY_TOKENS, ResultCache, WAYS } from '../shared/result-cache.js';
import { Counter, Slab } from '../shared/slab.js';
import { DEFAULT_GRPC_PORT, DEFAULTS, OPTIONS, pickOptions, unbatchedNamesOf, withDefaults, type BatchingName, type NamesOf, type OptionValues, type ResolvedValues } from '../shared/options.js';
import { processThreadIds, threadCpuSeconds, threadName } from '../shared/threads.js';
import { VERSION } from '../version.js';

/** The options a server takes by name (src/shared/options.ts): the engine's and the server's own, less those the command line turns into others. */
type ServerOptionName = Exclude<NamesOf<'server' | 'engine'>, BatchingName | 'loadModel' | 'apiKeyFile'>;

/**
 * What startServer takes: every option by its name in the table (src/shared/options.ts,
 * docs/configuration.md), each optional (absent: its default), the batching ones in `batching`;
 * and what only a program gives.
 */
export type ServerConfig = OptionValues<ServerOptionName> & {
  batching?: Partial<BatchingOptions>;
  /** Where the main thread's lines go (the CLI: stderr). */
  log: (line: string) => void;
  /**
   * Aborting it begins the drain at once, even while the server is still starting: from that
   * moment every gateway already serving refuses new requests (503, closing its connection), and
   * the rest of the drain (close()) runs as soon as the start is done (SIGTERM in the CLI).
   */
  signal?: AbortSignal;
  /** The port is shared on purpose (a cluster's process): no check that nothing else listens on it (nor on grpcPort). */
  sharedPort?: boolean;
  /** Gateway threads write access lines (one per request) straight to this file descriptor (the CLI: 1, stdout); absent, they reach `log`. */
  accessLogFd?: number;
  /** Replaces what /metrics answers (a cluster worker asks its primary for the whole cluster's: src/main/cluster/cluster.ts). */
  scrape?: () => Promise<string>;
  /** Replaces this process's repository operations (a cluster worker asks its primary, which applies them to every process). */
  repository?: (op: unknown) => Promise<unknown>;
};

/** A server's configuration with every default in place. */
export type ResolvedServerConfig = ServerConfig & ResolvedValues<ServerOptionName> & { gatewayThreads: number };

const SERVER_OPTION_NAMES = unbatchedNamesOf('server', 'engine');

/** `config` over the defaults. */
export function resolveServerConfig(config: ServerConfig): ResolvedServerConfig {
  const resolved = withDefaults(SERVER_OPTION_NAMES, config);
  return { ...resolved, gatewayThreads: resolved.gatewayThreads ?? defaultGatewayThreads() } as ResolvedServerConfig;
}

/** One gateway thread on 2 cores or fewer, else half the cores. */
export function defaultGatewayThreads(): number {
  const n = cpus().length;
  return n <= 2 ? 1 : Math.floor(n / 2);
}

/** The server's defaults (the table's, and the gateway threads this machine gets). */
export const SERVER_DEFAULTS = { ...DEFAULTS, gatewayThreads: defaultGatewayThreads() };

export interface Server {
  readonly port: number;
  /** gRPC's port; null when it is off (--grpc-port 0). */
  readonly grpcPort: number | null;
  readonly url: string;
  /** Resolves once every model is warmed up (then /readyz answers 200). */
  readonly ready: Promise<DeviceInfo>;
  /** Drains: readiness off, new requests refused, in-flight ones finish (up to drainTimeoutMs), sockets closed, threads stopped. */
  close(): Promise<void>;
  /** This process's metrics, every thread merged, as prom-client JSON (what /metrics shows without `scrape`). */
  metricsJson(): Promise<MetricsJson>;
  /** This process's own model repository (a cluster's primary applies an operation to each process through it). */
  repository(op: RepositoryOp): Promise<RepositoryAnswer>;
  /** Present only when the server was started with SLABSERVE_TEST_HOOKS=1 in the environment. */
  readonly testHooks?: ServerTestHooks;
}

/** Fault injection, and the inference hold (InferenceHoldHooks), for tests (SLABSERVE_TEST_HOOKS=1). */
export interface ServerTestHooks extends InferenceHoldHooks {
  /** Makes the inference thread's next batch run of at least `minRows` rows (default 1) throw (uncaught), exit or hang; or stalls its loop now. */
  inferenceFault(kind: InferenceFault, minRows?: number): Promise<void>;
  /** Inputs holding this token id fail in onnxruntime (the id is swapped for one past the vocabulary); -1: none. */
  poisonToken(id: number): Promise<void>;
  /** Makes gateway thread `gatewayId` throw an uncaught error. */
  gatewayFault(gatewayId: number): void;
  /**
   * Writes `cost` as every bucket's measured cost of `model`, which admission predicts waits from,
   * until the inference thread measures a batch of that bucket again: admission then decides by
   * the request's own cost, not by the machine's speed. Returns what puts the costs back.
   */
  setCost(model: string, cost: { fixedMs: number; perRowMs: number }): () => void;
}

export { TEST_HOLD_GATEWAY_ENV, TEST_HOLD_START_ENV, TEST_HOOKS_ENV };

type MetricsJson = Awaited<ReturnType<Registry['getMetricsAsJSON']>>;

/**
 * Refuses a fixed port something already listens on. uSockets binds a fixed
 * port with SO_REUSEPORT (so a process's gateways, and a cluster's processes,
 * share it), which also lets a second slabserve bind a port the first holds
 * and take half its traffic without a word; a plain socket has no
 * SO_REUSEPORT, so this probe fails wherever anything listens there.
 */
export function ensurePortFree(host: string, port: number, flag = '--port'): Promise<void> {
  return new Promise((resolve, reject) => {
    const probe = createNetServer();
    probe.once('error', (err: NodeJS.ErrnoException) =>
      reject(
        err.code === 'EADDRINUSE'
          ? new SlabserveError(`${host}:${port} is in use (another slabserve, or another program): stop it, or choose another ${flag}`, 'SLABSERVE_PORT_IN_USE', 'unavailable')
          : err,
      ),
    );
    probe.listen({ port, host, exclusive: true }, () => probe.close(() => resolve()));
  });
}

/**
 * Where the gateways bind gRPC (null: off): --grpc-port, checked free as --port is (a cluster's
 * primary checked it), or, when --port is 0 and --grpc-port not given, one the kernel picks as the
 * first gateway binds it (GatewaySupervisor.grpcPort); --host resolved to
 * a numeric address, which a socket made outside Node's net needs.
 */
async function grpcListen(config: ResolvedServerConfig): Promise<GrpcListen | null> {
  if (config.grpcPort === 0) return null;
  const port = config.grpcPort ?? (config.port === 0 ? 0 : DEFAULT_GRPC_PORT); // 0: the first gateway binds a port the kernel picks
  if (!config.sharedPort && (config.grpcPort !== undefined || config.port !== 0)) await ensurePortFree(config.host, port, '--grpc-port');
  const { address } = await lookup(config.host);
  const threads = config.grpcThreads || config.gatewayThreads;
  // Shared by several threads, or by a cluster's processes.
  return { address, port, streamMaxInflight: config.grpcStreamMaxInflight, shared: threads > 1 || config.sharedPort === true };
}

/**
 * The port the first gateway binds. A fixed --port is itself. With --port 0 and one gateway, 0: uWS
 * binds a port the kernel picks, free at that moment (exclusively: uSockets sets SO_REUSEPORT only
 * on a fixed port; a gateway restarted after a crash binds the number again once the dead one's
 * socket is gone). Several gateways must share the port, so they get a port picked first and bound
 * with SO_REUSEPORT; another process of the same user picking the same free port meanwhile would
 * share it, so one gateway (what the tests start) takes the atomic way.
 */
async function firstBindPort(config: ResolvedServerConfig): Promise<number> {
  if (config.port !== 0) return config.port;
  return config.gatewayThreads === 1 ? 0 : pickFreePort(config.host);
}

/** A port free right now on `host` (the kernel picks it). */
export function pickFreePort(host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createNetServer();
    srv.once('error', reject);
    srv.listen(0, host, () => {
      const { port } = srv.address() as AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

export async function startServer(given: ServerConfig): Promise<Server> {
  const config = resolveServerConfig(given);
  const log = config.log;
  // An operator's mistakes, before any thread starts: a taken port, a device this machine lacks.
  if (config.port !== 0 && !config.sharedPort) await ensurePortFree(config.host, config.port);
  const grpc = await grpcListen(config);
  checkDevice(config.device);
  checkRepositoryFlags(config);
  checkIntegerIn('loneWaitUs', config.loneWaitUs, '0', OPTIONS.loneWaitUs.max!);
  const uws = await checkNativeBinaries({ gateways: true });
  log(`slabserve: Node.js ${process.version}, uWebSockets.js ${uws.version} (${uws.package})`);
  const tracing = tracingOf(config);
  const grpcThreads = config.grpcThreads;
  const owners = 1 + config.gatewayThreads + grpcThreads; // owner 0 is this thread; gRPC's own threads are gateways too
  const planning = planningOf(config, config.batching, log, owners);
  const folders = await locateModels({ modelsDir: config.modelsDir, models: config.models, servedNames: config.servedModelNames, overrides: planning.overrides, log });
  const plans = await loadModels(folders, planning);
  const models = new ModelSet(plans);
  const testHooks = process.env[TEST_HOOKS_ENV] === '1';
  const control = ControlBlock.create(owners);
  // Before any gateway starts: one may serve while the next is still starting (gateways.start).
  config.signal?.addEventListener('abort', () => (control.draining = true), { once: true });
  if (config.signal?.aborted) control.draining = true;
  const cache = resultCache(config, plans, owners);
  // Metrics: this thread's share, computed from shared memory at scrape time.
  const registry = new Registry();
  // The event-loop delay of the main thread once a second (prom-client's default is every 10 ms: 100 wake-ups a second at rest).
  collectDefaultMetrics({ register: registry, eventLoopMonitoringPrecision: 1000 });
  const supervision = supervisionMetrics(registry, { abandonedInferenceThreads: () => inference.abandoned });
  log(`slabserve: opening ${plans.map((p) => p.spec.name).join(', ')} on device ${config.device}; warm-up follows`);
  const inference = new InferenceSupervisor(models, control, {
    ...inferenceOptionsOf(config, config.log, testHooks),
    tracing: tracing ?? undefined,
    onRestart: (e) => {
      supervision.inferenceRestarts.inc({ reason: e.reason });
      supervision.restartFailedInputs.inc(e.answered);
    },
  });
  let device: DeviceInfo | null = null;
  registerMainThreadMetrics(registry, { models, control, cache, threads: () => namedThreads(inference, gateways), device: () => device });

  const localParts = async (): Promise<MetricsJson[]> => {
    const [gatewayParts, inferencePart] = await Promise.all([gateways.metrics(), inference.metrics().catch(() => null)]);
    return [await registry.getMetricsAsJSON(), ...gatewayParts, ...(inferencePart ? [inferencePart] : [])];
  };
  const metricsJson = async (): Promise<MetricsJson> => AggregatorRegistry.aggregate(await localParts()).getMetricsAsJSON();
  const scrape = config.scrape ?? (async (): Promise<string> => AggregatorRegistry.aggregate(await localParts()).metrics());

  const info = () => (device ? serverInfo(config, models.serving(), device, cache, repository, uws) : undefined);
  const repository = modelRepository(config, { planning, models, inference, registry, log }, {
    callEvery: <T>(method: string, arg: unknown, timeoutMs: number): Promise<T[]> => gateways.callEvery<T>(method, arg, timeoutMs),
    setInfo: async () => {
      const doc = info();
      if (doc !== undefined) await gateways.callAll('setInfo', doc);
    },
  });
  const idleTimer = config.modelIdleUnloadS !== undefined ? setInterval(() => void repository.unloadIdle().catch((err: Error) => log(`slabserve: idle unload: ${err.message}`)), IDLE_CHECK_MS) : undefined;
  idleTimer?.unref();
  const gateways: GatewaySupervisor = new GatewaySupervisor({
    data: { ...gatewayWorkerData(config, control, owners, cache), uws, ...(tracing ? { tracing } : {}) },
    // With --grpc-threads, the gateways serve HTTP and the threads after them gRPC; else each serves both.
    roles: { http: config.gatewayThreads, grpc: grpc ? { listen: grpc, threads: grpcThreads } : null },
    models,
    cache,
    log,
    scrape,
    repository: config.repository ?? ((op) => repository.handle(op as RepositoryOp)),
    info,
    testHooks,
    ...(testHooks && process.env[TEST_HOLD_GATEWAY_ENV] ? { holdStart: { gatewayId: Number(process.env[TEST_HOLD_GATEWAY_ENV]), until: aborted(config.signal) } } : {}),
    onRestart: (reason) => supervision.gatewayRestarts.inc({ reason }),
  });
  let closing: Promise<void> | null = null;
  let port: number;
  try {
    port = await gateways.start(config.gatewayThreads + (grpc ? grpcThreads : 0), await firstBindPort(config));
  } catch (err) {
    // Stop cleanly: terminating the inference thread while onnxruntime opens its
    // sessions aborts the process, so ask it to stop and wait for it to exit.
    closing = Promise.resolve();
    await inference.stop();
    throw err;
  }
  const shownHost = config.host === '0.0.0.0' ? '127.0.0.1' : config.host;
  const url = `http://${shownHost}:${port}`;
  const grpcPort = gateways.grpcPort;
  log(listeningLine(config, port, grpc ? grpcPort : null, grpcThreads));

  const ready = inference.ready.then(async (d) => {
    device = d;
    await gateways.callAll('setInfo', info());
    log(`slabserve: ready at ${url}`);
    return d;
  });
  ready.catch(() => {}); // start-up failures surface through `ready`; close() still works

  const close = () => {
    clearInterval(idleTimer);
    return (closing ??= drain(config, grpcPort !== null ? [port, grpcPort] : [port], control, gateways, inference).then(() => log('slabserve: stopped')));
  };
  // Aborted (now or later): the drain already began (the draining flag, above); the rest runs now.
  if (config.signal?.aborted) void close();
  else config.signal?.addEventListener('abort', () => void close(), { once: true });
  return { port, grpcPort, url, ready, close, metricsJson, repository: (op) => repository.handle(op), ...(testHooks ? { testHooks: serverTestHooks(inference, gateways, models) } : {}) };
}


/**
 * The model repository's routes over `models` (src/main/repository/repository.ts). `gateways` is how it
 * reaches the gateway threads, which start after it: every one of them, and the /info document
 * sent again once the set of models changed.
 */
function modelRepository(
  config: ResolvedServerConfig,
  parts: { planning: Planning; models: ModelSet; inference: InferenceSupervisor; registry: Registry; log: (line: string) => void },
  gateways: { callEvery<T>(method: string, arg: unknown, timeoutMs: number): Promise<T[]>; setInfo(): Promise<void> },
): ModelRepository {
  const { planning, models, inference, registry, log } = parts;
  const repository: ModelRepository = new ModelRepository({
    mode: config.modelControlMode,
    modelsDir: modelsDirOf(config.modelsDir),
    models,
    inference,
    gateways: { callEvery: (method, arg, timeoutMs) => gateways.callEvery(method, arg, timeoutMs) },
    plan: planWhileServing(planning, models),
    fetchHub: (id) => locateHubModel(id, { overrides: planning.overrides, log }),
    onChange: () => gateways.setInfo(),
    log,
    drainTimeoutMs: config.requestTimeoutMs + 1000,
    metrics: repositoryMetrics(registry, { loaded: () => repository.loaded(), known: () => repository.known() }),
    budget: new ModelBudget({
      ...(config.maxLoadedModels !== undefined ? { maxLoadedModels: config.maxLoadedModels } : {}),
      ...(config.modelMemoryMb !== undefined ? { modelMemoryMb: config.modelMemoryMb } : {}),
      ...(config.modelIdleUnloadS !== undefined ? { idleUnloadS: config.modelIdleUnloadS } : {}),
      pinned: config.pinModels ?? [],
    }),
  });
  return repository;
}

/** The line that says where the server listens (gRPC's port: null where it serves none). */
function listeningLine(config: ResolvedServerConfig, port: number, grpcPort: number | null, grpcThreads: number): string {
  const plural = (n: number, what: string) => `${n} ${what}${n > 1 ? 's' : ''}`;
  const grpcShown = grpcPort !== null ? `, grpc on ${config.host}:${grpcPort}${grpcThreads > 0 ? ` (${plural(grpcThreads, 'thread')} of its own)` : ''}` : '';
  return `slabserve: listening on http://${config.host}:${port}${grpcShown} (${plural(config.gatewayThreads, 'gateway thread')}); ready after warm-up`;
}

/**
 * The result cache of every gateway thread (src/shared/result-cache.ts), made here so one that
 * dies leaves it behind for its replacement; null with --cache-mb 0. Owner 0 (this thread) only
 * reclaims a dead gateway's locks.
 */
function resultCache(config: ResolvedServerConfig, plans: ModelPlan[], owners: number): ResultCache | null {
  if (!(config.cacheMb > 0)) return null;
  let layout;
  try {
    layout = cacheLayoutOf(config.cacheMb, plans, owners);
  } catch (err) {
    throw new ValidationError(`--cache-mb ${config.cacheMb}: ${(err as Error).message}; give more, or 0 to turn the cache off`);
  }
  const cache = ResultCache.create(layout);
  config.log(`slabserve: result cache ${config.cacheMb} MiB, ${layout.sets * WAYS} rows per model of at most ${KEY_TOKENS} tokens`);
  return cache;
}

/** Tracing as the flags and OpenTelemetry's variables say (docs/tracing.md), or null; a value it cannot use stops the start. */
function tracingOf(config: ResolvedServerConfig): TracingConfig | null {
  try {
    return resolveTracing({ otlpEndpoint: config.otlpEndpoint, otlpServiceName: config.otlpServiceName }, process.env);
  } catch (err) {
    throw new ValidationError((err as Error).message);
  }
}

/** What the main thread itself reports: each model's slab tallies and cache counts, readiness, thread CPU, device memory (read at scrape time). */
function registerMainThreadMetrics(
  registry: Registry,
  s: { models: ModelSet; control: ControlBlock; cache: ResultCache | null; threads: () => Map<number, string>; device: () => DeviceInfo | null },
): void {
  const { models, control, cache } = s;
  if (cache) cacheMetrics(registry, () => models.serving().filter((p) => cache.covers(p.index)).map((p) => ({ name: p.spec.name, ...cache.statsOf(p.index) })));
  processMetrics(registry, {
    models: () =>
      models.serving().map((p) => {
        const slab = models.slab(p.index)!;
        const st = slabStats(slab);
        return {
          name: p.spec.name,
          queued: st.queued,
          slotsInUse: st.slotsInUse,
          slots: p.layout.slotCount,
          tokenPagesInUse: st.tokenPagesInUse,
          tokenPages: p.layout.tokenPages ?? 0,
          realTokens: st.realTokens,
          paddedTokens: st.paddedTokens,
          expired: st.droppedExpired,
          expiredTokens: slab.counters[Counter.EXPIRED_TOKENS]!,
          cancelled: st.cancelledSkipped,
          splitRuns: slab.counters[Counter.SPLIT_RUNS]!,
          failedAlone: slab.counters[Counter.ISOLATED_INPUTS]!,
          costs: p.batching.buckets.map((bucket, b) => ({ bucket, ...slab.cost(b) })),
        };
      }),
    ready: () => control.workerState === WorkerState.READY && !control.draining,
    heartbeatAgeSeconds: () => (control.heartbeat ? (nowMs() - control.heartbeat) / 1000 : 0),
    threadCpuSeconds: () => threadCpuSeconds(s.threads()),
    deviceMemory: () => {
      const device = s.device();
      if (!device || device.kind !== 'cuda') return null;
      const d = describeCuda(device.id);
      return { device: d.label, totalBytes: d.memoryTotalBytes, usedBytes: d.memoryUsedBytes };
    },
  });
}

/** Kernel thread id -> name, for slabserve_thread_cpu_seconds_total. */
function namedThreads(inference: InferenceSupervisor, gateways: GatewaySupervisor): Map<number, string> {
  const named = new Map<number, string>([[process.pid, 'main']]);
  const { inference: tid, pool } = inference.threads;
  for (const t of pool) named.set(t, 'onnxruntime');
  if (tid !== null) named.set(tid, 'inference');
  gateways.nameThreads(named); // after the pool: a gateway started while the sessions opened is still a gateway
  // Session threads (models loaded while serving) and their pools name themselves (session-thread.ts).
  for (const t of processThreadIds()) {
    if (named.has(t)) continue;
    const name = threadName(t);
    if (name === 'session' || name === 'onnxruntime') named.set(t, name);
  }
  return named;
}

/** GET /info's body (gateways add each model's live cost model). */
function serverInfo(config: ResolvedServerConfig, plans: ModelPlan[], d: DeviceInfo, cache: ResultCache | null, repository: ModelRepository, uws: UwsChoice) {
  return {
    version: VERSION,
    /** What runs it: Node.js, and the uWebSockets.js build the start-up check chose (src/gateway/uws.ts). */
    runtime: { node: process.version, uws: { package: uws.package, version: uws.version } },
    device: { label: d.label, name: d.name, provider: d.provider },
    models: plans.map(describeModel),
    scheduling: {
      priorities: config.priorities,
      priorityAgeingMs: config.priorityAgeingMs,
      sloP99Ms: config.sloP99Ms ?? null,
    },
    limits: {
      maxClientBatchSize: config.maxClientBatchSize,
      maxBodyBytes: config.maxBodyBytes,
      truncate: config.truncate,
      requestTimeoutMs: config.requestTimeoutMs,
      slotsPerModel: config.slotsPerModel,
      tokenOutputMb: config.tokenOutputMb,
    },
    gatewayThreads: config.gatewayThreads,
    /** The model repository (docs/model-repository.md): whether models load at runtime, and the folders not loaded. */
    repository: { modelControlMode: repository.mode, notLoaded: repository.index().flatMap((e) => (e.state === 'READY' ? [] : [e.name])) },
    /** The result cache (docs/cache.md), null with --cache-mb 0. */
    cache: cache ? { megabytes: config.cacheMb, rowsPerModel: cache.layout.sets * WAYS, maxKeyTokens: KEY_TOKENS } : null,
  };
}

function serverTestHooks(inference: InferenceSupervisor, gateways: GatewaySupervisor, models: ModelSet): ServerTestHooks {
  return {
    ...inference.holdHooks(),
    inferenceFault: (kind, minRows) => inference.testFault(kind, minRows),
    poisonToken: (id) => inference.testPoison(id),
    gatewayFault: (gatewayId) => gateways.fault(gatewayId),
    setCost: (name, cost) => {
      const plan = models.byName(name);
      const slab = plan && models.slab(plan.index);
      if (!plan || !slab) throw new Error(`no model "${name}"`);
      const before = plan.batching.buckets.map((_, b) => slab.cost(b));
      before.forEach((c, b) => slab.setCost(b, cost.fixedMs, cost.perRowMs, Math.max(1, c.samples)));
      return () => before.forEach((c, b) => slab.setCost(b, c.fixedMs, c.perRowMs, c.samples));
    },
  };
}

/** What every gateway thread starts with (GatewaySupervisor adds its id, owner index and port). */
function gatewayWorkerData(config: ResolvedServerConfig, control: ControlBlock, owners: number, cache: ResultCache | null): Omit<GatewayWorkerData, 'gatewayId' | 'owner' | 'port' | 'models' | 'http' | 'grpc' | 'uws'> {
  return {
    control: control.buffer,
    ...(cache ? { cache: { buffer: cache.buffer, layout: cache.layout } } : {}),
    owners,
    options: pickOptions(config, GATEWAY_OPTIONS) as GatewayWorkerData['options'],
    version: VERSION,
    ...(config.accessLogFd !== undefined ? { accessFd: config.accessLogFd } : {}),
  };
}

/** How often models idle past --model-idle-unload-s are looked for. */
const IDLE_CHECK_MS = 1000;

/** Resolves once `signal` aborts (never without one). */
function aborted(signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) resolve();
    else signal?.addEventListener('abort', () => resolve(), { once: true });
  });
}

/** The repository's flags that need --model-control-mode explicit (they change the model set), checked before any thread starts. */
function checkRepositoryFlags(config: ResolvedServerConfig): void {
  if (config.modelControlMode === 'explicit') return;
  const given = (
    [
      ['--lazy-load', config.lazyLoad === true],
      ['--max-loaded-models', config.maxLoadedModels !== undefined],
      ['--model-memory-mb', config.modelMemoryMb !== undefined],
      ['--model-idle-unload-s', config.modelIdleUnloadS !== undefined],
      ['--pin-model', (config.pinModels?.length ?? 0) > 0],
    ] as const
  ).filter(([, on]) => on);
  if (given.length > 0) throw new ValidationError(`${given.map(([f]) => f).join(', ')} need${given.length === 1 ? 's' : ''} --model-control-mode explicit (they change the model set)`);
}

/** The longest the drain waits for the kernel's accept queues to empty before closing the listen sockets (src/main/drain/accept-queue.ts). */
const ACCEPT_QUEUE_WAIT_MS = 1000;

/**
 * The drain (docs/architecture.md, Draining): readiness off and every answer
 * closing its connection (the control block's draining flag), new connections
 * refused, requests in flight finished (up to drainTimeoutMs), idle keep-alive
 * connections given drainGraceMs, then every socket closed and the threads stopped.
 */
async function drain(config: ResolvedServerConfig, ports: number[], control: ControlBlock, gateways: GatewaySupervisor, inference: InferenceSupervisor): Promise<void> {
  control.draining = true; // /readyz 503, new requests 503, every answer Connection: close
  gateways.beginClose(); // a gateway that ends now is not replaced
  const deadline = Date.now() + config.drainTimeoutMs;
  // New connections are refused from now on; the open ones are served until they close. The kernel
  // first stops taking new ones and the gateways accept those it has queued: closing then resets none.
  const timeoutMs = Math.min(ACCEPT_QUEUE_WAIT_MS, deadline - Date.now());
  for (const queued of await Promise.all(ports.map((p) => quietListenSockets(p, { timeoutMs })))) {
    if (queued.why) config.log(`slabserve: closing the listen sockets may reset queued connections: ${queued.why}`);
  }
  await gateways.callAll('stopListening', undefined, 2000);
  // Twice idle in a row: a request that passed the readiness check just before draining began
  // may still be reading its body or tokenizing, not yet submitted, at the first look.
  for (let idle = 0; idle < 2 && Date.now() < deadline; ) {
    const pending = await gateways.callAll<number>('pending', undefined, 2000, 0);
    idle = pending.every((n) => n === 0) ? idle + 1 : 0;
    await new Promise((r) => setTimeout(r, 20));
  }
  // Connections that were answered while draining closed with their answer. An idle one that was
  // not may carry a request its client is sending right now: give it the grace to be answered.
  await new Promise((r) => setTimeout(r, Math.max(0, Math.min(config.drainGraceMs, deadline - Date.now()))));
  // Sockets must be closed before the threads go: uWS aborts the process otherwise.
  await gateways.closeSockets();
  await inference.stop();
  await gateways.awaitEnd();
}

export type { ModelPlan };
