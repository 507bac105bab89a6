/**
 * The suite's load generator: closed or open loop, over HTTP keep-alive or
 * WebSocket, against anything that speaks slabserve's `POST /embed`
 * (bench/README.md, "Load generator"). An open loop sends each request at its
 * scheduled time and counts its latency from then, so a stalled server is not
 * under-reported (coordinated omission). Only the measured window counts:
 * closed loop, the answers inside it; open loop, the arrivals scheduled in it.
 * HTTP closed loops run on wrk where it is installed (bench/wrk.ts): the Node
 * client's CPU per request would be taken from the server's cores.
 */
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import hdr, { type Histogram } from 'hdr-histogram-js';
import { pack, unpack } from 'msgpackr';
import type WebSocket from 'ws';
import type { ServerCounters } from './server-process.js';
import type { PhaseResult } from './suite-results.js';
import { NODE_GENERATOR_COST, wrkInstalled, wrkWorkload, type WrkWorkloadRun } from './wrk.js';
import { closeSocket, openSocket, type WsAnswer } from './ws-load.js';
import { arrivalTimes, type Bursts } from './arrivals.js';
import { requestInputs, requestSize, type Workload } from './workloads.js';

/** A server under load: where it listens, its CPU, and (slabserve) its counters. */
export interface LoadTarget {
  readonly origin: string;
  cpuMs(): number | null;
  counters?(model: string): Promise<ServerCounters>;
}

export type Arrivals = { kind: 'closed'; concurrency: number } | { kind: 'open'; ratePerS: number; bursts?: Bursts };

export interface LoadSpec {
  target: LoadTarget;
  model: string;
  transport: 'http' | 'ws';
  workload: Workload;
  arrivals: Arrivals;
  warmupMs: number;
  durationMs: number;
  /** Open loop: HTTP connections, or WebSocket sockets. Default 256 HTTP, 4 WS. */
  connections?: number;
  /** HTTP closed loops: wrk, the Node generator, or (default) wrk where it is installed. */
  generator?: GeneratorChoice;
  /** HTTP closed loops on wrk only: a fresh W3C traceparent on every request, this share of them sampled. */
  traceparent?: number;
  /** Called about every 250 ms. */
  onProgress?(p: Progress): void;
}

export interface Progress {
  elapsedMs: number;
  totalMs: number;
  answered: number;
  rejected: number;
  errors: number;
}

/** What sent the load: wrk (HTTP closed loops where installed) or this process (the Node generator). */
export type Generator = 'wrk' | 'node';
/** What a bench asks for (--load-generator): a generator, or `auto`, wrk where it is installed. */
export type GeneratorChoice = 'auto' | Generator;

/** What a load loop measures around its window; the counters only where the server has them (slabserve). */
interface WindowMeasures {
  /** This process's CPU ms over the window. */
  clientCpuMs: number;
  /** Server process CPU ms over the window (null without /proc). */
  serverCpuMs: number | null;
  before?: ServerCounters;
  after?: ServerCounters;
  /** Ms between the midpoints of the two /metrics scrapes: the window the counter deltas cover. */
  countersMs: number;
}

/** The counts as a phase record has them (requests: answered 200, counted as the module header says). */
export interface LoadOutcome extends WindowMeasures, Pick<PhaseResult, 'requests' | 'inputs' | 'tokens' | 'rejected' | 'errors' | 'firstError'> {
  generator: Generator;
  windowMs: number;
  /** Latencies of the answered requests, microseconds. The caller destroys it. */
  histogram: Histogram;
}

type Outcome = 'ok' | 'rejected' | string;

/** Sends request i of the workload and says how it ended. */
interface Channel {
  send(i: number): Promise<Outcome>;
  close(): Promise<void>;
}

const sleep = (ms: number) => new Promise<void>((res) => setTimeout(res, ms));
/** Per request: an unanswered request counts as an error after it. */
const TIMEOUT_MS = 10_000;
/** Open loop: requests outstanding beyond which new arrivals are dropped (and counted as errors). */
const MAX_OUTSTANDING = 4096;

export function newHistogram(): Histogram {
  return hdr.build({ numberOfSignificantValueDigits: 3, lowestDiscernibleValue: 1 });
}

// ---------------------------------------------------------------- transports

/**
 * node:http with a keep-alive Agent, one socket per connection. Not the global
 * fetch (undici): it cost several times node:http's client CPU per request,
 * CPU the server under test shares on 2 cores.
 */
function httpChannel(origin: string, connections: number, w: Workload): Channel {
  const agent = new http.Agent({ keepAlive: true, maxSockets: connections, maxFreeSockets: connections });
  const url = new URL(origin);
  const headers = { 'content-type': 'application/json', accept: 'application/json' };
  const post = (body: Buffer) =>
    new Promise<{ status: number; body: Buffer }>((resolve, reject) => {
      const req = http.request({ host: url.hostname, port: url.port, path: w.path ?? '/embed', method: 'POST', agent, headers: { ...headers, 'content-length': body.byteLength } }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks) }));
        res.on('error', reject);
      });
      req.setTimeout(TIMEOUT_MS, () => req.destroy(new Error(`no answer in ${TIMEOUT_MS} ms`)));
      req.on('error', reject);
      req.end(body);
    });
  return {
    send: async (i) => {
      try {
        const r = await post(w.bodies[i]!);
        if (r.status === 200) return 'ok';
        if (r.status === 429 || r.status === 503) return 'rejected';
        return `HTTP ${r.status}: ${r.body.toString('utf8').slice(0, 200)}`;
      } catch (err) {
        return (err as Error).message ?? String(err);
      }
    },
    close: async () => agent.destroy(),
  };
}

/**
 * `sockets` WebSockets, each with `credit` requests in flight at most; requests
 * beyond the credit wait in a local queue (their wait counts in the latency).
 */
async function wsChannel(origin: string, w: Workload, sockets: number, credit: number, timeoutMs: number): Promise<Channel> {
  const open = await Promise.all(Array.from({ length: sockets }, () => openSocket(origin, credit)));
  let nextId = 1;
  let rr = 0;
  const lanes = open.map((ws) => {
    const pending = new Map<number, (o: Outcome) => void>();
    const queue: (() => void)[] = [];
    let inflight = 0;
    ws.on('message', (data: Buffer) => {
      const m = unpack(data) as WsAnswer;
      const done = typeof m.id === 'number' ? pending.get(m.id) : undefined;
      if (!done) return;
      pending.delete(m.id as number);
      inflight--;
      queue.shift()?.();
      if (!m.error) done(Array.isArray(m.result) ? 'ok' : `ws: unexpected result ${JSON.stringify(m).slice(0, 200)}`);
      else if (m.error.type === 'overloaded' || m.error.type === 'unavailable') done('rejected');
      else done(`ws ${m.error.type} ${m.error.code}: ${m.error.message}`);
    });
    const failAll = (why: string) => {
      for (const done of pending.values()) done(why);
      pending.clear();
    };
    ws.on('close', (code) => failAll(`ws: socket closed (code ${code})`));
    ws.on('error', (err) => failAll(`ws: ${err.message}`));
    const send = (i: number): Promise<Outcome> =>
      new Promise((resolve) => {
        const go = () => {
          if (ws.readyState !== ws.OPEN) return resolve('ws: socket not open');
          const id = nextId++;
          inflight++;
          const timer = setTimeout(() => {
            if (pending.delete(id)) {
              inflight--;
              queue.shift()?.();
              resolve(`ws: no answer in ${timeoutMs} ms`);
            }
          }, timeoutMs);
          pending.set(id, (o) => {
            clearTimeout(timer);
            resolve(o);
          });
          ws.send(pack({ id, op: 'embed', inputs: requestInputs(w.requests[i]!, w.form), encoding: 'f32' }));
        };
        if (inflight < credit) go();
        else queue.push(go);
      });
    return { ws, send };
  });
  return {
    send: (i) => lanes[rr++ % lanes.length]!.send(i),
    close: async () => {
      await Promise.all(lanes.map((l) => closeSocket(l.ws as WebSocket)));
    },
  };
}

async function openChannel(spec: LoadSpec, connections: number): Promise<Channel> {
  if (spec.transport === 'http') return httpChannel(spec.target.origin, connections, spec.workload);
  const closed = spec.arrivals.kind === 'closed';
  // closed loop: one socket per 64 callers, each with exactly its callers' share in flight
  const sockets = closed ? Math.max(1, Math.ceil(connections / 64)) : connections;
  const credit = closed ? Math.ceil(connections / sockets) : 256;
  return wsChannel(spec.target.origin, spec.workload, sockets, credit, TIMEOUT_MS);
}

// ---------------------------------------------------------------- the run

/** What one run counts. Every finished request lands here; only those inside the window reach the totals. */
class Tally {
  readonly histogram = newHistogram();
  requests = 0;
  inputs = 0;
  tokens = 0;
  rejected = 0;
  errors = 0;
  firstError: string | undefined;
  /** Answered 200, window or not (for the progress line). */
  answered = 0;

  constructor(private readonly w: Workload) {}

  /** Accounts request i's ending; `counts` says whether it falls in the window. */
  finish(i: number, outcome: Outcome, latencyMs: number, counts: boolean): void {
    if (outcome === 'ok') this.answered++;
    if (!counts) return;
    if (outcome === 'ok') {
      this.histogram.recordValue(Math.max(1, Math.round(latencyMs * 1000)));
      const size = requestSize(this.w, i);
      this.requests++;
      this.inputs += size.inputs;
      this.tokens += size.tokens;
    } else if (outcome === 'rejected') this.rejected++;
    else {
      this.errors++;
      this.firstError ??= outcome;
    }
  }
}

const cpuMs = (u: NodeJS.CpuUsage) => (u.user + u.system) / 1000;

/**
 * The measured window of a run: Infinity at both ends until it opens and closes (a closed loop
 * counts the answers between them). open() scrapes the server's counters, then notes this
 * process's CPU, the server's CPU and the start time; close() ends the window (before the second
 * scrape, so answers during the scrape do not count) and takes them again.
 */
class MeasuredWindow {
  start = Infinity;
  end = Infinity;
  measures: WindowMeasures | undefined;
  private before: { counters: ServerCounters | undefined; at: number; cpu: NodeJS.CpuUsage; serverCpuMs: number | null } | undefined;

  constructor(private readonly spec: Pick<LoadSpec, 'target' | 'model'>) {}

  private async scrape() {
    const t0 = performance.now();
    const counters = this.spec.target.counters ? await this.spec.target.counters(this.spec.model) : undefined;
    return { counters, at: (t0 + performance.now()) / 2 };
  }

  async open(): Promise<void> {
    const scraped = await this.scrape();
    this.before = { ...scraped, cpu: process.cpuUsage(), serverCpuMs: this.spec.target.cpuMs() };
    this.start = performance.now();
  }

  async close(): Promise<WindowMeasures> {
    this.end = performance.now();
    const s1 = this.spec.target.cpuMs();
    const clientCpuMs = cpuMs(process.cpuUsage(this.before!.cpu));
    const { counters: before, at, serverCpuMs: s0 } = this.before!;
    const after = await this.scrape();
    this.measures = {
      clientCpuMs,
      serverCpuMs: s0 !== null && s1 !== null ? s1 - s0 : null,
      ...(before ? { before } : {}),
      ...(after.counters ? { after: after.counters } : {}),
      countersMs: after.at - at,
    };
    return this.measures;
  }
}

/** The state both loops share: what to send next, what was counted, the window. */
interface Run {
  spec: LoadSpec;
  channel: Channel;
  tally: Tally;
  window: MeasuredWindow;
  /** The index of the next request to send (round-robin through the workload). */
  next(): number;
}

/** `callers` closed-loop callers through warm-up and window; returns once every caller has stopped. */
async function closedLoop(run: Run, callers: number): Promise<void> {
  const { spec, channel, tally, window } = run;
  let stop = false;
  const caller = async () => {
    while (!stop) {
      const i = run.next();
      const t0 = performance.now();
      const outcome = await channel.send(i);
      const t1 = performance.now();
      tally.finish(i, outcome, t1 - t0, t1 >= window.start && t1 < window.end);
      if (outcome !== 'ok') await sleep(1); // no hot loop against a refusing server
    }
  };
  const running = Array.from({ length: callers }, caller);
  await sleep(spec.warmupMs);
  await window.open();
  await sleep(spec.durationMs);
  await window.close();
  stop = true;
  await Promise.all(running); // bounded: every request has its timeout
}

/**
 * Calls `send(k, scheduled)` for each arrival at its time (`times`: ms from now, ascending), whatever
 * happened to the earlier ones, and `opening()` once the warm-up is over; returns at `totalMs`.
 * It sleeps, never spins: a busy loop would take CPU from the server on 2 cores (the lag counts in the latency).
 */
export async function sendOnSchedule(times: readonly number[], warmupMs: number, totalMs: number, send: (k: number, scheduled: number) => void, opening: () => void): Promise<void> {
  const t0 = performance.now();
  let opened = false;
  let k = 0;
  for (;;) {
    const now = performance.now() - t0;
    if (!opened && now >= warmupMs) {
      opened = true;
      opening();
    }
    for (; k < times.length && times[k]! <= now; k++) send(k, t0 + times[k]!);
    if (k >= times.length && now >= totalMs) return;
    const next = Math.min(k < times.length ? times[k]! : totalMs, opened ? Infinity : warmupMs);
    await sleep(Math.max(1, next - (performance.now() - t0)));
  }
}

/** Sends each arrival at its scheduled time; returns once the window's arrivals are all answered (or timed out). */
async function openLoop(run: Run, arrivals: Extract<Arrivals, { kind: 'open' }>, r: () => number): Promise<void> {
  const { spec, channel, tally, window } = run;
  const times = arrivalTimes(arrivals.ratePerS, spec.warmupMs + spec.durationMs, r, arrivals.bursts);
  const inFlight = new Set<Promise<void>>();
  let opening: Promise<void> | undefined;
  const send = (k: number, scheduled: number) => {
    const counts = times[k]! >= spec.warmupMs;
    const i = run.next();
    if (inFlight.size >= MAX_OUTSTANDING) return tally.finish(i, `client: ${MAX_OUTSTANDING} requests outstanding, arrival dropped`, 0, counts);
    const p: Promise<void> = channel.send(i).then((outcome) => {
      inFlight.delete(p);
      tally.finish(i, outcome, performance.now() - scheduled, counts);
    });
    inFlight.add(p);
  };
  // the window opens without holding up the arrivals' schedule
  await sendOnSchedule(times, spec.warmupMs, spec.warmupMs + spec.durationMs, send, () => (opening = window.open()));
  await opening;
  await window.close();
  // the window's arrivals are counted when answered, however late (each has its timeout)
  await Promise.all(inFlight);
}

/** Reports progress every 250 ms while the run lasts, with `tally`'s counts so far (clear the timer at its end). */
function progressTimer(spec: LoadSpec, tally: Pick<Tally, 'answered' | 'rejected' | 'errors'>, started: number): ReturnType<typeof setInterval> | undefined {
  if (!spec.onProgress) return undefined;
  const totalMs = spec.warmupMs + spec.durationMs;
  return setInterval(() => {
    const elapsedMs = performance.now() - started;
    spec.onProgress!({ elapsedMs: Math.min(elapsedMs, totalMs), totalMs, answered: tally.answered, rejected: tally.rejected, errors: tally.errors });
  }, 250);
}

function outcome(spec: LoadSpec, tally: Tally, window: MeasuredWindow): LoadOutcome {
  const m = window.measures!; // both loops end their window before returning
  return {
    generator: 'node',
    // open loop: the window is the scheduled span whose arrivals count
    windowMs: spec.arrivals.kind === 'open' ? spec.durationMs : window.end - window.start,
    requests: tally.requests,
    inputs: tally.inputs,
    tokens: tally.tokens,
    rejected: tally.rejected,
    errors: tally.errors,
    ...(tally.firstError !== undefined ? { firstError: tally.firstError } : {}),
    histogram: tally.histogram,
    ...m,
  };
}

/** Runs one load phase (see the module header); `r` draws the starting request, then the open loop's arrivals. */
export async function runLoad(spec: LoadSpec, r: () => number): Promise<LoadOutcome> {
  if (generatorFor(spec) === 'wrk') return wrkLoop(spec, r);
  const connections = spec.arrivals.kind === 'closed' ? spec.arrivals.concurrency : (spec.connections ?? (spec.transport === 'http' ? 256 : 4));
  const channel = await openChannel(spec, connections);
  const w = spec.workload;
  const tally = new Tally(w);
  let cursor = Math.floor(r() * w.requests.length);
  const run: Run = { spec, channel, tally, window: new MeasuredWindow(spec), next: () => cursor++ % w.requests.length };
  const progress = progressTimer(spec, tally, performance.now());
  try {
    if (spec.arrivals.kind === 'closed') await closedLoop(run, connections);
    else await openLoop(run, spec.arrivals, r);
  } finally {
    if (progress) clearInterval(progress);
    await channel.close();
  }
  return outcome(spec, tally, run.window);
}

// ---------------------------------------------------------------- wrk

let warned = false;
let installed: boolean | undefined;

/** wrk for HTTP closed loops where it is installed (or asked for), else the Node generator, with a warning once. */
function generatorFor(spec: LoadSpec): Generator {
  if (spec.transport !== 'http' || spec.arrivals.kind !== 'closed') return 'node';
  const asked = spec.traceparent !== undefined ? 'wrk' : (spec.generator ?? 'auto');
  if (asked === 'node') return 'node';
  if ((installed ??= wrkInstalled())) return 'wrk';
  if (asked === 'wrk') throw new Error('--load-generator wrk: wrk is not installed (apt-get install wrk)');
  if (!warned) process.stderr.write(`bench: wrk is not installed, so ${NODE_GENERATOR_COST}\n`);
  warned = true;
  return 'node';
}

/**
 * An HTTP closed loop on wrk: a warm-up run, then the measured one inside the
 * window (whole seconds: wrk's unit). Inputs and tokens are the requests
 * answered times the workload's mean (wrk sends its bodies in turn, so the
 * mean is what was sent); any status but 2xx counts as an error.
 */
async function wrkLoop(spec: LoadSpec, r: () => number): Promise<LoadOutcome> {
  const connections = (spec.arrivals as Extract<Arrivals, { kind: 'closed' }>).concurrency;
  const w = spec.workload;
  const first = Math.floor(r() * w.bodies.length);
  const opts = { connections, timeoutMs: TIMEOUT_MS, first, path: w.path ?? '/embed', traceparent: spec.traceparent, scriptPath: join(tmpdir(), `slabserve-bench-${process.pid}.lua`) };
  const seconds = (ms: number) => Math.max(1, Math.round(ms / 1000));
  // wrk reports nothing until it ends: the progress is the time alone
  const tick = progressTimer(spec, { answered: 0, rejected: 0, errors: 0 }, performance.now());
  try {
    if (spec.warmupMs > 0) await wrkWorkload(spec.target.origin, w.bodies, { ...opts, seconds: seconds(spec.warmupMs) });
    const window = new MeasuredWindow(spec);
    await window.open();
    const run = await wrkWorkload(spec.target.origin, w.bodies, { ...opts, seconds: seconds(spec.durationMs) });
    return wrkOutcome(w, run, await window.close());
  } finally {
    if (tick) clearInterval(tick);
  }
}

/** A wrk run as the load generator's outcome: no rejections apart (any non-2xx is an error), inputs and tokens from the workload's mean. */
function wrkOutcome(w: Workload, run: WrkWorkloadRun, m: WindowMeasures): LoadOutcome {
  const ok = run.requests - run.non2xx;
  let inputs = 0;
  let tokens = 0;
  for (let i = 0; i < w.requests.length; i++) {
    const size = requestSize(w, i);
    inputs += size.inputs;
    tokens += size.tokens;
  }
  const lost = Object.values(run.socketErrors).reduce((a, b) => a + b, 0);
  const errors = run.non2xx + lost;
  const firstError = run.non2xx ? `wrk: ${run.non2xx} answers were not 2xx` : lost ? `wrk: socket errors ${JSON.stringify(run.socketErrors)}` : undefined;
  return {
    generator: 'wrk',
    windowMs: run.seconds * 1000,
    requests: ok,
    inputs: Math.round((ok * inputs) / w.requests.length),
    tokens: Math.round((ok * tokens) / w.requests.length),
    rejected: 0,
    errors,
    ...(firstError ? { firstError } : {}),
    histogram: histogramOfQuantiles(run.quantilesUs, run.requests),
    ...m,
    // wrk's own CPU, not this process's
    clientCpuMs: run.clientCpuMs,
  };
}

/** An HDR histogram of `count` latencies from their value at every 0.1 percentile (wrk's summary). */
export function histogramOfQuantiles(quantilesUs: number[], count: number): Histogram {
  const h = newHistogram();
  let recorded = 0;
  quantilesUs.forEach((v, k) => {
    // Each 0.1% of the requests at its quantile; rounded up, as the histogram finds a percentile's count.
    const upTo = Math.min(count, Math.ceil((count * (k + 1)) / quantilesUs.length));
    if (upTo > recorded) h.recordValueWithCount(Math.max(1, v), upTo - recorded);
    recorded = upTo;
  });
  return h;
}
