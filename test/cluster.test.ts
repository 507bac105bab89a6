/**
 * The cluster of processes (src/main/cluster/cluster.ts) end to end: the built CLI
 * (`slabserve serve --processes 2`) as a child process, two real server
 * processes on one port, real keep-alive sockets.
 *
 * Which process answered a connection: uWS accepts each connection in one
 * process, so its socket's inode is in that process's /proc/<pid>/fd; the
 * connection's inode is in /proc/net/tcp (server port, client port). Linux only.
 */
import * as grpc from '@grpc/grpc-js';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, readlinkSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { loadModelSpec } from '../dist/src/shared/model-format/model-config.js';
import { portOutsideEphemeral } from './cli-process.js';
import { grpcJsPackages, unaryCall } from './fixtures/grpc-js-client.js';
import { parseMetrics, type Metrics } from './fixtures/http-client.js';
import { makeRandom, maxAbsDiff, modelsDir, PlainReference, randomTexts, sleep, vocabularyWords } from './helpers.js';

const CLI = fileURLToPath(new URL('../dist/src/cli.js', import.meta.url));
const TEI_PROTO = fileURLToPath(new URL('../proto/tei.proto', import.meta.url));

// ------------------------------------------------------------------ a keep-alive connection

interface Answer {
  status: number;
  body: string;
}

/** One keep-alive HTTP/1.1 connection, one request at a time; rejects when the connection fails. */
class Connection {
  private buf = Buffer.alloc(0);
  private waiter: { resolve: (a: Answer) => void; reject: (e: Error) => void } | null = null;
  private failure: Error | null = null;

  private constructor(readonly socket: net.Socket) {
    socket.on('data', (d: Buffer) => {
      this.buf = Buffer.concat([this.buf, d]);
      this.parse();
    });
    const fail = (e?: Error) => {
      this.failure ??= e ?? new Error('connection closed by the server');
      this.waiter?.reject(this.failure);
      this.waiter = null;
    };
    socket.on('error', fail);
    socket.on('close', () => fail());
  }

  static open(port: number): Promise<Connection> {
    return new Promise((resolve, reject) => {
      const s = net.connect(port, '127.0.0.1', () => resolve(new Connection(s)));
      s.once('error', reject);
    });
  }

  get localPort(): number {
    return this.socket.localPort!;
  }

  private parse(): void {
    const end = this.buf.indexOf('\r\n\r\n');
    if (end === -1 || !this.waiter) return;
    const head = this.buf.subarray(0, end).toString('latin1').split('\r\n');
    const length = Number(/\r\ncontent-length:\s*(\d+)/i.exec(this.buf.subarray(0, end + 2).toString('latin1'))?.[1] ?? NaN);
    if (!Number.isFinite(length)) {
      this.waiter.reject(new Error(`response without Content-Length: ${head.join(' | ')}`));
      this.waiter = null;
      return;
    }
    if (this.buf.length < end + 4 + length) return;
    const answer = { status: Number(head[0]!.split(' ')[1]), body: this.buf.subarray(end + 4, end + 4 + length).toString('utf8') };
    this.buf = this.buf.subarray(end + 4 + length);
    const w = this.waiter;
    this.waiter = null;
    w.resolve(answer);
  }

  request(method: string, path: string, body?: unknown): Promise<Answer> {
    if (this.failure) return Promise.reject(this.failure);
    const payload = body === undefined ? '' : JSON.stringify(body);
    const head = `${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n${body === undefined ? '' : 'Content-Type: application/json\r\n'}Content-Length: ${Buffer.byteLength(payload)}\r\n\r\n`;
    return new Promise<Answer>((resolve, reject) => {
      this.waiter = { resolve, reject };
      this.socket.write(head + payload);
    });
  }

  close(): void {
    this.socket.destroy();
  }
}

/** The inodes of /proc/net/tcp's sockets that `match` their fields (local address, remote address, state). */
function tcpInodes(match: (local: string, remote: string, state: string) => boolean): Set<string> {
  const inodes = new Set<string>();
  for (const line of readFileSync('/proc/net/tcp', 'utf8').split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length > 9 && f[9] !== '0' && match(f[1]!, f[2]!, f[3]!)) inodes.add(f[9]!);
  }
  return inodes;
}

const hexPort = (p: number) => ':' + p.toString(16).toUpperCase().padStart(4, '0');

/** Whether process `pid` holds one of the sockets `inodes`. */
function holdsSocket(pid: number, inodes: Set<string>): boolean {
  let fds: string[] = [];
  try {
    fds = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return false;
  }
  for (const fd of fds) {
    try {
      const link = readlinkSync(`/proc/${pid}/fd/${fd}`);
      if (link.startsWith('socket:[') && inodes.has(link.slice(8, -1))) return true;
    } catch {
      // closed meanwhile
    }
  }
  return false;
}

/** The server process holding the accepted end of the connection from `clientPort` (null if not accepted yet). */
function serverPidOf(serverPort: number, clientPort: number, pids: number[]): number | null {
  const inodes = tcpInodes((local, remote) => local.endsWith(hexPort(serverPort)) && remote.endsWith(hexPort(clientPort)));
  if (inodes.size === 0) return null;
  return pids.find((pid) => holdsSocket(pid, inodes)) ?? null;
}

/** The processes among `pids` holding a socket that listens on `port` (TCP state 0A). */
function listenersOn(port: number, pids: number[]): number[] {
  const inodes = tcpInodes((local, _remote, state) => local.endsWith(hexPort(port)) && state === '0A');
  return pids.filter((pid) => holdsSocket(pid, inodes));
}

/** A process's start time (clock ticks after boot, /proc/PID/stat field 22): with its pid, which process it is. */
function startTime(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19] ?? null;
  } catch {
    return null;
  }
}

/** When each process of the cluster started, recorded as it announced itself (seen()). */
const startTimes = new Map<number, string | null>();

/** A cluster process announced itself: remember it by pid and start time. */
function seen(pid: number): void {
  if (!startTimes.has(pid)) startTimes.set(pid, startTime(pid));
  everyPid.add(pid);
}

/**
 * Whether `pid` is still a live slabserve process of this test: not gone, not a zombie, and not a
 * reused pid. pids wrap at 32768 here, and other test files start `cli.js serve` processes all the
 * time: a pid seen earlier must still have the start time it had then (SIGKILL to a reused pid
 * once killed another file's server in the middle of its drain), and its command line `marker`.
 */
function alive(pid: number, marker = 'cli.js'): boolean {
  if (!existsSync(`/proc/${pid}`)) return false;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const state = stat.slice(stat.lastIndexOf(')') + 2)[0];
    if (startTimes.has(pid) && startTimes.get(pid) !== startTime(pid)) return false;
    return state !== 'Z' && readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(marker);
  } catch {
    return false;
  }
}

// ------------------------------------------------------------------ the cluster under test

let primary: ChildProcess;
let stderr = '';
let port = 0;
let grpcPort = 0;
/** Worker pid by process index, as the primary logs them (latest first start or restart). */
const pidOf = new Map<number, number>();
const everyPid = new Set<number>();
let exited: Promise<{ code: number | null; signal: string | null }>;
let texts: () => string[];
/** The independent reference: tiny-embed's unmodified graph, one text alone, mean-pooled and normalised by the test. */
let embedRef: PlainReference;
let tok: TextTokenizer;

const TOLERANCE = 1e-5;

/** The largest difference between the rows of an /embed answer and the reference's for its texts (Infinity if the count differs). */
async function worstRow(sent: string[], body: string): Promise<number> {
  const rows = JSON.parse(body) as number[][];
  if (rows.length !== sent.length) return Infinity;
  let worst = 0;
  for (const [i, t] of sent.entries()) worst = Math.max(worst, maxAbsDiff(rows[i]!, await embedRef.embedding(tok.encode(t, { maxLength: 512, truncate: false }).ids)));
  return worst;
}

/** Waits for a line of the primary's log (its own and its workers') matching `re`, after `from` characters. */
async function logLine(re: RegExp, from = 0, limitMs = 60_000): Promise<RegExpExecArray> {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const m = re.exec(stderr.slice(from));
    if (m) return m;
    if (Date.now() > deadline || primary.exitCode !== null) throw new Error(`never logged ${re}; log:\n${stderr.slice(-3000)}`);
    await sleep(20);
  }
}

/** Opens connections until each of `pids` holds at least `each` of them (the kernel spreads them by hash). */
async function connectionsTo(pids: number[], each: number): Promise<Map<number, Connection[]>> {
  const by = new Map<number, Connection[]>(pids.map((p) => [p, []]));
  for (let tries = 0; tries < 200 && [...by.values()].some((c) => c.length < each); tries++) {
    const c = await Connection.open(port);
    expect((await c.request('GET', '/livez')).status).toBe(200); // answered: accepted by some process
    const pid = serverPidOf(port, c.localPort, [...everyPid]);
    const list = pid === null ? undefined : by.get(pid);
    if (list && list.length < each) list.push(c);
    else c.close();
  }
  for (const [pid, list] of by) expect(list.length, `connections to pid ${pid}`).toBe(each);
  return by;
}

async function scrape(): Promise<Metrics> {
  const c = await Connection.open(port);
  try {
    const r = await c.request('GET', '/metrics');
    expect(r.status).toBe(200);
    return parseMetrics(r.body);
  } finally {
    c.close();
  }
}

describe('a cluster of two CPU processes on one port (serve --processes 2)', () => {
  beforeAll(async () => {
    const spec = loadModelSpec(join(modelsDir, 'tiny-embed'), 'tiny-embed');
    const rand = makeRandom('cluster');
    const words = vocabularyWords(spec);
    texts = () => randomTexts(rand, words, 1 + Math.floor(rand() * 3), 12);
    embedRef = await PlainReference.open('tiny-embed');
    tok = await loadTokenizer(spec.tokenizerPath);
    grpcPort = await portOutsideEphemeral();

    primary = spawn(
      process.execPath,
      [CLI, 'serve', '--processes', '2', '--port', '0', '--grpc-port', String(grpcPort), '--host', '127.0.0.1', '--model', 'tiny-embed', '--drain-timeout-ms', '5000', '--slots-per-model', '256'],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    exited = new Promise((resolve) => primary.once('exit', (code, signal) => resolve({ code, signal })));
    primary.stderr!.on('data', (d: Buffer) => {
      stderr += d;
      for (const m of stderr.matchAll(/cluster: process (\d+) \([^)]*\) started, pid (\d+)/g)) {
        pidOf.set(Number(m[1]), Number(m[2]));
        seen(Number(m[2]));
      }
    });
    port = Number((await logLine(/cluster: 2 processes \(cpu, cpu\) on http:\/\/127\.0\.0\.1:(\d+)/))[1]);
    await logLine(/cluster: ready at /);
  });

  afterAll(async () => {
    if (primary && primary.exitCode === null && primary.signalCode === null) primary.kill('SIGKILL');
    for (const pid of everyPid) if (alive(pid)) process.kill(pid, 'SIGKILL');
    await embedRef?.close();
  });

  it('both processes answer, and /metrics sums their requests', async () => {
    const pids = [pidOf.get(0)!, pidOf.get(1)!];
    expect(new Set(pids).size).toBe(2);
    const by = await connectionsTo(pids, 2);
    let inputs = 0;
    let requests = 0;
    const worst = new Map<number, number>();
    for (const [pid, conns] of by) {
      for (const c of conns) {
        for (let k = 0; k < 3; k++) {
          const t = texts();
          const r = await c.request('POST', '/embed', { inputs: t });
          expect(r.status, `pid ${pid}: ${r.body}`).toBe(200);
          // Each process's rows: the reference's, not merely 128 numbers each.
          worst.set(pid, Math.max(worst.get(pid) ?? 0, await worstRow(t, r.body)));
          inputs += t.length;
          requests++;
        }
        c.close();
      }
    }
    console.log(`cluster rows: worst difference from the reference by pid ${JSON.stringify(Object.fromEntries(worst))}`);
    for (const [pid, d] of worst) expect(d, `pid ${pid}`).toBeLessThan(TOLERANCE);
    const m = await scrape();
    // Summed across both processes: each served some of them.
    expect(m.sum('slabserve_request_inputs_total', { model: 'tiny-embed', route: '/embed' })).toBe(inputs);
    expect(m.sum('slabserve_request_duration_seconds_count', { route: '/embed', status: '200' })).toBe(requests);
    // Per-process gauges carry the process index instead of being summed.
    expect(m.sum('slabserve_ready', { process: '0' })).toBe(1);
    expect(m.sum('slabserve_ready', { process: '1' })).toBe(1);
    expect(m.sum('slabserve_cluster_processes')).toBe(2);
    expect(m.sum('slabserve_cluster_processes_ready')).toBe(2);
    expect(m.sum('slabserve_cluster_scrape_missing_processes')).toBe(0);
    expect(m.sum('slabserve_slots', { model: 'tiny-embed' })).toBe(2 * 256);
    expect(m.sum('slabserve_slots_in_use')).toBe(0);
  });

  it('every process serves gRPC on the one --grpc-port: each holds its own listen socket on it (SO_REUSEPORT), and calls get the reference rows', async () => {
    const pids = [pidOf.get(0)!, pidOf.get(1)!];
    expect(listenersOn(grpcPort, pids).sort()).toEqual([...pids].sort());
    const loaded = grpcJsPackages(TEI_PROTO);
    for (let i = 0; i < 4; i++) {
      // A channel, and so a connection, of its own each time: the kernel picks the process.
      const client = new loaded.tei.v1.Embed(`127.0.0.1:${grpcPort}`, grpc.credentials.createInsecure(), { 'grpc.use_local_subchannel_pool': 1 });
      const sent = [texts()[0]!];
      try {
        const reply = (await unaryCall(client, 'Embed', { inputs: sent[0] })) as { embeddings: number[] };
        expect(await worstRow(sent, JSON.stringify([reply.embeddings]))).toBeLessThan(TOLERANCE);
      } finally {
        client.close();
      }
    }
  });

  let killedIndex = -1;
  let killedAt = 0;

  it('SIGKILL of one process under load loses no request of the other', async () => {
    const [victim, survivor] = [pidOf.get(0)!, pidOf.get(1)!];
    killedIndex = 0;
    const by = await connectionsTo([victim, survivor], 4);
    type Tally = { pid: number; statuses: number[]; afterKill: number; error: string | null; answered: { sent: string[]; body: string }[] };
    const tallies: Tally[] = [];
    let stop = false;
    let killed = false;
    const loops = [...by].flatMap(([pid, conns]) =>
      conns.map(async (c) => {
        const t: Tally = { pid, statuses: [], afterKill: 0, error: null, answered: [] };
        tallies.push(t);
        while (!stop) {
          try {
            const sent = texts();
            const r = await c.request('POST', '/embed', { inputs: sent });
            t.statuses.push(r.status);
            if (r.status === 200) t.answered.push({ sent, body: r.body });
            if (killed) t.afterKill++;
          } catch (err) {
            t.error = (err as Error).message;
            break;
          }
        }
        c.close();
      }),
    );
    const bounded = async (what: string, ok: () => boolean) => {
      const deadline = Date.now() + 20_000;
      while (!ok()) {
        if (Date.now() > deadline) throw new Error(`${what}: never; ${JSON.stringify(tallies.map((t) => ({ ...t, statuses: t.statuses.length, answered: t.answered.length })))}`);
        await sleep(20);
      }
    };
    await bounded('every connection served under load', () => tallies.length === loops.length && tallies.every((t) => t.statuses.length >= 3));
    killedAt = stderr.length;
    process.kill(victim, 'SIGKILL');
    killed = true;
    await bounded('the survivor kept serving after the kill', () =>
      tallies.every((t) => (t.pid === victim ? t.error !== null : t.afterKill >= 10)),
    );
    stop = true;
    await Promise.all(loops);

    const onSurvivor = tallies.filter((t) => t.pid === survivor);
    const onVictim = tallies.filter((t) => t.pid === victim);
    const failedOnVictim = onVictim.filter((t) => t.error !== null).length;
    console.log(
      `cluster kill: survivor answered ${onSurvivor.reduce((s, t) => s + t.statuses.length, 0)} requests (${onSurvivor.reduce((s, t) => s + t.afterKill, 0)} after the kill); ` +
        `the killed process answered ${onVictim.reduce((s, t) => s + t.statuses.length, 0)} before it died, and its ${failedOnVictim} connections failed`,
    );
    // Every request on the surviving process's connections was answered 200, during the kill too.
    for (const t of onSurvivor) {
      expect(t.error, `survivor connection failed`).toBeNull();
      expect(t.statuses.every((s) => s === 200), `statuses ${t.statuses.filter((s) => s !== 200)}`).toBe(true);
      expect(t.afterKill).toBeGreaterThanOrEqual(10);
    }
    // The killed process's connections end with a connection error; what they got before was 200.
    for (const t of onVictim) {
      expect(t.error).not.toBeNull();
      expect(t.statuses.every((s) => s === 200)).toBe(true);
    }
    // Every answer, of either process, before and after the kill: the reference's rows.
    let worst = 0;
    let checked = 0;
    for (const t of tallies) {
      for (const a of t.answered) {
        worst = Math.max(worst, await worstRow(a.sent, a.body));
        checked++;
      }
    }
    console.log(`cluster kill: ${checked} answers checked against the reference, worst difference ${worst.toExponential(2)}`);
    expect(checked).toBe(tallies.reduce((s, t) => s + t.statuses.length, 0));
    expect(worst).toBeLessThan(TOLERANCE);
  });

  it('the primary restarts the killed process, which turns ready again', async () => {
    expect(killedIndex).toBe(0);
    await logLine(new RegExp(`cluster: process ${killedIndex} \\(cpu, pid \\d+\\) exited unexpectedly \\(signal SIGKILL\\); restarting in \\d+ ms`), killedAt);
    const started = await logLine(new RegExp(`cluster: process ${killedIndex} \\(cpu\\) started, pid (\\d+)`), killedAt);
    const fresh = Number(started[1]);
    await logLine(new RegExp(`cluster: process ${killedIndex} \\(pid ${fresh}\\) ready again`), killedAt);
    // A connection the kernel hands to the new process: ready and serving.
    const by = await connectionsTo([fresh], 1);
    const c = by.get(fresh)![0]!;
    expect((await c.request('GET', '/readyz')).status).toBe(200);
    const sent = texts();
    const back = await c.request('POST', '/embed', { inputs: sent });
    expect(back.status).toBe(200);
    expect(await worstRow(sent, back.body)).toBeLessThan(TOLERANCE); // the restarted process's rows are the reference's
    c.close();
    const m = await scrape();
    expect(m.sum('slabserve_cluster_restarts_total', { process: String(killedIndex) })).toBe(1);
    expect(m.sum('slabserve_cluster_restarts_total', { process: '1' })).toBe(0);
    expect(m.sum('slabserve_cluster_processes_ready')).toBe(2);
    expect(m.sum('slabserve_ready', { process: String(killedIndex) })).toBe(1);
  });

  it('SIGTERM to the primary drains every process and exits 0, leaving none behind', async () => {
    expect(everyPid.size).toBe(3); // two first starts and the restart
    const live = [...everyPid].filter(alive);
    expect(live.length).toBe(2);
    primary.kill('SIGTERM');
    const outcome = await Promise.race([exited, sleep(40_000).then(() => ({ code: -1, signal: 'still running after 40 s' }))]);
    expect(outcome, stderr.slice(-2000)).toEqual({ code: 0, signal: null });
    expect(stderr).toMatch(/cluster: stopped/);
    expect([...everyPid].filter(alive)).toEqual([]);
  });
});

describe('cluster start-up failures', () => {
  const run = (args: string[], limitMs = 60_000): Promise<{ code: number | null; stderr: string }> =>
    new Promise((resolve) => {
      const child = spawn(process.execPath, [CLI, 'serve', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
      let err = '';
      child.stderr!.on('data', (d: Buffer) => (err += d));
      const timer = setTimeout(() => child.kill('SIGKILL'), limitMs);
      child.on('exit', (code) => {
        clearTimeout(timer);
        resolve({ code, stderr: err });
      });
    });

  it('contradicting flags fail at once with a clear message, starting nothing', async () => {
    const [mismatch, bad, both] = await Promise.all([
      run(['--processes', '3', '--devices', 'cpu,cpu']),
      run(['--devices', 'cpu,gpu:1']),
      run(['--devices', 'cpu', '--device', 'cpu']),
    ]);
    expect(mismatch.code).toBe(1);
    expect(mismatch.stderr).toMatch(/--processes 3 does not match --devices \(2 entries\)/);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/--devices: invalid device "gpu:1"/);
    expect(both.code).toBe(1);
    expect(both.stderr).toMatch(/--devices and --device cpu do not go together/);
    for (const o of [mismatch, bad, both]) expect(o.stderr).not.toMatch(/started, pid/);
  });

  it('a taken port stops the cluster before any process starts: exit 1, the port named', async () => {
    const taken = net.createServer();
    await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
    const busy = (taken.address() as net.AddressInfo).port;
    try {
      const o = await run(['--processes', '2', '--host', '127.0.0.1', '--port', String(busy), '--model', 'tiny-embed', '--max-batch-size', '4']);
      expect(o.code, o.stderr.slice(-2000)).toBe(1);
      expect(o.stderr).toMatch(new RegExp(`127\\.0\\.0\\.1:${busy} is in use .*choose another --port`));
      expect(o.stderr).not.toMatch(/started, pid/);
    } finally {
      taken.close();
    }
  });

  it('a process whose first start fails (a bad model folder) stops the cluster: exit 1, no process left', async () => {
    const o = await run(['--processes', '2', '--host', '127.0.0.1', '--port', '0', '--model', join(tmpdir(), 'slabserve-no-such-model'), '--max-batch-size', '4']);
    expect(o.code, o.stderr.slice(-2000)).toBe(1);
    expect(o.stderr).toMatch(/cluster: process \d \(cpu\) failed to start \(exit code 1\); stopping the cluster/);
    const pids = [...o.stderr.matchAll(/started, pid (\d+)/g)].map((m) => Number(m[1]));
    expect(pids.length).toBeGreaterThan(0);
    expect(pids.filter((pid) => alive(pid, 'slabserve-no-such-model'))).toEqual([]); // its own command line: its pids may be reused by now
  });
});
