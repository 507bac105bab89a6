/**
 * Entry point of a gateway thread: one uWebSockets.js app listening on the
 * shared port (the kernel spreads connections across gateway threads with
 * SO_REUSEPORT), tokenizing requests and submitting them through the slabs
 * as owner `owner`.
 *
 * Control (RPC with the main thread, never per request):
 *   main -> gateway  metrics()        this thread's metrics as JSON
 *                    setInfo()        the /info document, once the device is known
 *                    stopListening()  the drain's first step: new connections refused
 *                    pending()        requests in flight (the drain waits for none)
 *                    close()          every socket closed; the thread then ends by itself
 *                    addModel(plan)   serve one more model, or a reloaded one in place of its old version
 *                    retireModel(id)  new requests no longer find that model (those under way finish)
 *                    dropModel(id)    forget its slab: false while this thread still waits on any of its inputs
 *   gateway -> main  scrape()   the whole process's Prometheus text
 *                    repository(op)   the model repository's routes (src/main/repository/repository.ts)
 *                    {type: 'log', lines}  JSON log lines, batched per event-loop turn: the
 *                                thread's events, and its access lines unless they go
 *                                straight to a file descriptor (log.ts)
 */
import { startThreadTracing, type TracingConfig } from '../shared/telemetry/tracing.js';
import { RequestTracing } from './request-trace.js';
import { parentPort, workerData } from 'node:worker_threads';
import { Registry } from 'prom-client';
import type { ModelPlan } from '../shared/model-plan.js';
import { nowMs } from '../shared/clock.js';
import { ControlBlock, WorkerState } from '../shared/control.js';
import { traceDropMetric, gatewayMetrics, type GatewayMetrics } from '../shared/telemetry/metrics.js';
import { ResultCache, type CacheLayout } from '../shared/result-cache.js';
import { RpcPeer } from '../shared/rpc.js';
import { DeadlineExceededError, NotReadyError, SlabserveError } from '../shared/errors.js';
import type { Slab } from '../shared/slab.js';
import { SlabSubmitter } from '../core/submitter.js';
import { currentThreadId, nameThread } from '../shared/threads.js';
import { Gate, type GateOptions } from './gate.js';
import { Infer } from '../core/infer.js';
import { type BatchTokenizer } from '../core/encoder.js';
import { type ServedModel } from '../core/served-model.js';
import { BusyLag } from './lag.js';
import { AccessLog, batchedLines, createLogger, turnBatchedFd } from './log.js';
import type { GatewayOptions } from './options.js';
import { registerRoutes, type GatewayLimits } from './http/routes.js';
import { isValidModelName } from './security.js';
import { createTokenizePool } from './tokenize/pool.js';
import { loadModelTokenizer } from '../core/tokenizer/tokenizer.js';
import { GatewayListeners } from './listeners.js';
import { loadUws, type UwsChoice } from './uws.js';
import { registerWebSocket } from './ws/api.js';
import { ModelRegistry } from '../core/model-registry.js';
import type { RepositoryAnswer, RepositoryOp } from '../shared/repository-protocol.js';
import type { WsOptions } from './ws/api.js';
import type { GrpcListen } from './grpc/server.js';
import { collectStartupGarbage } from '../shared/gc.js';

/**
 * What a gateway thread starts with (src/main/server.ts gatewayWorkerData builds it).
 * A field named as a ServerConfig field is that setting, documented there once;
 * the rest is this thread's place (id, owner index, port) and shared memory.
 */
export interface GatewayWorkerData {
  gatewayId: number;
  /** Owner index in the slabs (0 is the main thread's). */
  owner: number;
  control: SharedArrayBuffer;
  owners: number;
  models: ModelPlan[];
  /** 0 picks a free port (the first gateway does, the others join it). */
  port: number;
  options: GatewayOptions;
  version: string;
  /** Where access lines are written (the CLI: 1, stdout); absent: they go to the main thread. */
  accessFd?: number;
  /** The result cache every gateway shares (src/shared/result-cache.ts); absent: off (--cache-mb 0). */
  cache?: { buffer: SharedArrayBuffer; layout: CacheLayout };
  /** Whether this thread serves HTTP and WebSocket (false: a thread of gRPC's own, --grpc-threads). */
  http: boolean;
  /** gRPC (--grpc-port): where this thread binds it (SO_REUSEPORT, as uWS binds HTTP's); absent: this thread serves none. */
  grpc?: GrpcListen;
  /** Tracing on (--otlp-endpoint, OTEL_EXPORTER_OTLP_*): a span per request (request-trace.ts). */
  tracing?: TracingConfig;
  /** The uWebSockets.js build the main thread's start-up check chose (uws.ts). */
  uws: UwsChoice;
  /** The /info document where the server is ready already (a replacement thread): it is ready as soon as it listens. */
  info?: unknown;
}

export type GatewayMessage = { type: 'listening'; port: number; grpcPort?: number; tid: number | null } | { type: 'fatal'; message: string } | { type: 'log'; lines: string[] };

const data = workerData as GatewayWorkerData;
const options = data.options;
const limits: GatewayLimits = {
  maxBodyBytes: options.maxBodyBytes,
  maxClientBatchSize: options.maxClientBatchSize,
  truncate: (options.longInputs ?? (options.truncate ? 'truncate' : 'error')) === 'truncate',
  longInputs: options.longInputs ?? (options.truncate ? 'truncate' : 'error'),
  maxInputTokens: options.maxInputTokens,
  chunkOverlapTokens: options.chunkOverlapTokens,
  openaiTokenIds: options.openaiTokenIds,
};
const wsOptions: WsOptions = { maxInflight: options.wsMaxInflight, maxBufferedBytes: options.wsMaxBufferedBytes, maxFrameBytes: options.wsMaxFrameBytes, idleTimeoutSeconds: options.wsIdleTimeoutSeconds };
/** A load answers once the model is warmed up: give it as long as the inference thread does. */
const REPOSITORY_RPC_MS = 11 * 60_000;
const post = (m: GatewayMessage) => parentPort!.postMessage(m);

const toMain = batchedLines((lines) => post({ type: 'log', lines }));
const thread = `gateway-${data.gatewayId}`;
nameThread(thread); // what top -H shows
const level = options.logLevel;
const logger = createLogger(level, thread, { write: toMain.write });
const accessOut = data.accessFd !== undefined ? turnBatchedFd(data.accessFd, options.logFormat) : null;
/** Writes every log line gathered so far (before closing, dying, or exiting). */
const flushLogs = () => {
  accessOut?.flush();
  toMain.flush();
};
process.on('exit', flushLogs);

async function main(): Promise<void> {
  const uws = loadUws(data.uws); // first: without its native binary nothing else is worth starting
  const control = new ControlBlock(data.control, data.owners);
  const owned = new ModelRegistry(data.models);
  const registry = new Registry();
  const metrics = gatewayMetrics(registry);
  const threadTracing = data.tracing ? startThreadTracing(data.tracing) : null;
  if (threadTracing) traceDropMetric(registry, threadTracing.dropped);
  const tracing = threadTracing ? new RequestTracing(threadTracing) : undefined;
  const pool = createTokenizePool(options.tokenizerThreads, options.tokenizerQueue !== undefined ? { maxQueue: options.tokenizerQueue } : {});
  const { infer, submitter } = await makeInfer(control, owned, metrics, pool.tokenize);

  const lag = new BusyLag();
  const info = new ServerInfo(infer);
  if (data.info !== undefined) info.set(data.info);
  // Ready once the main thread has told this thread the /info document too: a client that saw
  // /readyz 200 and asks /info next gets the server's, not "starting".
  const ready = () =>
    control.workerState === WorkerState.READY && info.known && !control.draining && nowMs() - control.heartbeat < options.heartbeatTimeoutMs;
  // Access lines: straight to their file descriptor, or to the main thread with the events (lines without their newline).
  const access = new AccessLog(level, thread, accessOut ? accessOut.stream : { write: (line: string) => toMain.write(line.slice(0, -1)) }, options.logProbes);
  const gate = new Gate({ ...options, apiKeys: options.apiKeys ?? [] }, metrics, access, { touch: () => lag.touch(), draining: () => control.draining });
  for (const m of data.models) {
    if (!isValidModelName(m.spec.name)) logger.warn({ model: m.spec.name }, 'this model name cannot be asked for by name (names are letters, digits, ".", "_", "-"): rename its folder');
  }
  const listeners = new GatewayListeners(uws, logger);
  const askRepository = (op: RepositoryOp, timeoutMs: number) => rpc.call<RepositoryAnswer>('repository', op, timeoutMs);
  const repositoryOp = (op: RepositoryOp) => askRepository(op, REPOSITORY_RPC_MS);
  const loadModel = options.lazyLoad ? lazyLoader(askRepository, () => info.repository.notLoaded) : undefined;
  listeners.closingWebSocketsWith(registerWebSocket(listeners.app, { infer, limits, metrics, ready, version: data.version, gate, log: access, loadModel, tracing }, wsOptions));

  const rpc = new RpcPeer(parentPort!, {
    metrics: () => {
      metrics.eventLoopLag.set({ gateway: String(data.gatewayId) }, lag.p99Seconds());
      gate.updateMetrics();
      lag.reset();
      return registry.getMetricsAsJSON();
    },
    setInfo: (doc) => {
      const first = info.set(doc);
      listeners.grpc?.refreshHealth(); // told once ready: SERVING now
      if (first) collectStartupGarbage(); // ready: start-up is over (src/shared/gc.ts)
    },
    // The drain's first step: new connections are refused (not accepted, then reset); the open ones
    // are served, every answer closing its connection (Gate.closesConnection), until close().
    stopListening: () => listeners.stopListening(),
    // Called once requests in flight have finished, or the drain's time ran out: those still in flight
    // are answered 503 then, before their sockets close (an answer, never a dropped connection).
    close: async () => {
      if (submitter.pendingCount > 0) {
        submitter.close(new NotReadyError(`draining: the request did not finish within the drain's time (--drain-timeout-ms)`));
        await new Promise((r) => setImmediate(r)); // the handlers write their answers first
      }
      await listeners.close();
      await pool.close();
      await threadTracing?.shutdown().catch(() => {}); // the last spans, waiting at most its grace
      lag.stop();
      flushLogs(); // before the answer: the main thread stops listening once every gateway has closed
      // Once this answer is out, let the thread end by itself when uWS has released its sockets.
      setImmediate(() => parentPort!.close());
      return { pending: submitter.pendingCount };
    },
    pending: () => submitter.pendingCount,
    ...owned.handlers(submitter),
  });
  dieOnUncaught(() => {
    void listeners.close();
    void pool.close().catch(() => {});
    setImmediate(() => parentPort!.close());
  });

  registerRoutes(listeners.app, {
    infer,
    loadModel,
    tracing,
    limits,
    metrics,
    ready,
    info: () => withCosts(info.doc, infer, owned.slabs),
    scrape: () => rpc.call<string>('scrape'),
    repository: repositoryOp,
    version: data.version,
    gate,
  });
  if (data.grpc) {
    try {
      const deps = { infer, loadModel, tracing, limits, metrics, ready, gate, log: access, streamMaxInflight: data.grpc.streamMaxInflight };
      // Loaded only where gRPC is served: grpc-js and the protos add to every thread's start-up.
      const { startGatewayGrpc } = await import('./grpc/server.js');
      listeners.grpc = await startGatewayGrpc({ ...deps, version: data.version, repository: repositoryOp, tokenizationWorkers: options.tokenizerThreads }, data.grpc);
    } catch (err) {
      post({ type: 'fatal', message: `cannot serve gRPC on ${options.host}:${data.grpc.port}: ${(err as Error).message}` });
      void listeners.close();
      return;
    }
  }
  const grpcPort = listeners.grpc ? { grpcPort: listeners.grpc.port } : {};
  if (!data.http) {
    post({ type: 'listening', port: data.port, ...grpcPort, tid: currentThreadId() });
    return;
  }
  const port = await listeners.listen(options.host, data.port);
  if (port === null) post({ type: 'fatal', message: `cannot listen on ${options.host}:${data.port} (in use, or not permitted)` });
  else post({ type: 'listening', port, ...grpcPort, tid: currentThreadId() });
}

/**
 * The /info document the main thread sends (setInfo), and what this thread reads from it: the
 * model repository's mode and the folders not loaded (lazy loading, the 404's hint).
 */
class ServerInfo {
  doc: unknown = { status: 'starting' };
  repository = repositoryOf(this.doc);
  private readonly infer: Infer;
  private told = false;

  constructor(infer: Infer) {
    this.infer = infer;
  }

  /** Whether the main thread has sent the document (it does once the server is ready). */
  get known(): boolean {
    return this.told;
  }

  /** Takes a new document; true for the first (the server is ready). */
  set(doc: unknown): boolean {
    const first = !this.told;
    this.told = true;
    this.doc = doc;
    this.repository = repositoryOf(doc);
    this.infer.models.missingHint = missingHint(this.repository);
    return first;
  }
}

/** This thread's submitter (as owner `data.owner`) and the request pipeline over it (src/core/infer.ts). */
async function makeInfer(control: ControlBlock, owned: ModelRegistry, metrics: GatewayMetrics, batchTokenizer: BatchTokenizer): Promise<{ infer: Infer; submitter: SlabSubmitter }> {
  const submitter = new SlabSubmitter(owned.slabs, control, data.owner, {
    buckets: owned.plans.map((m) => ({ lengths: m.batching.buckets, capacities: m.capacities })),
    onCancel: (r) => {
      metrics.cancellations.inc({ reason: r.reason });
      metrics.cancelledTokens.inc({ reason: r.reason, outcome: r.ran ? 'wasted' : 'saved' }, r.tokens);
    },
    loneWait: { maxUs: options.loneWaitUs, onWait: (answered) => metrics.loneWaits.inc({ outcome: answered ? 'answered' : 'released' }) },
  });
  const models: ServedModel[] = await Promise.all(data.models.map(async (plan) => ({ plan, tokenizer: await loadModelTokenizer(plan.spec) })));
  for (const m of models) owned.addModel(m);
  const infer = new Infer(owned, submitter, {
    requestTimeoutMs: options.requestTimeoutMs,
    priorityNames: options.priorities.map((p) => p.name),
    ...(options.sloP99Ms !== undefined ? { sloP99Ms: options.sloP99Ms } : {}),
    onLate: (_model, tokens) => {
      metrics.cancellations.inc({ reason: 'deadline' });
      metrics.cancelledTokens.inc({ reason: 'deadline', outcome: 'wasted' }, tokens);
    },
    batchTokenizer,
    inlineTokenizeChars: options.inlineTokenizeChars,
    cache: data.cache ? new ResultCache(data.cache.buffer, data.cache.layout, data.owner) : null,
  });
  return { infer, submitter };
}

/**
 * Supervision (src/main/threads/gateway-supervisor.ts): a thread that ends holding uWS sockets aborts the whole
 * process, so on an uncaught error report it, close them, and end; the main thread frees this
 * thread's slots and starts another.
 */
function dieOnUncaught(end: () => void): void {
  let dying = false;
  const die = (err: unknown) => {
    if (dying) return;
    dying = true;
    flushLogs(); // the log lines of this turn go first
    post({ type: 'fatal', message: `uncaught ${(err as Error)?.stack ?? String(err)}` });
    end();
  };
  process.on('uncaughtException', die);
  process.on('unhandledRejection', die);
}

/** The /info document's repository part: the model control mode and the folders not loaded. */
function repositoryOf(doc: unknown): { mode: string; notLoaded: Set<string> } {
  const repo = (doc as { repository?: { modelControlMode: string; notLoaded: string[] } }).repository;
  return { mode: repo?.modelControlMode ?? 'none', notLoaded: new Set(repo?.notLoaded ?? []) };
}

/** What a 404 for a model not loaded adds: how to load it. */
function missingHint(repo: { mode: string; notLoaded: Set<string> }): (name: string) => string {
  return (name) => {
    if (!repo.notLoaded.has(name)) return '';
    return repo.mode === 'explicit'
      ? `; "${name}" is in the model repository: POST /v2/repository/models/${name}/load loads it`
      : `; "${name}" is in the model repository but not served: restart with --model ${name}, or with --model-control-mode explicit to load it while serving`;
  };
}

/**
 * Lazy loading (--lazy-load): a request naming a folder of the repository that is not loaded asks
 * the main thread to load it (one load, shared by every request asking meanwhile, in every gateway)
 * and waits for it within its own deadline.
 */
function lazyLoader(ask: (op: RepositoryOp, timeoutMs: number) => Promise<RepositoryAnswer>, notLoaded: () => Set<string>): (name: string, timeoutMs: number) => Promise<boolean> {
  return async (name, timeoutMs) => {
    if (!notLoaded().has(name)) return false;
    let a: RepositoryAnswer;
    try {
      a = await ask({ op: 'ensure', name }, timeoutMs);
    } catch {
      throw new DeadlineExceededError(`model "${name}" was still loading at the request's deadline (${timeoutMs} ms); it goes on loading: retry`);
    }
    if (!a.ok) throw new SlabserveError(`model "${name}" could not be loaded: ${a.message}`, 'SLABSERVE_MODEL_LOAD_FAILED', a.type === 'unavailable' ? 'unavailable' : 'backend');
    return true;
  };
}

/** The /info document with each model's cost model as the inference thread last fitted it (ms = fixedMs + perRowMs x rows). */
function withCosts(info: unknown, infer: Infer, slabs: Slab[]): unknown {
  const doc = info as { models?: { name: string }[] };
  if (!Array.isArray(doc.models)) return info;
  const round = (v: number) => Math.round(v * 1000) / 1000;
  const served = new Map(infer.models.list().map((m) => [m.plan.spec.name, m.plan]));
  return {
    ...doc,
    models: doc.models.map((m) => {
      const plan = served.get(m.name);
      if (!plan) return m; // unloaded since the document was made
      const costModel = plan.batching.buckets.map((bucket, b) => {
        const c = slabs[plan.index]!.cost(b);
        return { bucket, fixedMs: round(c.fixedMs), perRowMs: round(c.perRowMs) };
      });
      return { ...m, costModel };
    }),
  };
}

main().catch((err: unknown) => {
  flushLogs();
  post({ type: 'fatal', message: (err as Error).message });
});
