/**
 * A cluster of slabserve processes on one machine (`slabserve serve --processes N`
 * or `--devices cuda:0,cuda:1`): one process per device, each a full
 * startServer() (its own gateway threads, slabs and inference thread), all on
 * one port. docs/cluster.md describes it.
 *
 *   primary   serves nothing itself: picks the port, forks the processes
 *             (node:cluster), restarts one that exits unexpectedly (with
 *             backoff), gathers every process's metrics for /metrics, and
 *             drains them all on SIGTERM / SIGINT
 *   worker    `slabserve serve` as usual, with the port, device and thread
 *             counts the primary chose; its /metrics asks the primary
 *
 * A SharedArrayBuffer lives in one process, so the slabs cannot be shared
 * between processes: the process is the unit of the cluster, as the device is.
 *
 * uWebSockets.js does not listen through Node's net handles, so node:cluster's
 * handle sharing does not apply: every worker binds the same fixed port itself
 * (uSockets sets SO_REUSEPORT on a fixed port) and the kernel spreads
 * connections between them. With --port 0 the primary picks a free port first.
 *
 * Messages between them (the IPC channel node:cluster opens):
 *   worker -> primary  {slabserve: 'hello'}      its handlers are attached (drain by message from now on)
 *                      {slabserve: 'listening'}  startServer() returned
 *                      {slabserve: 'ready'}      warm-up done (/readyz 200)
 *                      rpc scrape()              the cluster's Prometheus text, for its /metrics
 *   primary -> worker  {slabserve: 'drain'}      drain and exit 0 (as SIGTERM does)
 *                      rpc metrics()             this process's metrics as prom-client JSON
 */
import cluster, { type Worker as ClusterWorker } from 'node:cluster';
import { cpus } from 'node:os';
import { AggregatorRegistry, Counter, Gauge, Registry } from 'prom-client';
import { checkDevice } from '../../gpu-worker/device.js';
import { checkNativeBinaries } from '../native-binaries.js';
import { defaultGatewayThreads, ensurePortFree, pickFreePort, resolveServerConfig, type ResolvedServerConfig, type Server, type ServerConfig } from '../server.js';
import { DEFAULT_GRPC_PORT } from '../../shared/options.js';
import { settlesWithin } from '../../shared/clock.js';
import { ValidationError } from '../../shared/errors.js';
import { RpcPeer } from '../../shared/rpc.js';
import type { IndexEntry, ModelState, RepositoryAnswer, RepositoryOp, ServedSource } from '../../shared/repository-protocol.js';

type MetricsJson = Awaited<ReturnType<Registry['getMetricsAsJSON']>>;

/** What the primary hands each worker (in SLABSERVE_CLUSTER_PROCESS, internal). */
interface ProcessPlan {
  /** 0..N-1, stable across restarts: the `process` label of per-process metrics. */
  index: number;
  device: string;
  port: number;
  /** gRPC's port, every process's (0: off). */
  grpcPort: number;
  gatewayThreads: number;
  intraOpThreads: number;
  /** The models to load at start, when the repository routes changed the set since the flags said it (a restarted process serves what the others do). */
  models?: string[];
  /** The names they are served by, one per model. */
  servedModelNames?: string[];
}

const PLAN_ENV = 'SLABSERVE_CLUSTER_PROCESS';

export interface ClusterOptions {
  /** --processes: how many processes. */
  processes?: number;
  /** --devices: one process per entry. */
  devices?: string[];
  /** Whether --device, --gateway-threads, --intra-op-threads were given (flag or variable) rather than defaulted. */
  explicit?: { device?: boolean; gatewayThreads?: boolean; intraOpThreads?: boolean };
}

/** First restart after this long, doubling for each exit that did not reach ready in between, up to the cap. */
export const RESTART_BACKOFF_MS = 250;
export const RESTART_BACKOFF_MAX_MS = 30_000;
/** A process that stayed ready this long starts its backoff afresh when it exits. */
const STABLE_MS = 30_000;
/** On SIGTERM, how long past --drain-timeout-ms the primary waits for its processes before killing them. */
export const DRAIN_MARGIN_MS = 10_000;
/** How long a scrape waits for each process's metrics; a process that does not answer is left out (and counted). */
const SCRAPE_TIMEOUT_MS = 3_000;

/**
 * Metrics that describe one process and mean nothing summed: they get a
 * `process` label (the process index). Everything else is summed across
 * processes (prom-client's aggregator for the metric: counters, histograms,
 * slots, queue depth, tokens), except prom-client's default metrics that carry
 * their own aggregator (event-loop lag averaged, version first, start time omitted).
 */
const PER_PROCESS = new Set([
  'slabserve_ready',
  'slabserve_inference_heartbeat_age_seconds',
  'slabserve_gateway_event_loop_lag_seconds',
  'slabserve_batch_cost_seconds',
  'slabserve_device_memory_bytes',
]);

/**
 * This process's part: 'primary' when `serve` was given --processes or
 * --devices, 'worker' in a process the primary forked, null otherwise.
 */
export function clusterRole(opts: ClusterOptions): 'primary' | 'worker' | null {
  if (opts.processes === undefined && opts.devices === undefined) return null;
  return cluster.isWorker && process.env[PLAN_ENV] ? 'worker' : 'primary';
}

/** The processes to start: one per --devices entry, or --processes copies of --device (cpu when that is auto). */
export function planProcesses(config: Pick<ResolvedServerConfig, 'device' | 'port' | 'gatewayThreads' | 'intraOpThreads'>, opts: ClusterOptions): Omit<ProcessPlan, 'port' | 'grpcPort'>[] {
  let devices: string[];
  if (opts.devices !== undefined) {
    if (opts.devices.length === 0) throw new ValidationError('--devices: expected a comma-separated list like cuda:0,cuda:1');
    // `auto` (the default, and what the image sets) does not conflict: --devices decides.
    if (opts.explicit?.device && config.device !== 'auto') {
      throw new ValidationError(`--devices and --device ${config.device} do not go together: --devices names the device of each process`);
    }
    if (opts.processes !== undefined && opts.processes !== opts.devices.length) {
      throw new ValidationError(`--processes ${opts.processes} does not match --devices (${opts.devices.length} ${opts.devices.length === 1 ? 'entry' : 'entries'}): one process per device`);
    }
    devices = opts.devices;
  } else {
    const n = opts.processes ?? 1;
    const device = config.device === 'auto' ? 'cpu' : config.device;
    devices = Array.from({ length: n }, () => device);
  }
  for (const d of devices) {
    try {
      checkDevice(d);
    } catch (err) {
      throw new ValidationError(`--devices: ${(err as Error).message}`);
    }
  }
  const n = devices.length;
  const cores = cpus().length;
  return devices.map((device, index) => ({
    index,
    device,
    // Defaults are per machine; divided among the processes unless given.
    gatewayThreads: opts.explicit?.gatewayThreads ? config.gatewayThreads : Math.max(1, Math.floor(defaultGatewayThreads() / n)),
    intraOpThreads:
      opts.explicit?.intraOpThreads || config.intraOpThreads !== 0 || !device.startsWith('cpu') ? config.intraOpThreads : Math.max(1, Math.floor(cores / n)),
  }));
}

// =================================================================== worker side

/** The IPC channel as an RpcPeer port; a send on a closed channel is dropped, not thrown. */
function processPort() {
  return {
    postMessage: (m: unknown) => {
      if (process.connected) process.send!(m, undefined, undefined, () => {});
    },
    on: (event: 'message', listener: (m: unknown) => void) => process.on(event, listener),
  };
}

function sendToPrimary(m: { slabserve: string; [k: string]: unknown }): void {
  if (process.connected) process.send!(m, undefined, undefined, () => {});
}

export interface ClusterWorkerHooks {
  /** Config fields that override the flags in this process (port, device, threads, log, scrape, the repository's operations, the models at start). */
  overrides: Pick<ServerConfig, 'port' | 'grpcPort' | 'sharedPort' | 'device' | 'gatewayThreads' | 'intraOpThreads' | 'log' | 'scrape' | 'repository' | 'models'>;
  /** Call once startServer() has returned: reports to the primary, drains when it asks. */
  started(server: Server): void;
}

/**
 * In a cluster worker (cluster.isWorker): attaches to the primary before
 * startServer() runs, so a drain asked during start-up is not lost: it aborts
 * `stop` (startServer's signal) at once, which turns away new requests even
 * while the gateways still start, and closes the server once it has started.
 */
export function clusterWorker(log: (line: string) => void, stop: AbortController): ClusterWorkerHooks {
  const raw = process.env[PLAN_ENV];
  if (!cluster.isWorker || !raw) throw new Error('clusterWorker(): not a slabserve cluster worker');
  const plan = JSON.parse(raw) as ProcessPlan;
  let server: Server | null = null;
  let drainAsked = false;
  const drain = () => {
    stop.abort();
    if (!server) {
      drainAsked = true;
      return;
    }
    void server.close().then(() => process.exit(0));
  };
  const rpc = new RpcPeer(processPort(), {
    metrics: async () => (server ? server.metricsJson() : []),
    // The primary applies a repository operation to every process: this is this process's part.
    repositoryLocal: async (op) => (server ? server.repository(op as RepositoryOp) : { ok: false, message: 'the process is starting', code: 'SLABSERVE_NOT_READY', type: 'unavailable' }),
  });
  process.on('message', (m: unknown) => {
    if (typeof m === 'object' && m !== null && (m as { slabserve?: string }).slabserve === 'drain') drain();
  });
  // Node ends a worker at once when its primary goes, and process.exit() while uWS still listens in the
  // gateway threads aborts the process: drain instead (no orphan either way). Node emits this before
  // it checks exitedAfterDisconnect.
  cluster.worker!.on('disconnect', () => {
    cluster.worker!.exitedAfterDisconnect = true;
    log(`slabserve[${plan.index}]: the cluster primary is gone: draining`);
    drain();
  });
  // The channel must not keep this process alive: if startServer() fails, it exits as `serve` does.
  process.channel?.unref();
  sendToPrimary({ slabserve: 'hello' });

  // Every line says which process wrote it: a JSON line gets a `process` field, a text line a prefix.
  const prefixed = (line: string) => {
    if (line.startsWith('{')) {
      try {
        return log(JSON.stringify({ process: plan.index, ...(JSON.parse(line) as object) }));
      } catch {
        // not JSON after all: prefixed below
      }
    }
    log(line.startsWith('slabserve:') ? `slabserve[${plan.index}]:${line.slice('slabserve:'.length)}` : `[${plan.index}] ${line}`);
  };
  const scrape = async (): Promise<string> => {
    // Without a primary (it died; this process is on its way out), this process's own view.
    if (!process.connected) return AggregatorRegistry.aggregate([await server!.metricsJson()]).metrics();
    return rpc.call<string>('scrape', undefined, SCRAPE_TIMEOUT_MS + 2_000);
  };
  // A repository route on any process changes every process: the primary applies it to all.
  const repository = async (op: unknown): Promise<unknown> => {
    if (!process.connected) return server!.repository(op as RepositoryOp);
    return rpc.call('repository', op, REPOSITORY_TIMEOUT_MS);
  };
  return {
    overrides: {
      port: plan.port,
      grpcPort: plan.grpcPort,
      sharedPort: true,
      device: plan.device,
      gatewayThreads: plan.gatewayThreads,
      intraOpThreads: plan.intraOpThreads,
      log: prefixed,
      scrape,
      repository,
      ...(plan.models ? { models: plan.models } : {}),
      ...(plan.servedModelNames ? { servedModelNames: plan.servedModelNames } : {}),
    },
    started(s: Server) {
      server = s;
      sendToPrimary({ slabserve: 'listening', port: s.port });
      s.ready.then(
        (d) => sendToPrimary({ slabserve: 'ready', device: d.label }),
        () => {},
      );
      if (drainAsked) drain();
    },
  };
}

/** How long a repository operation may take in a process (a load warms a model up). */
const REPOSITORY_TIMEOUT_MS = 11 * 60_000;

/** Every process's index as one: by name, READY where every process serves it, else the least ready state, each reason by process. */
export function mergeIndexes(indexes: IndexEntry[][]): IndexEntry[] {
  const rank: Record<ModelState, number> = { UNAVAILABLE: 0, UNLOADING: 1, LOADING: 2, READY: 3 };
  const byName = new Map<string, IndexEntry[]>();
  indexes.forEach((index) => {
    for (const e of index) byName.set(e.name, [...(byName.get(e.name) ?? []), e]);
  });
  return [...byName.entries()]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([name, rows]) => {
      const missing = rows.length < indexes.length;
      const state = missing ? 'UNAVAILABLE' : rows.reduce<ModelState>((s, r) => (rank[r.state] < rank[s] ? r.state : s), 'READY');
      const reasons = [...new Set(rows.map((r) => r.reason).filter((r) => r !== ''))];
      const versions = [...new Set(rows.map((r) => r.version).filter((v) => v !== undefined))];
      return { name, ...(versions.length === 1 ? { version: versions[0]! } : {}), state, reason: reasons.join('; ') };
    });
}

// =================================================================== primary side

interface Slot {
  plan: ProcessPlan;
  worker: ClusterWorker | null;
  rpc: RpcPeer | null;
  pid: number;
  hello: boolean;
  listening: boolean;
  ready: boolean;
  readySince: number;
  /** Whether any process in this slot has been ready (a first start that fails stops the cluster). */
  everReady: boolean;
  /** Exits since this slot was last stably ready: the backoff exponent. */
  failures: number;
  restartTimer: NodeJS.Timeout | null;
  /** Settles once the process forked last listens, or exits first (what a repository operation waits for). */
  listened: Promise<void>;
  markListened: () => void;
}

function describeExit(code: number | null, signal: string | null): string {
  return signal ? `signal ${signal}` : `exit code ${code}`;
}

/** Adds the `process` label to the per-process metrics of one process's JSON. */
function labelPerProcess(json: MetricsJson, index: number): MetricsJson {
  for (const metric of json) {
    if (!PER_PROCESS.has(metric.name)) continue;
    for (const v of metric.values) v.labels = { ...v.labels, process: String(index) };
  }
  return json;
}

/**
 * The cluster's primary: starts the processes and supervises them until
 * SIGTERM / SIGINT, then drains them and exits (0 when all ended in time).
 * Resolves once every process is ready; a process whose first start fails
 * stops the cluster (exit 1), as a failed start stops `serve`.
 */
export async function runClusterPrimary(given: ServerConfig, opts: ClusterOptions): Promise<void> {
  const config = resolveServerConfig(given);
  const plans = planProcesses(config, opts);
  // uSockets sets SO_REUSEPORT only on a fixed port: with --port 0, pick one for all.
  const port = config.port === 0 ? await pickFreePort(config.host) : config.port;
  if (config.port !== 0) await ensurePortFree(config.host, port);
  // gRPC's port likewise: one for all (startServer's rule for one process: a free one with --port 0).
  const grpcPort = config.grpcPort === 0 ? 0 : (config.grpcPort ?? (config.port === 0 ? await pickFreePort(config.host) : DEFAULT_GRPC_PORT));
  if (grpcPort !== 0 && (config.grpcPort !== undefined || config.port !== 0)) await ensurePortFree(config.host, grpcPort, '--grpc-port');
  await checkNativeBinaries({ gateways: true }); // once here, before any process forks (each checks again for itself)
  const primary = new ClusterPrimary(config, plans.map((p) => ({ ...p, port, grpcPort })));
  process.on('SIGTERM', () => primary.signal('SIGTERM'));
  process.on('SIGINT', () => primary.signal('SIGINT'));
  // Workers run this same command line; they read their plan from the environment. Structured clone
  // on the channel carries metric values JSON cannot (NaN, Infinity).
  cluster.setupPrimary({ serialization: 'advanced' });
  const n = plans.length;
  config.log(`slabserve: cluster: ${n} process${n === 1 ? '' : 'es'} (${plans.map((p) => p.device).join(', ')}) on http://${config.host}:${port}; ready after warm-up`);
  await primary.start();
  const shownHost = config.host === '0.0.0.0' ? '127.0.0.1' : config.host;
  config.log(`slabserve: cluster: ready at http://${shownHost}:${port} (${n} process${n === 1 ? '' : 'es'})`);
}

/** The processes of a cluster, one slot each: forked, restarted with backoff, scraped, drained. */
class ClusterPrimary {
  private readonly config: ResolvedServerConfig;
  private readonly log: (line: string) => void;
  private readonly slots: Slot[];
  /** The primary's own metrics, merged into every scrape. */
  private readonly registry = new Registry();
  private readonly missing: Gauge;
  private readonly restarts: Counter;
  private stopping = false;
  private stopped: Promise<number> | null = null;
  private signals = 0;
  private resolveStarted!: () => void;
  private rejectStarted!: (e: Error) => void;
  private readonly started = new Promise<void>((res, rej) => {
    this.resolveStarted = res;
    this.rejectStarted = rej;
  });
  private allExited: () => void = () => {};

  constructor(config: ResolvedServerConfig, plans: ProcessPlan[]) {
    this.config = config;
    this.log = config.log;
    this.slots = plans.map((plan) => ({
      plan,
      worker: null,
      rpc: null,
      pid: 0,
      hello: false,
      listening: false,
      ready: false,
      readySince: 0,
      everReady: false,
      failures: 0,
      restartTimer: null,
      listened: Promise.resolve(),
      markListened: () => {},
    }));
    const slots = this.slots;
    new Gauge({ name: 'slabserve_cluster_processes', help: 'Processes the cluster runs (--processes or --devices).', registers: [this.registry] }).set(slots.length);
    new Gauge({
      name: 'slabserve_cluster_processes_ready',
      help: 'Cluster processes alive and ready (warmed up, not draining).',
      registers: [this.registry],
      collect() {
        this.set(slots.filter((s) => s.ready).length);
      },
    });
    this.missing = new Gauge({
      name: 'slabserve_cluster_scrape_missing_processes',
      help: 'Processes whose metrics this scrape lacks (starting, exited, or no answer within 3 s).',
      registers: [this.registry],
    });
    this.restarts = new Counter({
      name: 'slabserve_cluster_restarts_total',
      help: 'Processes restarted by the primary after they exited unexpectedly.',
      labelNames: ['process', 'device'],
      registers: [this.registry],
    });
    for (const s of slots) this.restarts.inc({ process: String(s.plan.index), device: s.plan.device }, 0);
  }

  /** Forks every process; resolves once all are ready, or drains and rethrows when one fails its first start. */
  async start(): Promise<void> {
    for (const s of this.slots) this.fork(s);
    try {
      await this.started;
    } catch (err) {
      await this.stop();
      throw err;
    }
  }

  /** SIGTERM / SIGINT: drain and exit; a second signal kills the processes and exits at once. */
  signal(sig: string): void {
    const alive = this.alive();
    if (++this.signals > 1) {
      this.log(`slabserve: cluster: ${sig} again, killing the processes and exiting now`);
      for (const s of alive) s.worker!.process.kill('SIGKILL');
      process.exit(1);
    }
    this.log(`slabserve: cluster: ${sig}: draining ${alive.length} process${alive.length === 1 ? '' : 'es'} (up to ${this.config.drainTimeoutMs} ms), send again to exit at once`);
    void this.stop().then((code) => {
      this.log('slabserve: cluster: stopped');
      process.exit(code);
    });
  }

  private alive(): Slot[] {
    return this.slots.filter((s) => s.worker !== null);
  }

  /** Every process's metrics (per-process ones labelled) merged with the primary's. */
  private async gather(): Promise<string> {
    const asked = this.slots.filter((s) => s.listening && s.rpc && s.worker?.isConnected());
    const answers = await Promise.all(
      asked.map((s) =>
        s.rpc!.call<MetricsJson>('metrics', undefined, SCRAPE_TIMEOUT_MS).then(
          (json) => labelPerProcess(json, s.plan.index),
          () => null,
        ),
      ),
    );
    const parts = answers.filter((a): a is MetricsJson => a !== null && a.length > 0);
    this.missing.set(this.slots.length - parts.length);
    parts.push(await this.registry.getMetricsAsJSON());
    return AggregatorRegistry.aggregate(parts).metrics();
  }

  /**
   * A repository operation on every process, answered once all have: the index merged (a model is
   * READY where every process serves it), a load or unload ok when every process did it, else the
   * reasons by process. A change is remembered, so a process restarted later starts with the set.
   */
  private async applyRepository(op: RepositoryOp): Promise<RepositoryAnswer> {
    // A process still starting was forked with the set as it was: it is asked too, once it listens,
    // else it would serve without this change (and the answer would say every process has it).
    if (op.op !== 'index') await settlesWithin(Promise.all(this.slots.map((s) => s.listened)), REPOSITORY_TIMEOUT_MS);
    const asked = this.slots.filter((s) => s.listening && s.rpc && s.worker?.isConnected());
    const answers = await Promise.all(
      asked.map((s) =>
        s.rpc!.call<RepositoryAnswer>('repositoryLocal', op, REPOSITORY_TIMEOUT_MS).catch(
          (err: Error): RepositoryAnswer => ({ ok: false, message: err.message, code: 'SLABSERVE_REPOSITORY', type: 'unavailable' }),
        ),
      ),
    );
    if (op.op === 'index') return { ok: true, index: mergeIndexes(answers.flatMap((a) => (a.ok && a.index ? [a.index] : []))) };
    const failed = answers.flatMap((a, i) => (a.ok ? [] : [{ process: asked[i]!.plan.index, a }]));
    if (failed.length === 0) {
      if (asked.length > 0) this.rememberModels(await this.servedModels(asked[0]!));
      return { ok: true };
    }
    const first = failed[0]!.a as Extract<RepositoryAnswer, { ok: false }>;
    const message = failed.map((f) => `process ${f.process}: ${(f.a as { message: string }).message}`).join('; ');
    return { ok: false, message: failed.length === answers.length && failed.length === 1 ? first.message : message, code: first.code, type: first.type };
  }

  /** The models a process serves now, as --model finds them again: what a restarted process starts with. */
  private async servedModels(slot: Slot): Promise<ServedSource[] | null> {
    const a = await slot.rpc!.call<RepositoryAnswer>('repositoryLocal', { op: 'served' }, REPOSITORY_TIMEOUT_MS).catch(() => null);
    return a?.ok && a.served ? a.served : null;
  }

  /** What every process starts with from now on (none served: the flags' set, as a start with no model is refused). */
  private rememberModels(models: ServedSource[] | null): void {
    if (!models || models.length === 0) return;
    for (const s of this.slots) Object.assign(s.plan, { models: models.map((m) => m.given), servedModelNames: models.map((m) => m.name) });
  }

  private fork(slot: Slot): void {
    slot.restartTimer = null;
    const worker = cluster.fork({ [PLAN_ENV]: JSON.stringify(slot.plan) });
    let markListened!: () => void;
    const listened = new Promise<void>((r) => (markListened = r));
    Object.assign(slot, { worker, pid: worker.process.pid ?? 0, hello: false, listening: false, ready: false, listened, markListened });
    slot.rpc = new RpcPeer(
      {
        postMessage: (m: unknown) => {
          if (worker.isConnected()) worker.send(m as object, undefined, () => {});
        },
        on: (event: 'message', listener: (m: unknown) => void) => worker.on(event, listener),
      },
      { scrape: () => this.gather(), repository: (op) => this.applyRepository(op as RepositoryOp) },
    );
    this.log(`slabserve: cluster: process ${slot.plan.index} (${slot.plan.device}) started, pid ${slot.pid}`);
    worker.on('message', (m: { slabserve?: string }) => {
      if (typeof m !== 'object' || m === null) return;
      if (m.slabserve === 'hello') {
        slot.hello = true;
        if (this.stopping) worker.send({ slabserve: 'drain' }, undefined, () => {});
      } else if (m.slabserve === 'listening') {
        slot.listening = true;
        slot.markListened();
      } else if (m.slabserve === 'ready') {
        if (slot.everReady) this.log(`slabserve: cluster: process ${slot.plan.index} (pid ${slot.pid}) ready again`);
        Object.assign(slot, { ready: true, readySince: Date.now(), everReady: true });
        if (this.slots.every((s) => s.everReady)) this.resolveStarted();
      }
    });
    worker.on('exit', (code, signal) => this.onExit(slot, worker, code, signal));
  }

  private onExit(slot: Slot, worker: ClusterWorker, code: number | null, signal: string | null): void {
    if (slot.worker !== worker) return;
    slot.markListened(); // what waited for it to listen goes on without it
    const wasReadyFor = slot.ready ? Date.now() - slot.readySince : 0;
    Object.assign(slot, { worker: null, rpc: null, hello: false, listening: false, ready: false });
    const what = `process ${slot.plan.index} (${slot.plan.device}`;
    if (this.stopping) {
      this.log(`slabserve: cluster: process ${slot.plan.index} (pid ${slot.pid}) ended (${describeExit(code, signal)})`);
      if (this.alive().length === 0) this.allExited();
      return;
    }
    if (!slot.everReady) {
      // A first start that fails is a configuration error (port in use, bad model, missing device): stop.
      this.log(`slabserve: cluster: ${what}) failed to start (${describeExit(code, signal)}); stopping the cluster`);
      this.rejectStarted(new Error(`${what}) failed to start (${describeExit(code, signal)})`));
      return;
    }
    if (wasReadyFor >= STABLE_MS) slot.failures = 0;
    const delay = Math.min(RESTART_BACKOFF_MS * 2 ** slot.failures, RESTART_BACKOFF_MAX_MS);
    slot.failures++;
    this.restarts.inc({ process: String(slot.plan.index), device: slot.plan.device });
    this.log(`slabserve: cluster: ${what}, pid ${slot.pid}) exited unexpectedly (${describeExit(code, signal)}); restarting in ${delay} ms`);
    slot.restartTimer = setTimeout(() => this.fork(slot), delay);
  }

  /** Drains every process; resolves with the exit code (0: all ended within the drain timeout plus the margin). */
  private stop(): Promise<number> {
    return (this.stopped ??= this.drainAll());
  }

  private async drainAll(): Promise<number> {
    this.stopping = true;
    for (const s of this.slots) {
      if (s.restartTimer) clearTimeout(s.restartTimer);
      s.restartTimer = null;
    }
    const exited = new Promise<void>((res) => (this.allExited = res));
    for (const s of this.alive()) {
      // A worker whose handlers are attached drains on the message (idempotent: it may also have had
      // the terminal's SIGINT); one still loading its modules has nothing to drain and ends on SIGTERM.
      if (s.hello) s.worker!.send({ slabserve: 'drain' }, undefined, () => {});
      else s.worker!.process.kill('SIGTERM');
    }
    if (this.alive().length === 0) return 0;
    const limit = this.config.drainTimeoutMs + DRAIN_MARGIN_MS;
    if (await settlesWithin(exited, limit)) return 0;
    for (const s of this.alive()) {
      this.log(`slabserve: cluster: process ${s.plan.index} (pid ${s.pid}) still running ${limit} ms after the drain began; killing it`);
      s.worker!.process.kill('SIGKILL');
    }
    await settlesWithin(exited, 2_000);
    return 1;
  }
}
