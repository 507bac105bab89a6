/**
 * The gateway threads from the main thread, as src/main/threads/inference-supervisor.ts is for
 * the inference thread: started on one port (uWebSockets.js, SO_REUSEPORT
 * among them), told the server's /info, asked for their metrics and requests
 * in flight, drained and closed. A gateway that dies while serving (an
 * uncaught error: it closes its sockets and ends) is replaced: its slots are
 * released first (src/main/threads/slot-reclaim.ts), and the result-cache entries it held
 * locked, then a new thread takes its listen socket back on the port,
 * retrying with backoff.
 */
import { Worker } from 'node:worker_threads';
import type { Registry } from 'prom-client';
import type { GatewayMessage, GatewayWorkerData } from '../../gateway/thread.js';
import type { GrpcListen } from '../../gateway/grpc/server.js';
import { settlesWithin } from '../../shared/clock.js';
import { RpcPeer } from '../../shared/rpc.js';
import type { ResultCache } from '../../shared/result-cache.js';
import type { ModelSet } from '../repository/model-set.js';
import { freeStuckFilling, reclaimOwner } from './slot-reclaim.js';

type MetricsJson = Awaited<ReturnType<Registry['getMetricsAsJSON']>>;

/** How long a gateway that reported an uncaught error may take to end by itself before it is terminated. */
const GATEWAY_END_MS = 5000;
/** A dead gateway's slot still FILLING after this long is stuck: freed. */
const STUCK_FILLING_MS = 500;
/** How long close() waits for a gateway to end by itself once its sockets are closed. */
const GATEWAY_EXIT_MS = 2000;

interface GatewayHandle {
  worker: Worker;
  rpc: RpcPeer;
  /** Its kernel thread id, once listening (per-thread CPU metrics). */
  tid?: number | null;
  exited: Promise<void>;
  /** Listening: from then on an exit is a death (unless the server is closing). */
  started: boolean;
  /** Its last 'fatal' message (an uncaught error it reported before ending). */
  fatal?: string;
}

export interface GatewaySupervisorOptions {
  /** What every gateway thread starts with, less its id, owner index, port, models and what it serves. */
  data: Omit<GatewayWorkerData, 'gatewayId' | 'owner' | 'port' | 'models' | 'http' | 'grpc'>;
  /**
   * What each serves: the first `http` gateways HTTP (and gRPC too when `grpc.threads` is 0); the
   * `grpc.threads` after them gRPC only. `grpc` null: no gRPC.
   */
  roles: { http: number; grpc: { listen: GrpcListen; threads: number } | null };
  /** The models served now: a gateway starts with the set as it is then. */
  models: ModelSet;
  /** The result cache the gateways share (null: off): a dead gateway's entry locks are freed before its replacement starts. */
  cache: ResultCache | null;
  log: (line: string) => void;
  /** The process's /metrics text, which a gateway asks for when scraped. */
  scrape: () => Promise<string>;
  /** The model repository's operations (index, load, unload), which a gateway asks for when its routes are called. */
  repository: (op: unknown) => Promise<unknown>;
  /** The /info document once the server is ready (undefined before): a replacement gateway is told it. */
  info: () => unknown;
  /** Gateways start under the test-hook entry (SLABSERVE_TEST_HOOKS=1). */
  testHooks: boolean;
  /** Test hook: gateway `gatewayId` starts only once `until` resolves (SLABSERVE_TEST_HOLD_GATEWAY). */
  holdStart?: { gatewayId: number; until: Promise<void> };
  /** A gateway died while serving and is being replaced. */
  onRestart: (reason: 'crash' | 'exit') => void;
}

export class GatewaySupervisor {
  private readonly opts: GatewaySupervisorOptions;
  /** By gateway id; a restarted gateway takes its predecessor's place. */
  private readonly gateways: GatewayHandle[] = [];
  private closing = false;
  /** The port every gateway listens on (known once the first one does). */
  port = 0;

  /** gRPC's port (known once the first gRPC thread listens); null: no gRPC. */
  get grpcPort(): number | null {
    return this.opts.roles.grpc?.listen.port ?? null;
  }

  constructor(opts: GatewaySupervisorOptions) {
    this.opts = opts;
  }

  /**
   * Starts `count` gateways on `port`, the first alone so the others join
   * the port it bound; on failure closes what started and rethrows.
   */
  async start(count: number, port: number): Promise<number> {
    try {
      this.port = await this.startOne(0, port);
      for (let g = 1; g < count; g++) {
        if (this.opts.holdStart?.gatewayId === g) await this.opts.holdStart.until;
        await this.startOne(g, this.port);
      }
      return this.port;
    } catch (err) {
      await this.closeSockets();
      await Promise.all(this.gateways.map((g) => g.worker.terminate()));
      throw err;
    }
  }

  /** Every gateway's answer to `method` (`fallback` where the call fails or times out). */
  callAll<T>(method: string, arg?: unknown, timeoutMs?: number, fallback?: T): Promise<(T | undefined)[]> {
    return Promise.all(this.gateways.map((g) => g.rpc.call<T>(method, arg, timeoutMs).catch(() => fallback)));
  }

  /** `method` on every gateway; rejects with the first failure (a gateway that does not answer in `timeoutMs` fails). */
  callEvery<T>(method: string, arg: unknown, timeoutMs: number): Promise<T[]> {
    return Promise.all(this.gateways.map((g, i) => g.rpc.call<T>(method, arg, timeoutMs).catch((err: Error) => Promise.reject(new Error(`gateway thread ${i}: ${err.message}`)))));
  }

  /** Each gateway's metrics (prom-client JSON); a gateway that does not answer within 2 s is left out. */
  async metrics(): Promise<MetricsJson[]> {
    const parts = await Promise.allSettled(this.gateways.map((g) => g.rpc.call<MetricsJson>('metrics', undefined, 2000)));
    return parts.flatMap((p) => (p.status === 'fulfilled' ? [p.value] : []));
  }

  /** Adds each gateway's kernel thread id and name (`gateway-N`) to `named`. */
  nameThreads(named: Map<number, string>): void {
    this.gateways.forEach((g, i) => {
      if (g.tid) named.set(g.tid, i < this.opts.roles.http ? `gateway-${i}` : `grpc-${i}`);
    });
  }

  /** Makes gateway `gatewayId` throw an uncaught error (test hooks). */
  fault(gatewayId: number): void {
    const g = this.gateways[gatewayId];
    if (!g) throw new RangeError(`no gateway thread ${gatewayId}`);
    g.worker.postMessage({ slabserveTestFault: 'throw' });
  }

  /** From now on a gateway that ends is not replaced (the server is draining). */
  beginClose(): void {
    this.closing = true;
  }

  /** Closes every gateway's listen socket and connections (uWS aborts the process if a thread ends holding one). */
  async closeSockets(): Promise<void> {
    this.closing = true;
    await this.callAll('close');
  }

  /** After closeSockets(): waits for each gateway to end by itself, terminating one that does not. */
  async awaitEnd(): Promise<void> {
    await Promise.all(
      this.gateways.map((g) => settlesWithin(g.exited, GATEWAY_EXIT_MS).then(() => g.worker.terminate())),
    );
  }

  /** What gateway `gatewayId` serves (GatewaySupervisorOptions.roles). */
  private roleOf(gatewayId: number): Pick<GatewayWorkerData, 'http' | 'grpc'> {
    const { http, grpc } = this.opts.roles;
    const servesHttp = gatewayId < http;
    const servesGrpc = grpc !== null && (grpc.threads === 0 || !servesHttp);
    return { http: servesHttp, ...(servesGrpc ? { grpc: grpc.listen } : {}) };
  }

  /** Starts gateway `gatewayId` on `port`; resolves with the port it listens on. */
  private startOne(gatewayId: number, port: number): Promise<number> {
    const info = this.opts.info(); // known once the server is ready: a replacement starts ready
    const data: GatewayWorkerData = { ...this.opts.data, ...this.roleOf(gatewayId), models: this.opts.models.serving(), gatewayId, owner: 1 + gatewayId, port, ...(info !== undefined ? { info } : {}) };
    const entry = new URL('../../gateway/thread.js', import.meta.url);
    const name = `slabserve-gateway-${gatewayId}`;
    const worker = this.opts.testHooks ? new Worker(gatewayTestEntry(entry), { eval: true, workerData: data, name }) : new Worker(entry, { workerData: data, name });
    const handle: GatewayHandle = {
      worker,
      rpc: new RpcPeer(worker, { scrape: this.opts.scrape, repository: this.opts.repository }),
      exited: new Promise<void>((res) => worker.once('exit', () => res())),
      started: false,
    };
    this.gateways[gatewayId] = handle; // even if it fails to start: closeSockets() must reach it
    worker.once('exit', () => this.onExit(gatewayId, handle));
    return new Promise((res, rej) => {
      worker.once('error', rej);
      worker.once('exit', (code) => rej(new Error(`gateway ${gatewayId} exited during start-up (code ${code})`)));
      worker.on('message', (m: GatewayMessage) => {
        if (m.type === 'listening') {
          handle.started = true;
          handle.tid = m.tid;
          const grpc = this.opts.roles.grpc;
          // The first gRPC thread bound a port the kernel picked: the others (and replacements) join it.
          if (grpc && grpc.listen.port === 0 && m.grpcPort !== undefined) grpc.listen = { ...grpc.listen, port: m.grpcPort };
          res(m.port);
        } else if (m.type === 'fatal' && handle.started) {
          // It reported an uncaught error and is closing its sockets: it ends by itself; make sure it does.
          handle.fatal = m.message;
          this.opts.log(`slabserve: gateway thread ${gatewayId}: ${m.message.split('\n')[0]}`);
          setTimeout(() => void worker.terminate().catch(() => {}), GATEWAY_END_MS).unref();
        } else if (m.type === 'fatal') rej(new Error(`gateway ${gatewayId}: ${m.message}`));
        else if (m.type === 'log') for (const line of m.lines) this.opts.log(line);
      });
    });
  }

  /** A gateway thread ended while serving: free its slots and start another on the same port. */
  private onExit(gatewayId: number, dead: GatewayHandle): void {
    if (this.closing || !dead.started || this.gateways[gatewayId] !== dead) return;
    const { log } = this.opts;
    const slabs = this.opts.models.slabs;
    const owner = 1 + gatewayId;
    const since = Date.now();
    const reason = dead.fatal !== undefined ? 'crash' : 'exit';
    const r = reclaimOwner(slabs, owner);
    this.opts.cache?.reclaim(owner); // an entry it was writing when it died is usable again
    setTimeout(() => freeStuckFilling(slabs, owner, r.filling), STUCK_FILLING_MS).unref();
    this.opts.onRestart(reason);
    log(
      `slabserve: gateway thread ${gatewayId} ${reason === 'crash' ? 'died of an uncaught error' : 'exited'}; ` +
        `${r.cancelled} of its requests cancelled, ${r.freed} finished slots freed; starting a new one on port ${this.port}`,
    );
    void (async () => {
      for (let attempt = 0; !this.closing; attempt++) {
        try {
          await this.startOne(gatewayId, this.port);
          const info = this.opts.info();
          if (info !== undefined) await this.gateways[gatewayId]!.rpc.call('setInfo', info);
          log(`slabserve: gateway thread ${gatewayId} listening again after ${Date.now() - since} ms`);
          return;
        } catch (err) {
          const wait = Math.min(10_000, 500 * 2 ** attempt);
          log(`slabserve: gateway thread ${gatewayId} failed to start again (${(err as Error).message}); retrying in ${wait} ms`);
          await new Promise((res) => setTimeout(res, wait).unref());
        }
      }
    })();
  }
}

/**
 * Entry of a gateway thread when the test hooks are on: a message
 * {slabserveTestFault: 'throw'} makes it throw an uncaught error; then the
 * gateway's own code runs as usual.
 */
function gatewayTestEntry(url: URL): string {
  return `const { parentPort } = require('node:worker_threads');
parentPort.on('message', (m) => {
  if (m && m.slabserveTestFault === 'throw') setImmediate(() => { throw new Error('slabserve test hook: gateway thread fault'); });
});
import(${JSON.stringify(url.href)});`;
}
