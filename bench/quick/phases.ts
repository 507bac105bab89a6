/**
 * bench:quick's phases, each a closed loop measured over one window: raw
 * onnxruntime on padded batches, the in-process engine, and a server in a
 * child process over HTTP or /ws (through the suite's load generator,
 * bench/load.ts). Each returns one PhaseResult.
 */
import type * as ort from 'onnxruntime-node';
import type { Engine } from '../../src/main/engine.js';
import { mulberry32 as rng } from '../../models/generator/rng.js';
import { newHistogram, runLoad, type Generator } from '../load.js';
import { runClosedLoop } from '../closed-loop.js';
import { runRawLoop, type RawBatch } from '../raw-ort.js';
import type { ServerProcess } from '../server-process.js';
import type { Workload } from '../workloads.js';
import type { QuickOptions } from './options.js';
import type { Seq } from './workload.js';

export interface PhaseResult {
  config: string;
  round: number;
  kind: 'raw' | 'engine' | 'http' | 'ws';
  /** Closed-loop callers (engine) or HTTP clients; null for raw. */
  concurrency: number | null;
  seqPerSec: number;
  /** ms; per batch for raw, per request for the engine. */
  p50Ms: number;
  p99Ms: number;
  meanBatch: number;
  paddingEfficiency: number;
  /** Wall ms of the measured window divided by batches run in it. */
  msPerBatch: number;
  /** session.run ms per batch (engine: its RUN_MS counter; raw: the same as msPerBatch). */
  ortMsPerBatch: number | null;
  /** Process CPU time (all threads) over wall time: how many cores were busy. For http: the server process. */
  cores: number;
  cpuUsPerSeq: number;
  /** http/ws: the load generator (wrk or this process: bench/load.ts), what it spent, and its connections. */
  client?: { generator: Generator; cores: number; elu: number; cpuUsPerReq: number; connections: number | null };
  /** ws only: sockets and requests in flight per socket. */
  ws?: { sockets: number; depth: number };
  sequences: number;
  batches: number;
  errors: number;
  windowMs: number;
}

// ---------------------------------------------------------------- raw onnxruntime

export async function runRaw(o: QuickOptions, config: string, round: number, session: ort.InferenceSession, batches: RawBatch[]): Promise<PhaseResult> {
  const h = newHistogram();
  const r = await runRawLoop(session, batches, o.warmupMs, o.durationMs, h);
  const result: PhaseResult = {
    config,
    round,
    kind: 'raw',
    concurrency: null,
    seqPerSec: (r.rows / r.windowMs) * 1000,
    p50Ms: h.getValueAtPercentile(50) / 1000,
    p99Ms: h.getValueAtPercentile(99) / 1000,
    meanBatch: r.rows / r.batches,
    paddingEfficiency: r.realTokens / r.paddedTokens,
    msPerBatch: r.windowMs / r.batches,
    ortMsPerBatch: r.windowMs / r.batches,
    cores: r.cpuMs / r.windowMs,
    cpuUsPerSeq: (r.cpuMs * 1000) / r.rows,
    sequences: r.rows,
    batches: r.batches,
    errors: 0,
    windowMs: r.windowMs,
  };
  h.destroy();
  return result;
}

// ---------------------------------------------------------------- engine

export async function runEngine(o: QuickOptions, config: string, round: number, engine: Engine, seqs: Seq[], concurrency: number): Promise<PhaseResult> {
  const call = o.texts
    ? (s: Seq) => engine.embed(s.text!, { model: o.model })
    : (s: Seq) => engine.runTokens(o.model, [s]);
  const loop = await runClosedLoop({
    clients: concurrency,
    warmupMs: o.warmupMs,
    durationMs: o.durationMs,
    call: (n) => call(seqs[n % seqs.length]!),
    snapshot: () => engine.stats()[o.model]!,
  });
  const { histogram: h, requests: done, errors, windowMs, cpuMs: cpu, before: s0, after: s1 } = loop;
  if (errors > 0) console.error(`  ${config}: ${errors} requests failed, first: ${loop.firstError}`);
  const batches = s1.batches - s0.batches;
  const rows = s1.rows - s0.rows;
  const result: PhaseResult = {
    config,
    round,
    kind: 'engine',
    concurrency,
    seqPerSec: (done / windowMs) * 1000,
    p50Ms: h.getValueAtPercentile(50) / 1000,
    p99Ms: h.getValueAtPercentile(99) / 1000,
    meanBatch: rows / batches,
    paddingEfficiency: (s1.realTokens - s0.realTokens) / (s1.paddedTokens - s0.paddedTokens),
    msPerBatch: windowMs / batches,
    ortMsPerBatch: (s1.runMs - s0.runMs) / batches,
    cores: cpu / windowMs,
    cpuUsPerSeq: (cpu * 1000) / done,
    sequences: done,
    batches,
    errors,
    windowMs,
  };
  h.destroy();
  return result;
}

// ---------------------------------------------------------------- servers

/**
 * One closed-loop phase against a server over HTTP keep-alive (`clients`
 * callers, one connection each) or /ws (`ws.sockets` sockets x `ws.depth` in
 * flight), through the suite's load generator (bench/load.ts). A fresh client
 * per phase: uWS closes connections idle for 10 s, and the other phases in
 * between take longer than that; connecting happens during the warm-up.
 */
export async function runServer(
  o: QuickOptions,
  config: string,
  round: number,
  server: ServerProcess,
  workload: Workload,
  clients: number,
  ws?: { sockets: number; depth: number; rowBytes: number },
): Promise<PhaseResult> {
  const r = await runLoad(
    {
      target: server,
      model: o.model,
      transport: ws ? 'ws' : 'http',
      workload,
      arrivals: { kind: 'closed', concurrency: clients },
      warmupMs: o.warmupMs,
      durationMs: o.durationMs,
      generator: o.loadGenerator,
      ...(ws ? { ws: { sockets: ws.sockets, depth: ws.depth }, rowBytes: ws.rowBytes } : {}),
    },
    rng(o.seed + round),
  );
  const h = r.histogram;
  try {
    const errors = r.errors + r.rejected;
    if (errors > 0) console.error(`  ${config}: ${errors} requests failed, first: ${r.firstError ?? 'refused (429/503)'}`);
    const before = r.before!; // a slabserve server process always has its counters
    const after = r.after!;
    const batches = after.batches - before.batches;
    const rows = after.rows - before.rows;
    const serverCpu = r.serverCpuMs ?? NaN;
    return {
      config,
      round,
      kind: ws ? 'ws' : 'http',
      concurrency: clients,
      seqPerSec: (r.requests / r.windowMs) * 1000,
      p50Ms: h.getValueAtPercentile(50) / 1000,
      p99Ms: h.getValueAtPercentile(99) / 1000,
      meanBatch: rows / batches,
      paddingEfficiency: (after.realTokens - before.realTokens) / (after.paddedTokens - before.paddedTokens),
      msPerBatch: r.countersMs / batches,
      ortMsPerBatch: ((after.runSeconds - before.runSeconds) * 1000) / batches,
      cores: serverCpu / r.windowMs,
      cpuUsPerSeq: (serverCpu * 1000) / r.requests,
      client: { generator: r.generator, cores: r.clientCpuMs / r.windowMs, elu: r.clientElu, cpuUsPerReq: (r.clientCpuMs * 1000) / r.requests, connections: r.connections },
      ...(ws ? { ws: { sockets: ws.sockets, depth: ws.depth } } : {}),
      sequences: r.requests,
      batches,
      errors,
      windowMs: r.windowMs,
    };
  } finally {
    h.destroy();
  }
}
