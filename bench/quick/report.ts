/**
 * bench:quick's tables, printed from the reported rounds: raw against the
 * engine, the engine's defaults (maxInflightBatches x intraOpThreads), the
 * server over HTTP, over WebSocket, and the column legend. The HTTP and
 * WebSocket tables also return their derived ratios for the JSON output.
 */
import { alignedTable, fmt } from '../table.js';
import type { QuickOptions } from './options.js';
import type { PhaseResult } from './phases.js';
import { DEFAULT_INFLIGHT, HTTP_BATCHED, HTTP_MBS1, RAW_BATCHES } from './rig.js';
import { engineAt, httpAt, ratioByRound, wsName, type Reported } from './rounds.js';

/** The reported rows and what every table compares with. */
export class QuickResults {
  readonly rawBest: number;
  readonly rawBestName: string;
  /** engine maxBatchSize=1's seq/s (NaN without engine rows). */
  readonly mbs1: number;

  constructor(
    readonly o: QuickOptions,
    readonly best: Map<string, Reported>,
    readonly all: PhaseResult[],
  ) {
    this.rawBest = Math.max(...RAW_BATCHES.map((b) => this.get(`raw b=${b}`).seqPerSec));
    this.rawBestName = RAW_BATCHES.map((b) => `raw b=${b}`).find((n) => this.get(n).seqPerSec === this.rawBest)!;
    this.mbs1 = o.engines ? this.get('engine maxBatchSize=1').seqPerSec : NaN;
  }

  get(name: string): Reported {
    return this.best.get(name)!;
  }

  has(name: string): boolean {
    return this.best.has(name);
  }

  /** Batched engine over maxBatchSize=1, and over the best raw row (NaN without engine rows). */
  engineRatios(): { gain: number; vsRaw: number } {
    if (!this.o.engines) return { gain: NaN, vsRaw: NaN };
    const batched = this.get('engine batched').seqPerSec;
    return { gain: batched / this.mbs1, vsRaw: batched / this.rawBest };
  }
}

const pct = (x: number) => `${fmt(x, 0)}%`;

/** Raw onnxruntime against the engine, batched and maxBatchSize=1. */
export function mainTable(r: QuickResults): string[] {
  const { o } = r;
  const headers = ['config', 'seq/s', 'spread', 'P50 ms', 'P99 ms', 'latency of', 'mean batch', 'pad eff', 'ms/batch', 'ORT ms/batch', 'cores', 'CPU us/seq', 'vs mbs=1', 'vs raw best'];
  const row = (name: string): string[] => {
    const x = r.get(name);
    return [
      name,
      fmt(x.seqPerSec, 0),
      pct(x.spreadPct),
      fmt(x.p50Ms, 2),
      fmt(x.p99Ms, 2),
      x.kind === 'raw' ? 'batch' : 'request',
      fmt(x.meanBatch, 1),
      pct(100 * x.paddingEfficiency),
      fmt(x.msPerBatch, 2),
      fmt(x.ortMsPerBatch, 2),
      fmt(x.cores, 2),
      fmt(x.cpuUsPerSeq, 0),
      x.kind === 'engine' ? `${fmt(x.seqPerSec / r.mbs1, 2)}x` : '',
      `${fmt(x.seqPerSec / r.rawBest, 2)}x`,
    ];
  };
  const names = [...RAW_BATCHES.map((b) => `raw b=${b}`), ...(o.engines ? ['engine batched', 'engine maxBatchSize=1'] : [])];
  const lines = ['', `## ${o.model}: raw onnxruntime${o.engines ? ' vs engine' : ''} (intra-op threads ${o.intra}, engine maxInflightBatches ${DEFAULT_INFLIGHT})`, '', alignedTable(headers, names.map(row)), ''];
  const { gain, vsRaw } = r.engineRatios();
  if (o.engines) lines.push(`batching gain (engine batched / engine maxBatchSize=1): ${gain.toFixed(2)}x; engine/raw (engine batched / ${r.rawBestName}): ${vsRaw.toFixed(2)}x`);
  return lines;
}

/** The engine's defaults: maxInflightBatches x intraOpThreads, batching on. */
export function extraTable(r: QuickResults): string[] {
  const { o } = r;
  const names = [
    'raw b=32',
    ...o.intras.slice(1).map((i) => `raw b=32 intra=${i}`),
    ...o.intras.flatMap((i) => [i === o.intra ? 'engine batched' : `engine inflight=1 intra=${i}`, `engine inflight=2 intra=${i}`]),
  ];
  const label = (n: string) => (n === 'engine batched' ? `engine inflight=${DEFAULT_INFLIGHT} intra=${o.intra}` : n === 'raw b=32' ? `raw b=32 intra=${o.intra}` : n);
  const base = r.get('engine batched').seqPerSec;
  const headers = ['config', 'seq/s', 'spread', 'P50 ms', 'P99 ms', 'mean batch', 'ms/batch', 'ORT ms/batch', 'cores', 'CPU us/seq', 'vs default'];
  const rows = names.map((n) => {
    const x = r.get(n);
    return [
      label(n) + (n === 'engine batched' ? ' (default)' : ''),
      fmt(x.seqPerSec, 0),
      pct(x.spreadPct),
      fmt(x.p50Ms, 2),
      fmt(x.p99Ms, 2),
      fmt(x.meanBatch, 1),
      fmt(x.msPerBatch, 2),
      fmt(x.ortMsPerBatch, 2),
      fmt(x.cores, 2),
      fmt(x.cpuUsPerSeq, 0),
      x.kind === 'engine' ? `${fmt(x.seqPerSec / base, 2)}x` : '',
    ];
  });
  return ['', `## engine defaults: maxInflightBatches x intraOpThreads (batching on, ${o.concurrency} callers)`, '', alignedTable(headers, rows)];
}

/** One row of the HTTP table. */
function httpRow(r: QuickResults, n: string): string[] {
  const { o } = r;
  const x = r.get(n);
  // The row batching gain divides by, and the in-process row the HTTP row compares with.
  const unbatched = x.kind === 'http' ? httpAt(HTTP_MBS1, x.concurrency!) : n === 'engine batched' || n === 'engine maxBatchSize=1' ? 'engine maxBatchSize=1' : null;
  const engine = x.kind !== 'http' ? null : n.startsWith(HTTP_MBS1) ? (x.concurrency === o.concurrency ? 'engine maxBatchSize=1' : null) : engineAt(o, x.concurrency!);
  const ratio = (name: string | null) => (name && r.has(name) ? `${fmt(x.seqPerSec / r.get(name).seqPerSec, 2)}x` : '');
  return [
    n.replace(/ c=\d+$/, ''),
    x.concurrency === null ? '' : String(x.concurrency),
    fmt(x.seqPerSec, 0),
    pct(x.spreadPct),
    fmt(x.p50Ms, 2),
    fmt(x.p99Ms, 2),
    x.kind === 'raw' ? 'batch' : 'request',
    fmt(x.meanBatch, 1),
    fmt(x.ortMsPerBatch === null ? null : (1000 * x.ortMsPerBatch) / x.meanBatch, 0),
    fmt(x.cores, 2),
    fmt(x.cpuUsPerSeq, 0),
    x.client ? fmt(x.client.cores, 2) : '',
    x.client ? (x.client.generator === 'wrk' ? 'wrk' : pct(100 * x.client.elu)) : '',
    x.client ? fmt(x.client.connections, 0) : '',
    ratio(unbatched),
    ratio(engine),
    `${fmt(x.seqPerSec / r.rawBest, 2)}x`,
  ];
}

/** The line under the HTTP table for `c` clients, and its derived ratios. */
function httpSummary(r: QuickResults, c: number): { line: string; derived: Record<string, unknown> } {
  const { o } = r;
  const b = r.get(httpAt(HTTP_BATCHED, c));
  const u = r.get(httpAt(HTTP_MBS1, c));
  const e = o.engines ? r.get(engineAt(o, c)) : null;
  // The two rows run back to back in every round: their ratio round by round shows how much of the gain is noise.
  const paired = ratioByRound(o, r.all, httpAt(HTTP_BATCHED, c), httpAt(HTTP_MBS1, c));
  const derived = {
    batchingGain: b.seqPerSec / u.seqPerSec,
    batchingGainByRound: paired,
    serverVsRaw: b.seqPerSec / r.rawBest,
    p50BatchedMs: b.p50Ms,
    p50UnbatchedMs: u.p50Ms,
    ...(e ? { vsEngine: b.seqPerSec / e.seqPerSec, p50EngineMs: e.p50Ms } : {}),
  };
  const line =
    `${c} client${c > 1 ? 's' : ''}: batching gain ${fmt(b.seqPerSec / u.seqPerSec, 2)}x (round by round ${paired.map((x) => fmt(x, 2)).join(' ')}; ` +
    `P50 ${fmt(b.p50Ms, 2)} ms batched, ${fmt(u.p50Ms, 2)} ms maxBatchSize=1); ` +
    `server/raw ${fmt(b.seqPerSec / r.rawBest, 2)}x` +
    (e ? `; HTTP/engine ${fmt(b.seqPerSec / e.seqPerSec, 2)}x, P50 ${fmt(b.p50Ms - e.p50Ms, 2)} ms over the engine's` : '') +
    `; server ${fmt(b.cpuUsPerSeq, 0)} us CPU per request (${r.rawBestName}: ${fmt(r.get(r.rawBestName).cpuUsPerSeq, 0)} us per sequence), load generator ${fmt(b.client!.cpuUsPerReq, 0)} us`;
  const notes = [b, u]
    .filter((x) => x.client?.connections !== null && x.client?.connections !== c)
    .map((x) => `\n  note: ${x.config} opened ${x.client?.connections} connections for ${c} clients`);
  return { line: line + notes.join(''), derived };
}

/** The server over loopback, beside raw and the in-process engine. */
export function httpTable(r: QuickResults): { lines: string[]; derived: Record<string, unknown> } {
  const { o } = r;
  const names: string[] = [r.rawBestName];
  for (const c of o.httpClients) {
    if (o.engines) {
      names.push(engineAt(o, c));
      if (c === o.concurrency) names.push('engine maxBatchSize=1');
    }
    names.push(httpAt(HTTP_BATCHED, c), httpAt(HTTP_MBS1, c));
  }
  const headers = ['config', 'clients', 'req/s', 'spread', 'P50 ms', 'P99 ms', 'latency of', 'mean batch', 'ORT us/seq', 'cores', 'CPU us/req', 'client cores', 'client ELU', 'conns', 'batching gain', 'vs engine', 'vs raw best'];
  const lines = [
    '',
    `## ${o.model} over HTTP: slabserve serve (child process, 127.0.0.1, POST /embed with one text, JSON) beside ${r.rawBestName} and the in-process engine`,
    '',
    alignedTable(headers, names.map((n) => httpRow(r, n)), 1),
    '',
  ];
  const derived: Record<string, unknown> = {};
  for (const c of o.httpClients) {
    const s = httpSummary(r, c);
    derived[`c${c}`] = s.derived;
    lines.push(s.line);
  }
  return { lines, derived };
}

/** The same batched server over /ws: pipelined sockets beside HTTP keep-alive at as many requests in flight. */
export function wsTable(r: QuickResults): { lines: string[]; derived: Record<string, unknown> } {
  const { o } = r;
  const httpRef = (inflight: number) => (r.has(httpAt(HTTP_BATCHED, inflight)) ? httpAt(HTTP_BATCHED, inflight) : null);
  const refs = [...new Set(o.wsConfigs.map((w) => httpRef(w.sockets * w.depth)).filter((n): n is string => n !== null))];
  const names = [...refs, ...o.wsConfigs.map((w) => wsName(w.sockets, w.depth))];
  const r2 = (a: number, b: number | undefined) => (b === undefined || !Number.isFinite(a / b) ? '' : `${fmt(a / b, 2)}x`);
  const headers = ['config', 'conns', 'in flight', 'req/s', 'spread', 'P50 ms', 'P99 ms', 'mean batch', 'cores', 'CPU us/req', 'client us/req', 'client cores', 'req/s ws/http', 'P50 ws/http', 'P99 ws/http', 'CPU/req ws/http', 'by round (req/s)'];
  const derived: Record<string, unknown> = {};
  const rows = names.map((n) => {
    const x = r.get(n);
    const ref = x.kind === 'ws' ? httpRef(x.concurrency!) : null;
    const h = ref ? r.get(ref) : undefined;
    // ws/http req/s round by round: both rows ran in every round, a few seconds apart
    const byRound = ref ? ratioByRound(o, r.all, n, ref) : [];
    if (x.kind === 'ws') derived[n] = { vsHttp: ref, reqPerSecRatio: h ? x.seqPerSec / h.seqPerSec : null, byRound, p50Ratio: h ? x.p50Ms / h.p50Ms : null, p99Ratio: h ? x.p99Ms / h.p99Ms : null, cpuPerReqRatio: h ? x.cpuUsPerSeq / h.cpuUsPerSeq : null };
    return [
      x.kind === 'ws' ? `${n} (${x.ws!.sockets} socket${x.ws!.sockets > 1 ? 's' : ''} x ${x.ws!.depth} pipelined)` : `${n.replace(/ c=\d+$/, '')} (${x.concurrency} keep-alive clients)`,
      x.client ? fmt(x.client.connections, 0) : '',
      String(x.concurrency),
      fmt(x.seqPerSec, 0),
      pct(x.spreadPct),
      fmt(x.p50Ms, 2),
      fmt(x.p99Ms, 2),
      fmt(x.meanBatch, 1),
      fmt(x.cores, 2),
      fmt(x.cpuUsPerSeq, 0),
      x.client ? fmt(x.client.cpuUsPerReq, 0) : '',
      x.client ? fmt(x.client.cores, 2) : '',
      h ? r2(x.seqPerSec, h.seqPerSec) : '',
      h ? r2(x.p50Ms, h.p50Ms) : '',
      h ? r2(x.p99Ms, h.p99Ms) : '',
      h ? r2(x.cpuUsPerSeq, h.cpuUsPerSeq) : '',
      byRound.map((v) => fmt(v, 2)).join(' '),
    ];
  });
  const lines = [
    '',
    `## ${o.model} over WebSocket: the same 'http batched' server, /ws, one text per request, msgpack, encoding f32 (ws + msgpackr client, bench/ws-load.ts)`,
    '',
    alignedTable(headers, rows, 1),
  ];
  const missing = o.wsConfigs.filter((w) => !httpRef(w.sockets * w.depth));
  if (missing.length) lines.push(`note: no 'http batched' row at ${missing.map((w) => w.sockets * w.depth).join(', ')} clients to compare with (add it to --http-clients)`);
  return { lines, derived };
}

/** What every column means. */
export function legend(r: QuickResults): string {
  const { o } = r;
  return `columns:
  seq/s, req/s  sequences (= requests: one sequence each) answered per second in the measured window (${o.report} of ${o.rounds} rounds; other columns from that round)
  spread        (fastest - slowest) / fastest seq/s across the rounds: how noisy the box was for this row
  P50/P99 ms    latency percentiles (HDR histogram): raw = one session.run of a batch; engine = one request, submit to answer;
                http = one request, first byte sent to last byte of the answer read, at the client
  latency of    what P50/P99 measure (batch or request)
  mean batch    sequences per session.run (engine: stats() rows / batches; http: the server's slabserve_batch_size sum / count)
  ORT us/seq    (HTTP table) time inside session.run per sequence (ORT ms/batch / mean batch; http: slabserve_batch_duration_seconds):
                above raw's at a like batch size, the inference thread was not getting a whole core
  pad eff       real tokens / padded tokens computed (engine: stats() realTokens / paddedTokens)
  ms/batch      measured wall time / batches run: for the engine, how often the inference thread completes a batch
  ORT ms/batch  time inside session.run per batch (engine: stats().runMs; with 2 batches in flight it also
                counts the wait behind the other batch, since onnxruntime-node runs a session synchronously)
  cores         process CPU time (all threads) / wall time; http rows: the server process only
  CPU us/seq    process CPU time per sequence (http rows: server process CPU per request)
  client cores  http rows: the load generator's CPU (wrk's, or this process's) / wall time; client ELU: the Node
                generator's event loop utilization ('wrk' where wrk sent the load: bench/load.ts)
  conns         http rows: TCP connections the client opened in the phase (one per client: keep-alive held); ws rows: sockets
  in flight     (WebSocket table) requests in flight at once: http clients, or ws sockets x requests pipelined per socket
  client us/req the load generator's CPU per request (this process)
  x ws/http     (WebSocket table) the ws row / 'http batched' with as many clients as the ws row has requests in flight;
                by round: req/s ws/http in each round (both rows run in every round)
  vs mbs=1      this row / engine maxBatchSize=1: the batching gain on the 'engine batched' row
  batching gain (HTTP table) batched / maxBatchSize=1 at the same number of clients
  vs engine     (HTTP table) this row / the in-process engine with the same batching and the same number of callers
  vs raw best   this row / the best raw row (${r.rawBestName}): how close the engine (or the server) gets to calling onnxruntime directly
  vs default    this row / the default engine (maxInflightBatches ${DEFAULT_INFLIGHT}, intraOpThreads ${o.intra})`;
}
