/**
 * The servers of the benches (bench/quick.ts, bench/suite.ts) and what is
 * measured around them: a slabserve server in a child process (`node
 * dist/src/cli.js serve`) and its /metrics counters, the HTTP clients the load
 * generator (bench/load.ts) drives them with, and the measured window.
 *
 * Why a child process for the server: client and server CPU are then measured
 * apart (process.cpuUsage() here, /proc/<pid>/stat there), the server runs
 * exactly as `slabserve serve` does with the CLI's defaults, and the client's
 * event loop and GC share nothing with the server's main thread.
 *
 * Why the client in the bench's main thread (not a worker): during an HTTP
 * phase nothing else runs in this process (the raw sessions and the engines of
 * the other phases sit idle), so the load generator already has an event loop
 * of its own; its CPU and event-loop utilization are reported with each row.
 *
 * Clients (--http-client):
 *   http    node:http with a keep-alive Agent, maxSockets = concurrency (default: built in)
 *   undici  undici's Pool (connections = concurrency, pipelining 1), if the `undici`
 *           package is installed (it is not a dependency yet); cheaper per request than node:http
 *
 * Not the global fetch (Node's bundled undici): on this machine it cost 600-700 us of
 * client CPU per request at 64 clients against node:http's 85-170, and held
 * the server to half the requests/s (bench/README.md).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { performance } from 'node:perf_hooks';

// ---------------------------------------------------------------- server process

export interface ServerCounters {
  batches: number;
  rows: number;
  /** Summed session.run seconds (slabserve_batch_duration_seconds_sum). */
  runSeconds: number;
  realTokens: number;
  paddedTokens: number;
  failures: number;
  /** slabserve_batch_size histogram: upper bound (`le`, "+Inf" as Infinity) -> cumulative batches. */
  batchSizeLe: Map<number, number>;
  /** CPU seconds per thread of the server (slabserve_thread_cpu_seconds_total: main, gateway-N, inference, onnxruntime, other). */
  threadCpuS: Map<string, number>;
}

export interface ServerProcess {
  readonly pid: number;
  readonly origin: string;
  /** The server's `slabserve: ...` start-up lines. */
  readonly startLines: string[];
  /** Process CPU time (all threads), ms; null where /proc is missing. */
  cpuMs(): number | null;
  /** Counters of one model from /metrics (one request with Connection: close, so no connection lingers). */
  counters(model: string): Promise<ServerCounters>;
  /** SIGTERM (drain), then SIGKILL after `graceMs`. Close every load client first. */
  stop(graceMs?: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

export interface ServerOptions {
  cliPath: string;
  args: string[];
  /** Ms to wait for `ready at`. */
  startTimeoutMs?: number;
}

const CLK_TCK = 100; // USER_HZ: 100 on every Linux the bench is meant for

export function procCpuMs(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // fields after the ")" of the command name: state is field 3, utime 14, stime 15
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return ((Number(f[11]) + Number(f[12])) * 1000) / CLK_TCK;
  } catch {
    return null;
  }
}

/** A server in a child process: where it listens, its start-up lines, and how to stop it. */
export interface ChildServer {
  readonly pid: number;
  readonly origin: string;
  readonly startLines: string[];
  /** SIGTERM, then SIGKILL after `graceMs`. */
  stop(graceMs?: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/**
 * Runs `node <args>` and resolves once `ready` recognizes, in the lines of
 * `stream`, the server's origin (it sees each line and may keep state). The
 * child is killed if this process exits, and on a start-up timeout.
 */
export async function startChildServer(opts: {
  args: string[];
  env?: NodeJS.ProcessEnv;
  stream: 'stdout' | 'stderr';
  ready: (line: string) => string | null;
  startTimeoutMs: number;
  what: string;
}): Promise<ChildServer> {
  const stdio: ('ignore' | 'pipe')[] = opts.stream === 'stdout' ? ['ignore', 'pipe', 'pipe'] : ['ignore', 'ignore', 'pipe'];
  const child: ChildProcess = spawn(process.execPath, opts.args, { stdio: stdio as ['ignore', 'pipe', 'pipe'], env: opts.env ?? process.env });
  const kill = () => child.kill('SIGKILL');
  process.once('exit', kill); // never leave a server behind
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((res) => child.once('exit', (code, signal) => res({ code, signal })));
  const lines: string[] = [];
  let pending = '';
  let stderr = '';
  if (opts.stream === 'stdout') child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const out = opts.stream === 'stdout' ? child.stdout! : child.stderr!;
  const origin = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => {
      kill();
      reject(new Error(`${opts.what}: not ready after ${opts.startTimeoutMs} ms\n${lines.join('\n')}\n${pending}${stderr}`));
    }, opts.startTimeoutMs);
    out.setEncoding('utf8');
    out.on('data', (d: string) => {
      pending += d;
      let nl: number;
      while ((nl = pending.indexOf('\n')) >= 0) {
        const line = pending.slice(0, nl);
        pending = pending.slice(nl + 1);
        lines.push(line);
        const found = opts.ready(line);
        if (found) {
          clearTimeout(timer);
          resolve(found);
        }
      }
    });
    void exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`${opts.what} exited during start-up (code ${code}, signal ${signal}):\n${lines.join('\n')}\n${pending}${stderr}`));
    });
  });
  return {
    pid: child.pid!,
    origin,
    startLines: lines,
    stop: async (graceMs = 10_000) => {
      child.kill('SIGTERM');
      const timer = setTimeout(kill, graceMs);
      const r = await exited;
      clearTimeout(timer);
      process.removeListener('exit', kill);
      return r;
    },
  };
}

/** Starts `node <cli> serve <args>` with no SLABSERVE_* variables from this environment; resolves when it is ready. */
export async function startServerProcess(opts: ServerOptions): Promise<ServerProcess> {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SLABSERVE_')));
  let port: number | null = null;
  const child = await startChildServer({
    args: [opts.cliPath, 'serve', ...opts.args],
    env,
    stream: 'stderr',
    // the port from the `listening on` line, ready at the `ready at` line
    ready: (line) => {
      const m = /listening on http:\/\/[^\s:]+:(\d+)/.exec(line);
      if (m) port = Number(m[1]);
      return /ready at /.test(line) && port !== null ? `http://127.0.0.1:${port}` : null;
    },
    startTimeoutMs: opts.startTimeoutMs ?? 60_000,
    what: `slabserve serve ${opts.args.join(' ')}`,
  });
  return {
    ...child,
    cpuMs: () => procCpuMs(child.pid),
    counters: async (model: string) => parseCounters(await getText(`${child.origin}/metrics`), model),
  };
}

/** GET with a fresh connection closed afterwards. */
export function getText(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { agent: false, headers: { connection: 'close' } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => (res.statusCode === 200 ? resolve(body) : reject(new Error(`GET ${url}: ${res.statusCode} ${body}`))));
    });
    req.setTimeout(10_000, () => req.destroy(new Error(`GET ${url}: no answer in 10 s`)));
    req.on('error', reject);
  });
}

/** Sums of the slabserve series the bench needs, for one model (label order does not matter). */
export function parseCounters(text: string, model: string): ServerCounters {
  const out: ServerCounters = { batches: 0, rows: 0, runSeconds: 0, realTokens: 0, paddedTokens: 0, failures: 0, batchSizeLe: new Map(), threadCpuS: new Map() };
  for (const line of text.split('\n')) {
    if (!line.startsWith('slabserve_')) continue;
    const m = /^(\w+)(?:\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const [, name, labelText = '', value] = m;
    const labels = Object.fromEntries([...labelText.matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1]!, x[2]!]));
    const v = Number(value);
    if (name === 'slabserve_request_failures_total') out.failures += v;
    if (name === 'slabserve_thread_cpu_seconds_total') out.threadCpuS.set(labels.thread!, (out.threadCpuS.get(labels.thread!) ?? 0) + v);
    if (labels.model !== model) continue;
    if (name === 'slabserve_batch_size_count') out.batches += v;
    else if (name === 'slabserve_batch_size_bucket') {
      const le = labels.le === '+Inf' ? Infinity : Number(labels.le);
      out.batchSizeLe.set(le, (out.batchSizeLe.get(le) ?? 0) + v);
    }
    else if (name === 'slabserve_batch_size_sum') out.rows += v;
    else if (name === 'slabserve_batch_duration_seconds_sum') out.runSeconds += v;
    else if (name === 'slabserve_tokens_total' && labels.kind === 'real') out.realTokens += v;
    else if (name === 'slabserve_tokens_total' && labels.kind === 'padded') out.paddedTokens += v;
  }
  return out;
}

// ---------------------------------------------------------------- load clients

export type ClientKind = 'http' | 'undici';

export interface LoadClient {
  readonly kind: ClientKind;
  /** POSTs `body` (JSON) to `path`; resolves with the status and the whole response body. Rejects after `timeoutMs`. */
  post(path: string, body: Buffer): Promise<{ status: number; body: Buffer }>;
  /** TCP connections opened so far (null where the client does not say). */
  connections(): number | null;
  /** Closes every connection. */
  close(): Promise<void>;
}

const JSON_HEADERS = { 'content-type': 'application/json', accept: 'application/json' };

function nodeHttpClient(origin: string, connections: number, timeoutMs: number): LoadClient {
  const agent = new http.Agent({ keepAlive: true, maxSockets: connections, maxFreeSockets: connections });
  const url = new URL(origin);
  const sockets = new Set<unknown>();
  return {
    kind: 'http',
    post: (path, body) =>
      new Promise((resolve, reject) => {
        const req = http.request(
          { host: url.hostname, port: url.port, path, method: 'POST', agent, headers: { ...JSON_HEADERS, 'content-length': body.byteLength } },
          (res) => {
            const chunks: Buffer[] = [];
            res.on('data', (c: Buffer) => chunks.push(c));
            res.on('end', () => resolve({ status: res.statusCode ?? 0, body: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks) }));
            res.on('error', reject);
          },
        );
        req.once('socket', (s) => sockets.add(s));
        req.setTimeout(timeoutMs, () => req.destroy(new Error(`no answer in ${timeoutMs} ms`)));
        req.on('error', reject);
        req.end(body);
      }),
    connections: () => sockets.size,
    close: async () => {
      agent.destroy();
      sockets.clear();
    },
  };
}

/** The parts of undici's Pool this file uses (undici is not a dependency: imported by name at run time). */
interface UndiciPool {
  request(opts: { path: string; method: string; body: Buffer; headers: Record<string, string>; headersTimeout: number; bodyTimeout: number }): Promise<{
    statusCode: number;
    body: { arrayBuffer(): Promise<ArrayBuffer> };
  }>;
  on(event: 'connect', fn: () => void): unknown;
  destroy(): Promise<void>;
}

async function undiciClient(origin: string, connections: number, timeoutMs: number): Promise<LoadClient> {
  const name = 'undici';
  let mod: { Pool: new (origin: string, opts: { connections: number; pipelining: number }) => UndiciPool };
  try {
    mod = (await import(name)) as typeof mod;
  } catch {
    throw new Error('--http-client undici: the undici package is not installed (npm i -D undici@6); use --http-client http');
  }
  const pool = new mod.Pool(origin, { connections, pipelining: 1 });
  let opened = 0;
  pool.on('connect', () => opened++);
  return {
    kind: 'undici',
    post: async (path, body) => {
      const r = await pool.request({ path, method: 'POST', body, headers: JSON_HEADERS, headersTimeout: timeoutMs, bodyTimeout: timeoutMs });
      return { status: r.statusCode, body: Buffer.from(await r.body.arrayBuffer()) };
    },
    connections: () => opened,
    close: () => pool.destroy(),
  };
}

export async function createLoadClient(kind: ClientKind, origin: string, connections: number, timeoutMs = 10_000): Promise<LoadClient> {
  if (kind === 'http') return nodeHttpClient(origin, connections, timeoutMs);
  return undiciClient(origin, connections, timeoutMs);
}

// ---------------------------------------------------------------- the measured window

const cpuMs = (u: NodeJS.CpuUsage) => (u.user + u.system) / 1000;

/** A server measured around a window: its CPU, and (slabserve) its counters. */
export interface MeasuredTarget {
  cpuMs(): number | null;
  counters?(model: string): Promise<ServerCounters>;
}

/** What a load loop measures around its window; the counters only where the server has them (slabserve). */
export interface WindowMeasures {
  windowMs: number;
  /** This process's CPU ms and event-loop utilization over the window. */
  clientCpuMs: number;
  clientElu: number;
  /** Server process CPU ms over the window (null without /proc). */
  serverCpuMs: number | null;
  before?: ServerCounters;
  after?: ServerCounters;
  /** Ms between the midpoints of the two /metrics scrapes: the window the counter deltas cover. */
  countersMs: number;
}

/**
 * Opens a measured window now: scrapes the server's counters, then notes this
 * process's CPU and event-loop use, the server's CPU and the start time.
 * close() ends the window (`onEnd` is called at its end, before the second
 * scrape, so answers during the scrape do not count) and takes them again.
 */
export async function openWindow(
  target: MeasuredTarget,
  model: string,
): Promise<{ start: number; close(onEnd?: (end: number) => void): Promise<WindowMeasures> }> {
  const scrape = async () => {
    const t0 = performance.now();
    const c = target.counters ? await target.counters(model) : undefined;
    return { c, at: (t0 + performance.now()) / 2 };
  };
  const before = await scrape();
  const cpu0 = process.cpuUsage();
  const elu0 = performance.eventLoopUtilization();
  const s0 = target.cpuMs();
  const start = performance.now();
  return {
    start,
    close: async (onEnd) => {
      const end = performance.now();
      onEnd?.(end);
      const s1 = target.cpuMs();
      const clientCpuMs = cpuMs(process.cpuUsage(cpu0));
      const clientElu = performance.eventLoopUtilization(elu0).utilization;
      const after = await scrape();
      return {
        windowMs: end - start,
        clientCpuMs,
        clientElu,
        serverCpuMs: s0 !== null && s1 !== null ? s1 - s0 : null,
        ...(before.c ? { before: before.c } : {}),
        ...(after.c ? { after: after.c } : {}),
        countersMs: after.at - before.at,
      };
    },
  };
}
