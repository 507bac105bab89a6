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
 *   gateway -> main  scrape()   the whole process's Prometheus text
 *                    {type: 'log', lines}  JSON log lines, batched per event-loop turn: the
 *                                thread's events, and its access lines unless they go
 *                                straight to a file descriptor (log.ts)
 */
import { parentPort, workerData } from 'node:worker_threads';
import { Registry } from 'prom-client';
import type { ModelPlan } from '../shared/model-plan.js';
import { nowMs } from '../shared/clock.js';
import { ControlBlock, WorkerState } from '../shared/control.js';
import { gatewayMetrics, type GatewayMetrics } from '../shared/metrics.js';
import { ResultCache, type CacheLayout } from '../shared/result-cache.js';
import { RpcPeer } from '../shared/rpc.js';
import { Slab } from '../shared/slab.js';
import { SlabSubmitter } from '../shared/submitter.js';
import { currentThreadId, nameThread } from '../shared/threads.js';
import { Gate, GATE_DEFAULTS, type GateOptions } from './gate.js';
import { Infer, type BatchTokenizer, type ServedModel } from '../core/infer.js';
import { BusyLag } from './lag.js';
import { AccessLog, batchedLines, createLogger, turnBatchedFd, type LogLevel } from './log.js';
import { registerRoutes, type GatewayLimits } from './routes.js';
import { isValidModelName } from './security.js';
import { createTokenizePool } from './tokenize-pool.js';
import { loadModelTokenizer } from '../core/tokenizer.js';
import { loadUws, type us_listen_socket } from './uws.js';
import { registerWebSocket } from './ws.js';
import type { WsOptions } from './ws-options.js';

/**
 * What a gateway thread starts with (src/server.ts gatewayWorkerData builds it).
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
  host: string;
  /** 0 picks a free port (the first gateway does, the others join it). */
  port: number;
  limits: GatewayLimits;
  requestTimeoutMs: number;
  heartbeatTimeoutMs: number;
  tokenizerThreads: number;
  tokenizerQueue?: number;
  inlineTokenizeChars: number;
  ws: WsOptions;
  version: string;
  priorityNames: string[];
  sloP99Ms?: number;
  /** API keys and the request limits checked before any route (gate.ts); absent: no keys, GATE_DEFAULTS. */
  security?: Partial<GateOptions>;
  /** The result cache every gateway shares (src/shared/result-cache.ts); absent: off (--cache-mb 0). */
  cache?: { buffer: SharedArrayBuffer; layout: CacheLayout };
  /** Log level, the file descriptor access lines are written to (absent: they go to the main thread), and whether probes get access lines (--log-probes). */
  log?: { level: LogLevel; accessFd?: number; probes?: boolean };
}

export type GatewayMessage = { type: 'listening'; port: number; tid: number | null } | { type: 'fatal'; message: string } | { type: 'log'; lines: string[] };

const data = workerData as GatewayWorkerData;
const post = (m: GatewayMessage) => parentPort!.postMessage(m);

const toMain = batchedLines((lines) => post({ type: 'log', lines }));
const thread = `gateway-${data.gatewayId}`;
nameThread(thread); // what top -H shows
const level = data.log?.level ?? 'info';
const logger = createLogger(level, thread, { write: toMain.write });
const accessOut = data.log?.accessFd !== undefined ? turnBatchedFd(data.log.accessFd) : null;
/** Writes every log line gathered so far (before closing, dying, or exiting). */
const flushLogs = () => {
  accessOut?.flush();
  toMain.flush();
};
process.on('exit', flushLogs);

async function main(): Promise<void> {
  const uws = loadUws();
  const control = new ControlBlock(data.control, data.owners);
  const slabs = data.models.map((m) => new Slab(m.slab, m.layout));
  const registry = new Registry();
  const metrics = gatewayMetrics(registry);
  const pool = createTokenizePool(data.tokenizerThreads, data.tokenizerQueue !== undefined ? { maxQueue: data.tokenizerQueue } : {});
  const { infer, submitter } = await makeInfer(control, slabs, metrics, pool.tokenize);

  const lag = new BusyLag();
  let info: unknown = { status: 'starting' };
  let listenSocket: us_listen_socket | null = null;
  const ready = () =>
    control.workerState === WorkerState.READY && !control.draining && nowMs() - control.heartbeat < data.heartbeatTimeoutMs;
  // Access lines: straight to their file descriptor, or to the main thread with the events (lines without their newline).
  const access = new AccessLog(level, thread, accessOut ? accessOut.stream : { write: (line: string) => toMain.write(line.slice(0, -1)) }, data.log?.probes ?? false);
  const gate = new Gate({ apiKeys: [], ...GATE_DEFAULTS, ...data.security }, metrics, access, { touch: () => lag.touch(), draining: () => control.draining });
  for (const m of data.models) {
    if (!isValidModelName(m.spec.name)) logger.warn({ model: m.spec.name }, 'this model name cannot be asked for by name (names are letters, digits, ".", "_", "-"): rename its folder');
  }
  const app = uws.App();
  const closeWebSockets = registerWebSocket(app, { infer, limits: data.limits, metrics, ready, version: data.version, gate, log: access }, data.ws);
  const stopListening = () => {
    if (listenSocket) uws.us_listen_socket_close(listenSocket);
    listenSocket = null;
  };
  /** Every socket closed: a thread that ends holding uWS sockets aborts the process. */
  const closeSockets = () => {
    stopListening();
    try {
      closeWebSockets();
    } catch {
      // the app's close below ends them too
    }
    (app as typeof app & { close(): void }).close();
  };

  const rpc = new RpcPeer(parentPort!, {
    metrics: () => {
      metrics.eventLoopLag.set({ gateway: String(data.gatewayId) }, lag.p99Seconds());
      gate.updateMetrics();
      lag.reset();
      return registry.getMetricsAsJSON();
    },
    setInfo: (doc) => {
      info = doc;
    },
    // The drain's first step: new connections are refused (not accepted, then reset); the open ones
    // are served, every answer closing its connection (Gate.closesConnection), until close().
    stopListening,
    // Called once requests in flight have finished (or the drain timed out).
    close: async () => {
      closeSockets();
      await pool.close();
      lag.stop();
      flushLogs(); // before the answer: the main thread stops listening once every gateway has closed
      // Once this answer is out, let the thread end by itself when uWS has released its sockets.
      setImmediate(() => parentPort!.close());
      return { pending: submitter.pendingCount };
    },
    pending: () => submitter.pendingCount,
  });
  dieOnUncaught(() => {
    closeSockets();
    void pool.close().catch(() => {});
    setImmediate(() => parentPort!.close());
  });

  registerRoutes(app, {
    infer,
    limits: data.limits,
    metrics,
    ready,
    info: () => withCosts(info, data.models, slabs),
    scrape: () => rpc.call<string>('scrape'),
    version: data.version,
    gate,
  });
  app.listen(data.host, data.port, (socket) => {
    if (!socket) {
      post({ type: 'fatal', message: `cannot listen on ${data.host}:${data.port} (in use, or not permitted)` });
      return;
    }
    listenSocket = socket;
    post({ type: 'listening', port: uws.us_socket_local_port(socket), tid: currentThreadId() });
  });
}

/** This thread's submitter (as owner `data.owner`) and the request pipeline over it (src/core/infer.ts). */
async function makeInfer(control: ControlBlock, slabs: Slab[], metrics: GatewayMetrics, batchTokenizer: BatchTokenizer): Promise<{ infer: Infer; submitter: SlabSubmitter }> {
  const submitter = new SlabSubmitter(slabs, control, data.owner, {
    buckets: data.models.map((m) => ({ lengths: m.batching.buckets, capacities: m.capacities })),
    onCancel: (r) => {
      metrics.cancellations.inc({ reason: r.reason });
      metrics.cancelledTokens.inc({ reason: r.reason, outcome: r.ran ? 'wasted' : 'saved' }, r.tokens);
    },
  });
  const models: ServedModel[] = await Promise.all(data.models.map(async (plan) => ({ plan, tokenizer: await loadModelTokenizer(plan.spec) })));
  const infer = new Infer(models, submitter, {
    requestTimeoutMs: data.requestTimeoutMs,
    priorityNames: data.priorityNames,
    ...(data.sloP99Ms !== undefined ? { sloP99Ms: data.sloP99Ms } : {}),
    onLate: (_model, tokens) => {
      metrics.cancellations.inc({ reason: 'deadline' });
      metrics.cancelledTokens.inc({ reason: 'deadline', outcome: 'wasted' }, tokens);
    },
    batchTokenizer,
    inlineTokenizeChars: data.inlineTokenizeChars,
    cache: data.cache ? new ResultCache(data.cache.buffer, data.cache.layout, data.owner) : null,
  });
  return { infer, submitter };
}

/**
 * Supervision (src/gateway-host.ts): a thread that ends holding uWS sockets aborts the whole
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

/** The /info document with each model's cost model as the inference thread last fitted it (ms = fixedMs + perRowMs x rows). */
function withCosts(info: unknown, plans: ModelPlan[], slabs: Slab[]): unknown {
  const doc = info as { models?: { name: string }[] };
  if (!Array.isArray(doc.models)) return info;
  const round = (v: number) => Math.round(v * 1000) / 1000;
  return {
    ...doc,
    models: doc.models.map((m, i) => ({
      ...m,
      costModel: plans[i]!.batching.buckets.map((bucket, b) => {
        const c = slabs[i]!.cost(b);
        return { bucket, fixedMs: round(c.fixedMs), perRowMs: round(c.perRowMs) };
      }),
    })),
  };
}

main().catch((err: unknown) => {
  flushLogs();
  post({ type: 'fatal', message: (err as Error).message });
});
