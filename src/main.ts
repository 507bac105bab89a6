/**
 * The slabserve process: loads the model repository, starts the inference
 * thread and the gateway threads, serves /metrics for all of them, and drains
 * on SIGTERM. `slabserve serve` (src/cli.ts) calls startServer().
 *
 *   main thread      config, slabs, supervision, metrics aggregation, drain
 *   gateway threads  uWebSockets.js on one shared port (src/gateway/gateway-worker.ts)
 *   inference thread one per device (src/gpu-worker/worker.ts)
 */
import { createServer as createNetServer, type AddressInfo } from 'node:net';
import { cpus } from 'node:os';
import { Worker } from 'node:worker_threads';
import { AggregatorRegistry, collectDefaultMetrics, Registry } from 'prom-client';
import { DEFAULT_PRIORITIES, describeModel, slabStats, ENGINE_DEFAULTS } from './engine.js';
import { DEFAULT_SCHEDULING } from './gpu-worker/inference-loop.js';
import type { GatewayMessage, GatewayWorkerData } from './gateway/gateway-worker.js';
import { GATE_DEFAULTS } from './gateway/gate.js';
import type { LogLevel } from './gateway/log.js';
import { describeCuda, type DeviceInfo } from './gpu-worker/device.js';
import type { BatchingOptions } from './gpu-worker/scheduler.js';
import { loadModels, startInferenceThread, type ModelPlan } from './inference-host.js';
import { nowMs } from './shared/clock.js';
import { ControlBlock, WorkerState } from './shared/control.js';
import { ValidationError } from './shared/errors.js';
import { processMetrics } from './shared/metrics.js';
import { RpcPeer } from './shared/rpc.js';
import { Counter, Slab } from './shared/slab.js';
import { VERSION } from './version.js';

export interface ServerConfig {
  host: string;
  /** 0 picks a free port. */
  port: number;
  modelsDir?: string;
  models?: string[];
  device: string;
  gatewayThreads: number;
  batching: Partial<BatchingOptions>;
  maxInflightBatches: number;
  slotsPerModel: number;
  requestTimeoutMs: number;
  intraOpThreads: number;
  maxClientBatchSize: number;
  maxBodyBytes: number;
  heartbeatTimeoutMs: number;
  drainTimeoutMs: number;
  tokenizerThreads: number;
  inlineTokenizeChars: number;
  /** WebSocket: most requests in flight per socket (--ws-max-inflight). */
  wsMaxInflight: number;
  /** WebSocket: unsent bytes above which a socket's requests are held back (--ws-max-buffered-bytes). */
  wsMaxBufferedBytes: number;
  /** WebSocket: largest frame (--ws-max-frame-bytes). */
  wsMaxFrameBytes: number;
  /** WebSocket: idle seconds before a socket is closed; pings are sent meanwhile (--ws-idle-timeout-s). */
  wsIdleTimeoutSeconds: number;
  /** Priority classes in order (the first is the default) and their weights (--priority-weights). */
  priorities: { name: string; weight: number }[];
  /** A class whose oldest request has waited this long goes first (--priority-ageing-ms). */
  priorityAgeingMs: number;
  /** Latency target: adaptive batch window and admission against it (--slo-p99-ms). */
  sloP99Ms?: number;
  /** Replaces what /metrics answers (a cluster worker asks its primary for the whole cluster's: src/cluster.ts). */
  scrape?: () => Promise<string>;
  /** API keys: every route but health (and /metrics, unless metricsAuth) needs `Authorization: Bearer <key>` (--api-key, --api-key-file); none: open. */
  apiKeys?: string[];
  /** /metrics needs a key too (--metrics-auth). */
  metricsAuth?: boolean;
  /** Most connections per gateway thread: open WebSockets plus HTTP connections with a request in progress; past it 503 (--max-connections). */
  maxConnections?: number;
  /** Longest URL (path and query) in bytes; past it 414 (--max-url-bytes). */
  maxUrlBytes?: number;
  /** Largest request head (request line and headers) in bytes; past it 431 (--max-header-bytes). */
  maxHeaderBytes?: number;
  /** Least level of the JSON log lines: fatal, error, warn, info (an access line per request), debug, trace, silent (--log-level). */
  logLevel?: LogLevel;
  /** Gateway threads write access lines (one per request) straight to this file descriptor (the CLI: 1, stdout); absent, they reach `log`. */
  accessLogFd?: number;
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
  requestTimeoutMs: ENGINE_DEFAULTS.requestTimeoutMs,
  intraOpThreads: ENGINE_DEFAULTS.intraOpThreads,
  maxClientBatchSize: 64,
  maxBodyBytes: 2 * 1024 * 1024,
  heartbeatTimeoutMs: 30_000,
  drainTimeoutMs: 30_000,
  tokenizerThreads: 1,
  inlineTokenizeChars: 1024,
  wsMaxInflight: 256,
  wsMaxBufferedBytes: 1024 * 1024,
  wsMaxFrameBytes: 2 * 1024 * 1024,
  wsIdleTimeoutSeconds: 120,
  priorities: DEFAULT_PRIORITIES,
  priorityAgeingMs: DEFAULT_SCHEDULING.priorityAgeingMs,
  ...GATE_DEFAULTS,
  logLevel: 'info' as LogLevel,
} as const;

export interface Server {
  readonly port: number;
  readonly url: string;
  /** Resolves once every model is warmed up (then /readyz answers 200). */
  readonly ready: Promise<DeviceInfo>;
  /** Drains: readiness off, new requests refused, in-flight ones finish (up to drainTimeoutMs), sockets closed, threads stopped. */
  close(): Promise<void>;
  /** This process's metrics, every thread merged, as prom-client JSON (what /metrics shows without `scrape`). */
  metricsJson(): Promise<MetricsJson>;
}

type MetricsJson = Awaited<ReturnType<Registry['getMetricsAsJSON']>>;

interface GatewayHandle {
  worker: Worker;
  rpc: RpcPeer;
  exited: Promise<void>;
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
  if (config.maxClientBatchSize > config.slotsPerModel) {
    throw new ValidationError(
      `--max-client-batch-size (${config.maxClientBatchSize}) exceeds --slots-per-model (${config.slotsPerModel}): such a request could never be admitted`,
    );
  }
  const owners = 1 + config.gatewayThreads; // owner 0 is this thread
  const plans = loadModels({
    ...(config.modelsDir ? { modelsDir: config.modelsDir } : {}),
    ...(config.models && config.models.length ? { models: config.models } : {}),
    batching: config.batching,
    slotsPerModel: config.slotsPerModel,
    owners,
  });
  const control = ControlBlock.create(owners);
  const slabs = plans.map((p) => new Slab(p.slab, p.layout));
  const inference = startInferenceThread(plans, control, {
    device: config.device,
    intraOpThreads: config.intraOpThreads,
    maxInflightBatches: config.maxInflightBatches,
    scheduling: {
      priorityWeights: config.priorities.map((p) => p.weight),
      priorityAgeingMs: config.priorityAgeingMs,
      ...(config.sloP99Ms !== undefined ? { sloP99Ms: config.sloP99Ms } : {}),
    },
    log,
  });
  const inferenceRpc = new RpcPeer(inference.worker);
  const inferenceExited = new Promise<void>((res) => inference.worker.once('exit', () => res()));
  let device: DeviceInfo | null = null;

  // Metrics: this thread's share, computed from shared memory at scrape time.
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  processMetrics(registry, {
    models: () =>
      plans.map((p, i) => {
        const s = slabStats(slabs[i]!);
        return {
          name: p.spec.name,
          queued: s.queued,
          slotsInUse: s.slotsInUse,
          slots: p.layout.slotCount,
          realTokens: s.realTokens,
          paddedTokens: s.paddedTokens,
          expired: s.droppedExpired,
          expiredTokens: slabs[i]!.counters[Counter.EXPIRED_TOKENS]!,
          cancelled: s.cancelledSkipped,
          costs: p.batching.buckets.map((bucket, b) => ({ bucket, ...slabs[i]!.cost(b) })),
        };
      }),
    ready: () => control.workerState === WorkerState.READY && !control.draining,
    heartbeatAgeSeconds: () => (control.heartbeat ? (nowMs() - control.heartbeat) / 1000 : 0),
    deviceMemory: () => {
      if (!device || device.kind !== 'cuda') return null;
      const d = describeCuda(device.id);
      return { device: d.label, totalBytes: d.memoryTotalBytes, usedBytes: d.memoryUsedBytes };
    },
  });

  const gateways: GatewayHandle[] = [];
  const localParts = async (): Promise<MetricsJson[]> => {
    const parts: MetricsJson[] = [await registry.getMetricsAsJSON()];
    const others = await Promise.allSettled([
      ...gateways.map((g) => g.rpc.call<MetricsJson>('metrics')),
      control.workerState === WorkerState.READY ? inferenceRpc.call<MetricsJson>('metrics') : Promise.resolve([]),
    ]);
    for (const o of others) if (o.status === 'fulfilled') parts.push(o.value);
    return parts;
  };
  const metricsJson = async (): Promise<MetricsJson> => AggregatorRegistry.aggregate(await localParts()).getMetricsAsJSON();
  const scrape = config.scrape ?? (async (): Promise<string> => AggregatorRegistry.aggregate(await localParts()).metrics());

  const startGateway = (gatewayId: number, port: number): Promise<{ handle: GatewayHandle; port: number }> => {
    const data: GatewayWorkerData = {
      gatewayId,
      owner: 1 + gatewayId,
      control: control.buffer,
      owners,
      models: plans,
      host: config.host,
      port,
      limits: { maxBodyBytes: config.maxBodyBytes, maxClientBatchSize: config.maxClientBatchSize },
      requestTimeoutMs: config.requestTimeoutMs,
      heartbeatTimeoutMs: config.heartbeatTimeoutMs,
      tokenizerThreads: config.tokenizerThreads,
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
        metricsAuth: config.metricsAuth ?? GATE_DEFAULTS.metricsAuth,
        maxConnections: config.maxConnections ?? GATE_DEFAULTS.maxConnections,
        maxUrlBytes: config.maxUrlBytes ?? GATE_DEFAULTS.maxUrlBytes,
        maxHeaderBytes: config.maxHeaderBytes ?? GATE_DEFAULTS.maxHeaderBytes,
      },
      log: { level: config.logLevel ?? 'info', ...(config.accessLogFd !== undefined ? { accessFd: config.accessLogFd } : {}) },
    };
    const worker = new Worker(new URL('./gateway/gateway-worker.js', import.meta.url), { workerData: data, name: `slabserve-gateway-${gatewayId}` });
    const handle: GatewayHandle = {
      worker,
      rpc: new RpcPeer(worker, { scrape }),
      exited: new Promise<void>((res) => worker.once('exit', () => res())),
    };
    gateways.push(handle); // even if it fails to start: close() and the clean-up above must reach it
    return new Promise((res, rej) => {
      worker.once('error', rej);
      worker.once('exit', (code) => rej(new Error(`gateway ${gatewayId} exited during start-up (code ${code})`)));
      worker.on('message', (m: GatewayMessage) => {
        if (m.type === 'listening') res({ handle, port: m.port });
        else if (m.type === 'fatal') rej(new Error(`gateway ${gatewayId}: ${m.message}`));
        else if (m.type === 'log') for (const line of m.lines) log(line);
      });
    });
  };

  let port: number;
  try {
    // uSockets sets SO_REUSEPORT only for a fixed port, so with several gateways and
    // --port 0, pick a free port first. The first gateway binds it, the others join.
    const wanted = config.port === 0 && config.gatewayThreads > 1 ? await pickFreePort(config.host) : config.port;
    const first = await startGateway(0, wanted);
    port = first.port;
    for (let g = 1; g < config.gatewayThreads; g++) await startGateway(g, port);
  } catch (err) {
    // Stop cleanly: terminating the inference thread while onnxruntime opens its
    // sessions aborts the process, so ask it to stop and wait for it to exit.
    control.requestStop();
    await Promise.all(gateways.map((g) => g.rpc.call('close').catch(() => {})));
    await Promise.all(gateways.map((g) => g.worker.terminate()));
    await inference.ready.catch(() => {});
    await inferenceExited;
    throw err;
  }
  const shownHost = config.host === '0.0.0.0' ? '127.0.0.1' : config.host;
  const url = `http://${shownHost}:${port}`;
  log(`slabserve: listening on http://${config.host}:${port} (${config.gatewayThreads} gateway thread${config.gatewayThreads > 1 ? 's' : ''}); ready after warm-up`);

  const info = (d: DeviceInfo) => ({
    version: VERSION,
    device: { label: d.label, name: d.name, provider: d.provider },
    models: plans.map(describeModel), // gateways add each model's live cost model
    scheduling: {
      priorities: config.priorities,
      priorityAgeingMs: config.priorityAgeingMs,
      sloP99Ms: config.sloP99Ms ?? null,
    },
    limits: {
      maxClientBatchSize: config.maxClientBatchSize,
      maxBodyBytes: config.maxBodyBytes,
      requestTimeoutMs: config.requestTimeoutMs,
      slotsPerModel: config.slotsPerModel,
    },
    gatewayThreads: config.gatewayThreads,
  });

  const ready = inference.ready.then(async (d) => {
    device = d;
    await Promise.all(gateways.map((g) => g.rpc.call('setInfo', info(d))));
    log(`slabserve: ready at ${url}`);
    return d;
  });
  ready.catch(() => {}); // start-up failures surface through `ready`; close() still works

  let closing: Promise<void> | null = null;
  const close = () =>
    (closing ??= (async () => {
      control.draining = true; // /readyz 503 and new requests 503 from now on
      const deadline = Date.now() + config.drainTimeoutMs;
      while (Date.now() < deadline) {
        const pending = await Promise.all(gateways.map((g) => g.rpc.call<number>('pending').catch(() => 0)));
        if (pending.every((n) => n === 0)) break;
        await new Promise((r) => setTimeout(r, 20));
      }
      // Sockets must be closed before the threads go: uWS aborts the process otherwise. A gateway
      // ends by itself once its sockets are released; terminate only one that does not.
      await Promise.all(gateways.map((g) => g.rpc.call('close').catch(() => {})));
      control.requestStop();
      await inferenceExited;
      await Promise.all(
        gateways.map((g) => Promise.race([g.exited, new Promise<void>((r) => setTimeout(r, 2000).unref())]).then(() => g.worker.terminate())),
      );
      log('slabserve: stopped');
    })());

  return { port, url, ready, close, metricsJson };
}

export type { ModelPlan };
