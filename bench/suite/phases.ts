/**
 * The suite's records, as results.json has them (bench/suite-results.ts): a
 * measured phase from a load outcome or a raw onnxruntime loop, and a
 * side-by-side comparison of two sets of phases. Pure: no I/O, no clock.
 */
import hdr, { type Histogram } from 'hdr-histogram-js';
import type { LoadOutcome } from '../load.js';
import type { RawLoopResult } from '../raw-ort.js';
import type { ServerCounters } from '../server-process.js';
import type { CaseName, Comparison, LatencySummary, PhaseResult, ServerSide } from '../suite-results.js';
import type { ClosedLoopWindow } from '../closed-loop.js';

export const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
export const round = (x: number, digits = 3) => Math.round(x * 10 ** digits) / 10 ** digits;
/** The largest difference between two vectors' elements. */
export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let worst = 0;
  for (let j = 0; j < a.length; j++) worst = Math.max(worst, Math.abs(a[j]! - b[j]!));
  return worst;
}

/** What a phase is, before it is measured. */
export type PhaseMeta = Pick<PhaseResult, 'case' | 'model' | 'workload' | 'target' | 'transport' | 'loop' | 'round'> &
  Partial<Pick<PhaseResult, 'serverArgs' | 'concurrency' | 'offeredRps' | 'loadFraction' | 'arrivals'>>;

/** A closed-loop phase's description (keys in the order results.json has them). */
export function closedLoopMeta(c: CaseName, model: string, workload: string, target: string, transport: PhaseResult['transport'], round: number, concurrency?: number): PhaseMeta {
  return { case: c, model, workload, target, transport, loop: 'closed', round, ...(concurrency !== undefined ? { concurrency } : {}) };
}

export function phaseId(m: PhaseMeta): string {
  const shape = m.loop === 'closed' ? `${m.transport}-${m.concurrency ?? 0}` : `${m.transport}-${Math.round((m.loadFraction ?? 0) * 100)}pct-${m.arrivals}`;
  return `${m.case}/${m.model}/${m.workload}/${shape}/${m.target.replace(/\s+/g, '-')}/r${m.round}`;
}

export function latencySummary(h: Histogram): LatencySummary {
  const ms = (v: number) => round(v / 1000, 3);
  if (h.totalCount === 0) return { p50: NaN, p90: NaN, p99: NaN, p999: NaN, max: NaN, mean: NaN };
  return {
    p50: ms(h.getValueAtPercentile(50)),
    p90: ms(h.getValueAtPercentile(90)),
    p99: ms(h.getValueAtPercentile(99)),
    p999: ms(h.getValueAtPercentile(99.9)),
    max: ms(h.maxValue),
    mean: ms(h.mean),
  };
}

/** The batch counters a server's /metrics gives (an in-process engine's stats() too, with no batch-size histogram). */
export type BatchCounters = Pick<ServerCounters, 'batches' | 'rows' | 'realTokens' | 'paddedTokens' | 'runSeconds' | 'batchSizeLe'>;

/** The server's side of a window from its /metrics counters at both ends (the batch-size histogram de-cumulated). */
export function serverSide(before: BatchCounters, after: BatchCounters, windowMs: number): ServerSide {
  const batches = after.batches - before.batches;
  const rows = after.rows - before.rows;
  const les = [...after.batchSizeLe.keys()].sort((a, b) => a - b);
  let prev = 0;
  const batchSizes = les.map((le) => {
    const cum = (after.batchSizeLe.get(le) ?? 0) - (before.batchSizeLe.get(le) ?? 0);
    const count = cum - prev;
    prev = cum;
    return { le, count };
  });
  return {
    batches,
    meanBatch: batches > 0 ? round(rows / batches, 2) : 0,
    paddingEfficiency: round((after.realTokens - before.realTokens) / Math.max(1, after.paddedTokens - before.paddedTokens), 4),
    batchSizes,
    deviceBusy: round(((after.runSeconds - before.runSeconds) * 1000) / windowMs, 3),
  };
}

/** The fields every phase record has, from its counts over a window of `windowMs` and its latencies. */
function record(m: PhaseMeta, windowMs: number, c: { requests: number; inputs: number; tokens: number; rejected: number; errors: number; firstError?: string | undefined }, h: Histogram): PhaseResult {
  const s = windowMs / 1000;
  return {
    id: phaseId(m),
    ...m,
    windowS: round(s, 3),
    requests: c.requests,
    inputs: c.inputs,
    tokens: c.tokens,
    rejected: c.rejected,
    errors: c.errors,
    ...(c.firstError ? { firstError: c.firstError } : {}),
    rps: round(c.requests / s, 1),
    inputsPerS: round(c.inputs / s, 1),
    tokensPerS: round(c.tokens / s, 0),
    latencyMs: latencySummary(h),
    histogram: hdr.encodeIntoCompressedBase64(h),
  };
}

/** CPU µs per request by thread, from two samples of a server's thread counters (seconds). */
export function perThread(before: Map<string, number>, after: Map<string, number>, requests: number): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [name, s] of after) out[name] = round(((s - (before.get(name) ?? 0)) * 1e6) / Math.max(1, requests), 1);
  return out;
}

/** A load phase's record; destroys the outcome's histogram (its compressed copy is kept). */
export function phaseFromLoad(m: PhaseMeta, o: LoadOutcome): PhaseResult {
  const p = record(m, o.windowMs, o, o.histogram);
  p.generator = o.generator;
  // a server that batches nothing (the floor server) has no batch figures
  if (o.before && o.after && o.after.batches > 0) p.server = serverSide(o.before, o.after, o.countersMs);
  if (o.serverCpuMs !== null && o.requests > 0) p.cpuMsPerRequest = round(o.serverCpuMs / o.requests, 4);
  if (o.requests > 0) p.clientCpuMsPerRequest = round(o.clientCpuMs / o.requests, 4);
  if (o.before?.threadCpuS.size && o.after) p.threadCpuUsPerRequest = perThread(o.before.threadCpuS, o.after.threadCpuS, o.requests);
  o.histogram.destroy();
  return p;
}

/** A raw onnxruntime loop's record: a batch counts as a request, its rows as inputs; destroys `h`. */
export function phaseFromRaw(m: PhaseMeta, res: RawLoopResult, h: Histogram): PhaseResult {
  const p = record(m, res.windowMs, { requests: res.batches, inputs: res.rows, tokens: res.realTokens, rejected: 0, errors: 0 }, h);
  p.cpuMsPerRequest = round(res.cpuMs / res.batches, 4);
  h.destroy();
  return p;
}

/**
 * What an in-process engine loop counted (bench/suite/engine.ts): the closed loop's window
 * (bench/closed-loop.ts) over the engine's counters, and the inputs and tokens of the requests it
 * counted. An engine refuses nothing apart: a call it refuses is an error.
 */
export type EngineLoopCounts = Omit<ClosedLoopWindow<BatchCounters>, 'histogram'> & { inputs: number; tokens: number };

/** An engine loop's record, its batches in `server` as a server's are; destroys `h`. */
export function phaseFromEngine(m: PhaseMeta, c: EngineLoopCounts, h: Histogram): PhaseResult {
  const p = record(m, c.windowMs, { ...c, rejected: 0 }, h);
  p.server = serverSide(c.before, c.after, c.windowMs);
  if (c.requests > 0) p.cpuMsPerRequest = round(c.cpuMs / c.requests, 4);
  h.destroy();
  return p;
}

/** The line printed when a phase ends. */
export function describePhase(p: PhaseResult): string {
  const lat = `P50 ${p.latencyMs.p50.toFixed(1)} ms, P99 ${p.latencyMs.p99.toFixed(1)} ms`;
  const batch = p.server ? `, batch ${p.server.meanBatch.toFixed(1)}, padding eff. ${(p.server.paddingEfficiency * 100).toFixed(0)}%` : '';
  const bad = p.rejected || p.errors ? `, rejected ${p.rejected}, errors ${p.errors}${p.firstError ? ` (${p.firstError.slice(0, 80)})` : ''}` : '';
  const cpuOf = p.transport === 'in-process' ? 'this process' : 'server';
  const cpu = p.cpuMsPerRequest != null ? `, ${cpuOf} ${(p.cpuMsPerRequest * 1000).toFixed(0)} us CPU/request` : '';
  const gen = p.generator ? `, load from ${p.generator === 'wrk' ? 'wrk' : 'the Node generator'}${p.clientCpuMsPerRequest != null ? ` (${(p.clientCpuMsPerRequest * 1000).toFixed(0)} us/request)` : ''}` : '';
  return `${p.rps.toFixed(0)} req/s, ${p.inputsPerS.toFixed(0)} inputs/s, ${lat}${batch}${cpu}${gen}${bad}`;
}

/** The floor case's figure: slabserve's CPU per request on all its gateway threads together (gateway-0, ...), or the floor server's main thread's. */
export function gatewayUs(p: PhaseResult): number {
  const cpu = p.threadCpuUsPerRequest ?? {};
  if (p.target === 'floor') return cpu.main ?? NaN;
  return Object.entries(cpu).reduce((a, [thread, us]) => (thread.startsWith('gateway') ? a + us : a), 0);
}

export interface Side {
  label: string;
  phases: PhaseResult[];
}

/**
 * The order the sides run in round `k` (from 1): forwards in odd rounds, backwards in even ones
 * (A B, B A, A B ...), so that neither side always runs first, right after a server start or the
 * other side's load, or always last, where a drift of the shared machine hits it most.
 */
export function roundOrder(k: number, sides: number): number[] {
  const order = [...Array(sides).keys()];
  return k % 2 === 0 ? order.reverse() : order;
}

/** Each metric's value in a phase, as a comparison reads it unless it is given another `pick`. */
export const METRIC_VALUE: Record<Comparison['metric'], (p: PhaseResult) => number> = {
  rps: (p) => p.rps,
  inputsPerS: (p) => p.inputsPerS,
  tokensPerS: (p) => p.tokensPerS,
  p50: (p) => p.latencyMs.p50,
  p99: (p) => p.latencyMs.p99,
  paddingEfficiency: (p) => p.server?.paddingEfficiency ?? NaN,
  cpuUsPerRequest: (p) => (p.cpuMsPerRequest ?? NaN) * 1000,
};

/**
 * A against B on `pick` (default: the comparison's metric): each side's median
 * over its rounds, and a / b round by round (against b's first phase where b has
 * fewer, e.g. one best raw run) with their median as the ratio.
 */
export function comparison(c: Omit<Comparison, 'a' | 'b' | 'ratio' | 'roundRatios'>, a: Side, b: Side, pick = METRIC_VALUE[c.metric]): Comparison {
  const av = median(a.phases.map(pick));
  const bv = median(b.phases.map(pick));
  const roundRatios = a.phases.map((p, i) => round(pick(p) / pick(b.phases[i] ?? b.phases[0]!), 3));
  return { ...c, a: { label: a.label, value: round(av, 3) }, b: { label: b.label, value: round(bv, 3) }, ratio: round(median(roundRatios), 3), roundRatios };
}
