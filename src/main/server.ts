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
 * starts, `server.testHooks` can make the threads fail, and hold the inference
 * loop while a test queues its requests (tests only; absent otherwise, and the
 * threads carry no hook).
 */
import { resolveTracing, type TracingConfig } from '../shared/telemetry/tracing.js';
import { lookup } from 'node:dns/promises';
import { createServer as createNetServer, type AddressInfo } from 'node:net';
import { join, resolve } from 'node:path';
import { cpus } from 'node:os';
import { AggregatorRegistry, collectDefaultMetrics, Registry } from 'prom-client';
import { DEFAULT_PRIORITIES, describeModel, modelOverrides, slabStats, ENGINE_DEFAULTS, type ModelOptions } from './engine.js';
import { DEFAULT_SCHEDULING } from '../gpu-worker/inference-loop.js';
import type { GatewayWorkerData } from '../gateway/thread.js';
import type { GrpcListen } from '../gateway/grpc/server.js';
import { GATE_DEFAULTS } from '../gateway/gate.js';
import { WS_DEFAULTS } from '../gateway/ws/options.js';
import { INLINE_TOKENIZE_CHARS } from '../core/infer.js';
import type { LogFormat, LogLevel } from '../gateway/log.js';
import { quietListenSockets } from './drain/accept-queue.js';
import { checkDevice, describeCuda, type DeviceInfo } from '../gpu-worker/device.js';
import type { UwsChoice } from '../gateway/uws.js';
import { checkNativeBinaries } from './native-binaries.js';
import type { BatchingOptions } from '../gpu-worker/scheduler.js';
import type { InferenceFault } from '../gpu-worker/thread.js';
import { GatewaySupervisor } from './threads/gateway-supervisor.js';
import { InferenceSupervisor, TEST_HOLD_GATEWAY_ENV, TEST_HOLD_START_ENV, TEST_HOOKS_ENV, type InferenceHoldHooks } from './threads/inference-supervisor.js';
import { ModelRepository, type ModelControlMode } from './repository/repository.js';
import type { RepositoryAnswer, RepositoryOp } from '../shared/repository-protocol.js';
import { ModelSet } from './repository/model-set.js';
import { ModelBudget } from './repository/model-budget.js';
import { loadModels, packageRoot, planModel } from './plan-models.js';
import type { ModelPlan } from '../shared/model-plan.js';
import { nowMs } from '../shared/clock.js';
import { ControlBlock, WorkerState } from '../shared/control.js';
import { checkIntegerIn, SlabserveError, ValidationError } from '../shared/errors.js';
import { cacheMetrics, processMetrics, repositoryMetrics, supervisionMetrics } from '../shared/telemetry/metrics.js';
import { cacheLayoutOf, KEY_TOKENS, ResultCache, WAYS } from '../shared/result-cache.js';
import { Counter, Slab } from '../shared/slab.js';
import { DEFAULT_LONE_WAIT_US, MAX_LONE_WAIT_US } from '../core/lone-wait.js';
import { processThreadIds, threadCpuSeconds, threadName } from '../shared/threads.js';
import { VERSION } from '../version.js';

export interface ServerConfig extends ModelOptions {
  host: string;
  /** 0 picks a free port. */
  port: number;
  /** The port is shared on purpose (a cluster's process): no check that nothing else listens on it (nor on grpcPort). */
  sharedPort?: boolean;
  /** gRPC's port (--grpc-port); 0: no gRPC. Absent: DEFAULT_GRPC_PORT, or a free port when `port` is 0. */
  grpcPort?: number;
  /** Most messages of one gRPC stream answered at once (--grpc-stream-max-inflight). */
  grpcStreamMaxInflight?: number;
  /** Threads that serve gRPC only (--grpc-threads); 0 (default): the gateway threads serve it beside HTTP. */
  grpcThreads?: number;
  device: string;
  gatewayThreads: number;
  /**
   * Aborting it begins the drain at once, even while the server is still starting: from that
   * moment every gateway already serving refuses new requests (503, closing its connection), and
   * the rest of the drain (close()) runs as soon as the start is done (SIGTERM in the CLI).
   */
  signal?: AbortSignal;
  batching: Partial<BatchingOptions>;
  maxInflightBatches: number;
  slotsPerModel: number;
  /** MiB of token vectors per model that has them (/embed_all). */
  tokenOutputMb: number;
  requestTimeoutMs: number;
  intraOpThreads: number;
  /** Sessions of each model running batches side by side (--model-instances); 0: auto. */
  modelInstances: number;
  /** Microseconds the inference loop spins for the next request before it sleeps (--idle-spin-us). */
  idleSpinUs: number;
  /** Microseconds a gateway holds its thread for the answer to a request alone in the server (--lone-wait-us; src/core/lone-wait.ts); 0: never. */
  loneWaitUs: number;
  intraOpNice: number;
  maxClientBatchSize: number;
  maxBodyBytes: number;
  /** Cut an input past the model's max length when its request does not say (--truncate, TEI's --auto-truncate); default false: 413. */
  truncate?: boolean;
  heartbeatTimeoutMs: number;
  /** A batch run longer than this: the inference thread is replaced and its requests answered 503 (--inference-timeout-ms). */
  inferenceTimeoutMs: number;
  drainTimeoutMs: number;
  /**
   * After the drain's last request, how long idle keep-alive connections stay open before they are
   * closed (--drain-grace-ms): a request a client sends on one meanwhile is answered (503, Connection:
   * close) rather than lost to the close.
   */
  drainGraceMs: number;
  tokenizerThreads: number;
  /** Requests waiting for the tokenizer pool, per gateway, past which 429 at once (--tokenizer-queue; default 256 per pool thread). */
  tokenizerQueue?: number;
  inlineTokenizeChars: number;
  /** --ws-max-inflight, --ws-max-buffered-bytes, --ws-max-frame-bytes, --ws-idle-timeout-s: WsOptions (gateway/ws/options.ts says what each means). */
  wsMaxInflight: number;
  wsMaxBufferedBytes: number;
  wsMaxFrameBytes: number;
  wsIdleTimeoutSeconds: number;
  /** Priority classes in order (the first is the default) and their weights (--priority-weights). */
  priorities: { name: string; weight: number }[];
  /** A class whose oldest request has waited this long goes first (--priority-ageing-ms). */
  priorityAgeingMs: number;
  /** Latency target: adaptive batch window and admission against it (--slo-p99-ms). */
  sloP99Ms?: number;
  /**
   * MiB of finished rows kept in shared memory for every gateway thread (--cache-mb; 0: off): an
   * input run before is answered by the gateway itself, without a slot or the inference thread,
   * with the row the model computed then. Per process (docs/cache.md).
   */
  cacheMb: number;
  /** Replaces what /metrics answers (a cluster worker asks its primary for the whole cluster's: src/main/cluster/cluster.ts). */
  scrape?: () => Promise<string>;
  /**
   * Whether the model set can change while serving (--model-control-mode, Triton's names): `none`
   * (default), fixed at start; `explicit`, the repository routes load, reload and unload
   * (src/main/repository/repository.ts, docs/model-repository.md).
   */
  modelControlMode?: ModelControlMode;
  /** A request naming a model of the repository that is not loaded loads it, within its deadline (--lazy-load; explicit mode only). */
  lazyLoad?: boolean;
  /** The model budget (explicit mode only; src/main/repository/model-budget.ts): --max-loaded-models, --model-memory-mb, --model-idle-unload-s, --pin-model. */
  maxLoadedModels?: number;
  modelMemoryMb?: number;
  modelIdleUnloadS?: number;
  pinModels?: string[];
  /** Replaces this process's repository operations (a cluster worker asks its primary, which applies them to every process). */
  repository?: (op: unknown) => Promise<unknown>;
  /** API keys: every route but health (and /metrics, unless metricsAuth) needs `Authorization: Bearer <key>` (--api-key, --api-key-file); none: open. */
  apiKeys?: string[];
  /** Keys the model repository's routes need instead of the API keys (--admin-api-key); none: the API keys. */
  adminApiKeys?: string[];
  /** /metrics needs a key too (--metrics-auth). */
  metricsAuth?: boolean;
  /** Most connections per gateway thread: open WebSockets plus HTTP connections with a request in progress; past it 503 (--max-connections). */
  maxConnections?: number;
  /** Longest URL (path and query) in bytes; past it 414 (--max-url-bytes). */
  maxUrlBytes?: number;
  /** Largest request head (request line and headers) in bytes; past it 431 (--max-header-bytes). */
  maxHeaderBytes?: number;
  /** A refusal answered before the body arrived waits for it, reading and dropping at most this many bytes in all, for at most discardTimeoutMs (--max-discard-bytes, --discard-timeout-ms). */
  maxDiscardBytes?: number;
  discardTimeoutMs?: number;

  /** Least level of the JSON log lines: fatal, error, warn, info (an access line per request), debug, trace, silent (--log-level). */
  logLevel?: LogLevel;
  /** Access lines for health probes and metrics scrapes too (--log-probes); default false: they would drown the requests. */
  logProbes?: boolean;
  /** Gateway threads write access lines (one per request) straight to this file descriptor (the CLI: 1, stdout); absent, they reach `log`. */
  accessLogFd?: number;
  /** How lines to a file descriptor are written (--log-format): JSON, readable (pretty), or readable where it is a terminal (auto). */
  logFormat?: LogFormat;
  /** Traces to this OTLP/HTTP endpoint (its base: /v1/traces appended; --otlp-endpoint); absent: OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, or off (docs/tracing.md). */
  otlpEndpoint?: string;
  /** The traces' service.name (--otlp-service-name); default OTEL_SERVICE_NAME, else slabserve. */
  otlpServiceName?: string;
  log: (line: string) => void;
}


/** One gateway thread on 2 cores or fewer, else half the cores. */
export function defaultGatewayThreads(): number {
  const n = cpus().length;
  return n <= 2 ? 1 : Math.floor(n / 2);
}

export const SERVER_DEFAULTS = {
  host: '0.0.0.0',
  port: 8080,
  device: ENGINE_DEFAULTS.device,
  maxInflightBatches: ENGINE_DEFAULTS.maxInflightBatches,
  slotsPerModel: ENGINE_DEFAULTS.slotsPerModel,
  tokenOutputMb: ENGINE_DEFAULTS.tokenOutputMb,
  requestTimeoutMs: ENGINE_DEFAULTS.requestTimeoutMs,
  intraOpThreads: ENGINE_DEFAULTS.intraOpThreads,
  modelInstances: ENGINE_DEFAULTS.modelInstances,
  idleSpinUs: ENGINE_DEFAULTS.idleSpinUs,
  loneWaitUs: DEFAULT_LONE_WAIT_US,
  intraOpNice: ENGINE_DEFAULTS.intraOpNice,
  /** A bound on one request's memory, not on the batcher: a larger client batch runs part by part (core/client-batches.ts). */
  maxClientBatchSize: 1024,
  maxBodyBytes: 2 * 1024 * 1024,
  heartbeatTimeoutMs: ENGINE_DEFAULTS.heartbeatTimeoutMs,
  inferenceTimeoutMs: ENGINE_DEFAULTS.inferenceTimeoutMs,
  drainTimeoutMs: 30_000,
  modelControlMode: 'none' as ModelControlMode,
  drainGraceMs: 500,
  tokenizerThreads: 1,
  inlineTokenizeChars: INLINE_TOKENIZE_CHARS,
  wsMaxInflight: WS_DEFAULTS.maxInflight,
  wsMaxBufferedBytes: WS_DEFAULTS.maxBufferedBytes,
  wsMaxFrameBytes: WS_DEFAULTS.maxFrameBytes,
  wsIdleTimeoutSeconds: WS_DEFAULTS.idleTimeoutSeconds,
  grpcStreamMaxInflight: 256,
  grpcThreads: 0,
  priorities: DEFAULT_PRIORITIES,
  priorityAgeingMs: DEFAULT_SCHEDULING.priorityAgeingMs,
  cacheMb: 64,
  ...GATE_DEFAULTS,
  logLevel: 'info' as LogLevel,
  logFormat: 'auto' as LogFormat,
} as const;

/** gRPC's port when --grpc-port is not given (HTTP's is 8080). */
export const DEFAULT_GRPC_PORT = 8081;

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
async function grpcListen(config: ServerConfig): Promise<GrpcListen | null> {
  if (config.grpcPort === 0) return null;
  const port = config.grpcPort ?? (config.port === 0 ? 0 : DEFAULT_GRPC_PORT); // 0: the first gateway binds a port the kernel picks
  if (!config.sharedPort && (config.grpcPort !== undefined || config.port !== 0)) await ensurePortFree(config.host, port, '--grpc-port');
  const { address } = await lookup(config.host);
  const threads = (config.grpcThreads ?? 0) || config.gatewayThreads;
  // Shared by several threads, or by a cluster's processes.
  return { address, port, streamMaxInflight: config.grpcStreamMaxInflight ?? SERVER_DEFAULTS.grpcStreamMaxInflight, shared: threads > 1 || config.sharedPort === true };
}

/**
 * The port the first gateway binds. A fixed --port is itself. With --port 0 and one gateway, 0: uWS
 * binds a port the kernel picks, free at that moment (exclusively: uSockets sets SO_REUSEPORT only
 * on a fixed port; a gateway restarted after a crash binds the number again once the dead one's
 * socket is gone). Several gateways must share the port, so they get a port picked first and bound
 * with SO_REUSEPORT; another process of the same user picking the same free port meanwhile would
 * share it, so one gateway (what the tests start) takes the atomic way.
 */
async function firstBindPort(config: ServerConfig): Promise<number> {
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

export async function startServer(config: ServerConfig): Promise<Server> {
  const log = config.log;
  // An operator's mistakes, before any thread starts: a taken port, a device this machine lacks.
  if (config.port !== 0 && !config.sharedPort) await ensurePortFree(config.host, config.port);
  const grpc = await grpcListen(config);
  checkDevice(config.device);
  checkRepositoryFlags(config);
  checkIntegerIn('loneWaitUs', config.loneWaitUs, '0', MAX_LONE_WAIT_US);
  const uws = await checkNativeBinaries({ gateways: true });
  log(`slabserve: Node.js ${process.version}, uWebSockets.js ${uws.version} (${uws.package})`);
  const tracing = tracingOf(config);
  const grpcThreads = config.grpcThreads ?? 0;
  const owners = 1 + config.gatewayThreads + grpcThreads; // owner 0 is this thread; gRPC's own threads are gateways too
  const planning = { batching: config.batching, overrides: modelOverrides(config), warn: log, slotsPerModel: config.slotsPerModel, tokenOutputMb: config.tokenOutputMb, owners };
  const plans = loadModels({
    ...(config.modelsDir ? { modelsDir: config.modelsDir } : {}),
    ...(config.models && config.models.length ? { models: config.models } : {}),
    ...planning,
  });
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
    ...inferenceOptions(config, testHooks),
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
  return { port, grpcPort, url, ready, close, metricsJson, repository: (op) => repository.handle(op), ...(testHooks ? { testHooks: serverTestHooks(inference, gateways) } : {}) };
}

type Planning = Parameters<typeof planModel>[2];

/**
 * The model repository's routes over `models` (src/main/repository/repository.ts). `gateways` is how it
 * reaches the gateway threads, which start after it: every one of them, and the /info document
 * sent again once the set of models changed.
 */
function modelRepository(
  config: ServerConfig,
  parts: { planning: Planning; models: ModelSet; inference: InferenceSupervisor; registry: Registry; log: (line: string) => void },
  gateways: { callEvery<T>(method: string, arg: unknown, timeoutMs: number): Promise<T[]>; setInfo(): Promise<void> },
): ModelRepository {
  const { planning, models, inference, registry, log } = parts;
  const repository: ModelRepository = new ModelRepository({
    mode: config.modelControlMode ?? 'none',
    modelsDir: resolve(config.modelsDir ?? join(packageRoot, 'models')),
    models,
    inference,
    gateways: { callEvery: (method, arg, timeoutMs) => gateways.callEvery(method, arg, timeoutMs) },
    plan: (folder, id, serve) => planModel(folder, id, { ...planning, ...(serve ? { serve } : {}), reuse: (bytes) => models.reusable(bytes) }),
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
function listeningLine(config: ServerConfig, port: number, grpcPort: number | null, grpcThreads: number): string {
  const plural = (n: number, what: string) => `${n} ${what}${n > 1 ? 's' : ''}`;
  const grpcShown = grpcPort !== null ? `, grpc on ${config.host}:${grpcPort}${grpcThreads > 0 ? ` (${plural(grpcThreads, 'thread')} of its own)` : ''}` : '';
  return `slabserve: listening on http://${config.host}:${port}${grpcShown} (${plural(config.gatewayThreads, 'gateway thread')}); ready after warm-up`;
}

/**
 * The result cache of every gateway thread (src/shared/result-cache.ts), made here so one that
 * dies leaves it behind for its replacement; null with --cache-mb 0. Owner 0 (this thread) only
 * reclaims a dead gateway's locks.
 */
function resultCache(config: ServerConfig, plans: ModelPlan[], owners: number): ResultCache | null {
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
function tracingOf(config: ServerConfig): TracingConfig | null {
  try {
    return resolveTracing({ otlpEndpoint: config.otlpEndpoint, otlpServiceName: config.otlpServiceName }, process.env);
  } catch (err) {
    throw new ValidationError((err as Error).message);
  }
}

/** The inference thread's settings, from the server's. */
function inferenceOptions(config: ServerConfig, enableTestHooks: boolean): Omit<ConstructorParameters<typeof InferenceSupervisor>[2], 'onRestart'> {
  return {
    device: config.device,
    intraOpThreads: config.intraOpThreads,
    intraOpNice: config.intraOpNice,
    modelInstances: config.modelInstances,
    idleSpinUs: config.idleSpinUs,
    maxInflightBatches: config.maxInflightBatches,
    scheduling: {
      priorityWeights: config.priorities.map((p) => p.weight),
      priorityAgeingMs: config.priorityAgeingMs,
      ...(config.sloP99Ms !== undefined ? { sloP99Ms: config.sloP99Ms } : {}),
    },
    log: config.log,
    inferenceTimeoutMs: config.inferenceTimeoutMs,
    heartbeatTimeoutMs: config.heartbeatTimeoutMs,
    enableTestHooks,
  };
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
function serverInfo(config: ServerConfig, plans: ModelPlan[], d: DeviceInfo, cache: ResultCache | null, repository: ModelRepository, uws: UwsChoice) {
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
      truncate: config.truncate ?? false,
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

function serverTestHooks(inference: InferenceSupervisor, gateways: GatewaySupervisor): ServerTestHooks {
  return {
    ...inference.holdHooks(),
    inferenceFault: (kind, minRows) => inference.testFault(kind, minRows),
    poisonToken: (id) => inference.testPoison(id),
    gatewayFault: (gatewayId) => gateways.fault(gatewayId),
  };
}

/** What every gateway thread starts with (GatewaySupervisor adds its id, owner index and port). */
function gatewayWorkerData(config: ServerConfig, control: ControlBlock, owners: number, cache: ResultCache | null): Omit<GatewayWorkerData, 'gatewayId' | 'owner' | 'port' | 'models' | 'http' | 'grpc' | 'uws'> {
  return {
    control: control.buffer,
    ...(cache ? { cache: { buffer: cache.buffer, layout: cache.layout } } : {}),
    owners,
    host: config.host,
    limits: { maxBodyBytes: config.maxBodyBytes, maxClientBatchSize: config.maxClientBatchSize, truncate: config.truncate ?? false },
    requestTimeoutMs: config.requestTimeoutMs,
    loneWaitUs: config.loneWaitUs,
    heartbeatTimeoutMs: config.heartbeatTimeoutMs,
    tokenizerThreads: config.tokenizerThreads,
    ...(config.tokenizerQueue !== undefined ? { tokenizerQueue: config.tokenizerQueue } : {}),
    inlineTokenizeChars: config.inlineTokenizeChars,
    ws: {
      maxInflight: config.wsMaxInflight,
      maxBufferedBytes: config.wsMaxBufferedBytes,
      maxFrameBytes: config.wsMaxFrameBytes,
      idleTimeoutSeconds: config.wsIdleTimeoutSeconds,
    },
    version: VERSION,
    priorityNames: config.priorities.map((p) => p.name),
    ...(config.sloP99Ms !== undefined ? { sloP99Ms: config.sloP99Ms } : {}),
    security: {
      apiKeys: config.apiKeys ?? [],
      adminApiKeys: config.adminApiKeys ?? [],
      metricsAuth: config.metricsAuth ?? GATE_DEFAULTS.metricsAuth,
      maxConnections: config.maxConnections ?? GATE_DEFAULTS.maxConnections,
      maxUrlBytes: config.maxUrlBytes ?? GATE_DEFAULTS.maxUrlBytes,
      maxHeaderBytes: config.maxHeaderBytes ?? GATE_DEFAULTS.maxHeaderBytes,
      maxDiscardBytes: config.maxDiscardBytes ?? GATE_DEFAULTS.maxDiscardBytes,
      discardTimeoutMs: config.discardTimeoutMs ?? GATE_DEFAULTS.discardTimeoutMs,
    },
    ...(config.lazyLoad ? { lazyLoad: true } : {}),
    log: { level: config.logLevel ?? 'info', probes: config.logProbes ?? false, ...(config.accessLogFd !== undefined ? { accessFd: config.accessLogFd, format: config.logFormat ?? SERVER_DEFAULTS.logFormat } : {}) },
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
function checkRepositoryFlags(config: ServerConfig): void {
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
async function drain(config: ServerConfig, ports: number[], control: ControlBlock, gateways: GatewaySupervisor, inference: InferenceSupervisor): Promise<void> {
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
