/**
 * A slabserve server in a child process (`node dist/src/cli.js serve`), as the
 * suite runs it, and its /metrics counters.
 *
 * Why a child process for the server: client and server CPU are then measured
 * apart (process.cpuUsage() in the bench, /proc/<pid>/stat here), the server runs
 * exactly as `slabserve serve` does with the CLI's defaults, and the client's
 * event loop and GC share nothing with the server's main thread.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import http from 'node:http';


export interface ServerCounters {
  batches: number;
  rows: number;
  /** Summed session.run seconds (slabserve_batch_duration_seconds_sum). */
  runSeconds: number;
  realTokens: number;
  paddedTokens: number;
  /** slabserve_batch_size histogram: upper bound (`le`, "+Inf" as Infinity) -> cumulative batches. */
  batchSizeLe: Map<number, number>;
  /** CPU seconds per thread of the server (slabserve_thread_cpu_seconds_total: main, gateway-N, inference, onnxruntime, other). */
  threadCpuS: Map<string, number>;
}

/** `slabserve serve` in a child process; stop() drains it (close every load client first). */
export interface ServerProcess extends ChildServer {
  /** Where its gRPC listens (null: off). */
  grpcPort: number | null;
  /** Process CPU time (all threads), ms; null where /proc is missing. */
  cpuMs(): number | null;
  /** Counters of one model from /metrics (one request with Connection: close, so no connection lingers). */
  counters(model: string): Promise<ServerCounters>;
}

export interface ServerOptions {
  cliPath: string;
  args: string[];
  /** Ms to wait for `ready at`. */
  startTimeoutMs?: number;
  /** Variables set for the server beside the bench's own (those named SLABSERVE_* are never passed on). */
  env?: Record<string, string>;
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

/** A server in a child process: where it listens, and how to stop it. */
export interface ChildServer {
  readonly pid: number;
  readonly origin: string;
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
  const env = { ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SLABSERVE_'))), ...opts.env };
  // The benches measure the device path: their workloads repeat texts, which the result cache
  // (on by default) would answer instead. Off unless a bench sets --cache-mb itself.
  const args = opts.args.includes('--cache-mb') ? opts.args : [...opts.args, '--cache-mb', '0'];
  let port: number | null = null;
  let grpcPort: number | null = null;
  const child = await startChildServer({
    args: [opts.cliPath, 'serve', ...args],
    env,
    stream: 'stderr',
    // the port from the `listening on` line, ready at the `ready at` line
    ready: (line) => {
      const m = /listening on http:\/\/[^\s:]+:(\d+)/.exec(line);
      if (m) port = Number(m[1]);
      grpcPort ??= Number(/grpc on [^\s:]+:(\d+)/.exec(line)?.[1]) || null;
      return /ready at /.test(line) && port !== null ? `http://127.0.0.1:${port}` : null;
    },
    startTimeoutMs: opts.startTimeoutMs ?? 60_000,
    what: `slabserve serve ${args.join(' ')}`,
  });
  return {
    ...child,
    grpcPort,
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
  const out: ServerCounters = { batches: 0, rows: 0, runSeconds: 0, realTokens: 0, paddedTokens: 0, batchSizeLe: new Map(), threadCpuS: new Map() };
  for (const line of text.split('\n')) {
    if (!line.startsWith('slabserve_')) continue;
    const m = /^(\w+)(?:\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const [, name, labelText = '', value] = m;
    const labels = Object.fromEntries([...labelText.matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1]!, x[2]!]));
    const v = Number(value);
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
