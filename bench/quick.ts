/**
 * Quick benchmark: what dynamic batching buys, and how close the engine and the
 * HTTP server get to onnxruntime called directly, on one model (tiny-embed by default).
 *
 *   npm run bench:quick                        # build, generate models, run (~2 min 35 s on 2 cores)
 *   npm run bench:quick -- --skip-extra        # without the maxInflightBatches x intraOpThreads table
 *   npm run bench:quick -- --http-only         # raw + HTTP (and WebSocket) rows only
 *   node dist/bench/quick.js --help
 *
 * Phases (each: warm-up, then a fixed measured duration):
 *   raw b=N       onnxruntime InferenceSession in this thread, on the model as the
 *                 server prepares it (prepareModel: pooling appended), closed loop of
 *                 padded batches of N sequences; every batch holds one length bucket
 *                 and is padded to it, with attention mask, as the engine would do
 *   engine ...    createEngine(), `--concurrency` closed-loop callers, each sending its
 *                 next request (one sequence) when the previous one is answered
 *   http ...      `slabserve serve` in a child process on 127.0.0.1 (batching on, and
 *                 --max-batch-size 1), driven by closed-loop clients in this process over
 *                 keep-alive connections (one per client): POST /embed {"inputs": text},
 *                 so the server tokenizes (bench/server-process.ts)
 *   ws SxD        the same batched server over WebSocket (/ws): S sockets, D requests
 *                 pipelined on each (S x D in flight), one text per request, encoding f32
 *                 (bench/ws-load.ts); reported beside 'http batched' at as many clients
 *
 * Every configuration runs `--rounds` times, rounds in alternating order
 * (A B C ... C B A A B C ...) so slow drift of a noisy machine hits all
 * configurations alike; each row reports the median round by sequences/s
 * (--report best: the fastest) and the spread between rounds.
 *
 * Every row sees the same inputs: short texts generated from a fixed seed and
 * tokenized by the model's tokenizer. Raw and the engine run those token ids
 * (with --texts the engine gets the text, through engine.embed); the HTTP rows
 * send the text. --ids: random token ids instead (the old workload; no HTTP rows).
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, loadavg, totalmem } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import hdr from 'hdr-histogram-js';
import * as ort from 'onnxruntime-node';
import { createEngine, ENGINE_DEFAULTS, resolveBatching, type Engine } from '../src/engine.js';
import { createLoadClient, type ClientKind } from './http-clients.js';
import { startServerProcess, type ServerProcess } from './server-process.js';
import { floorRows, floorTable, runFloorCase, type FloorRow } from './floor.js';
import { runLoad } from './load.js';
import type { Workload } from './workloads.js';
import { embedOnce } from './ws-load.js';
import { loadTokenizer } from '../src/core/tokenizer.js';
import { prepareModel } from '../src/gpu-worker/graph.js';
import { openRawSession, rawBatches, runRawLoop, type RawBatch } from './raw-ort.js';
import { bucketFor } from '../src/gpu-worker/scheduler.js';
import { loadModelSpec, type ModelSpec } from '../src/shared/model-config.js';
import { bertUncasedVocab } from '../src/modelgen/tokenizer-json.js';
import { mulberry32 as rng } from '../src/modelgen/rng.js';
import { num, numList } from './args.js';

const here = dirname(fileURLToPath(import.meta.url));
// dist/bench/quick.js -> the repo root is two levels up
const repoRoot = resolve(here, '..', '..');
const require = createRequire(import.meta.url);

// ---------------------------------------------------------------- options

const HELP = `usage: node dist/bench/quick.js [options]
  --model NAME             model folder under --models-dir (default tiny-embed)
  --models-dir DIR         (default <repo>/models)
  --duration-s S           measured seconds per phase and round (default 2)
  --warmup-s S             warm-up seconds before each measured phase (default 0.5)
  --rounds N               rounds per configuration, alternating order (default 3)
  --report median|best     which round each row shows (default median; best = most seq/s)
  --concurrency N          closed-loop callers for the engine phases (default 64)
  --intra-op-threads N     onnxruntime intra-op threads for the main table, raw and engine (default 0: onnxruntime's choice)
  --device D               engine device (default cpu)
  --requests N             workload size: sequences generated from the seed (default 4096)
  --seed N                 workload seed (default 1234)
  --texts                  engine phases call engine.embed(text) (tokenization included) instead of runTokens on its ids
  --ids                    workload of random token ids instead of texts (the old default; implies --skip-http)
  --extra-intra LIST       intra-op thread counts the extra table compares with --intra-op-threads (default 1,2)
  --skip-extra             skip the maxInflightBatches x intraOpThreads table
  --skip-http              skip the HTTP table
  --http-only              raw rows and the HTTP table only (no engine phases)
  --http-clients LIST      concurrent HTTP clients, one keep-alive connection each (default 1,64)
  --http-client KIND       http (node:http keep-alive Agent, default) or undici (undici Pool, if installed)
  --ws LIST                WebSocket rows against the batched server, SOCKETSxIN_FLIGHT each (default 1x64,4x16)
  --skip-ws                no WebSocket rows
  --skip-floor             no floor table (slabserve beside the floor server: bench/floor.ts)
  --json PATH              also write every round's raw results as JSON`;

const { values: args } = parseArgs({
  options: {
    model: { type: 'string', default: 'tiny-embed' },
    'models-dir': { type: 'string', default: join(repoRoot, 'models') },
    'duration-s': { type: 'string', default: '2' },
    'warmup-s': { type: 'string', default: '0.5' },
    rounds: { type: 'string', default: '3' },
    report: { type: 'string', default: 'median' },
    concurrency: { type: 'string', default: '64' },
    'intra-op-threads': { type: 'string', default: '0' },
    device: { type: 'string', default: 'cpu' },
    requests: { type: 'string', default: '4096' },
    seed: { type: 'string', default: '1234' },
    texts: { type: 'boolean', default: false },
    ids: { type: 'boolean', default: false },
    'skip-http': { type: 'boolean', default: false },
    'http-only': { type: 'boolean', default: false },
    'http-clients': { type: 'string', default: '1,64' },
    'http-client': { type: 'string', default: 'http' },
    ws: { type: 'string', default: '1x64,4x16' },
    'skip-ws': { type: 'boolean', default: false },
    'skip-floor': { type: 'boolean', default: false },
    'extra-intra': { type: 'string', default: '1,2' },
    'skip-extra': { type: 'boolean', default: false },
    json: { type: 'string' },
    help: { type: 'boolean', short: 'h', default: false },
  },
  strict: true,
});
if (args.help) {
  console.log(HELP);
  process.exit(0);
}


const MODEL = args.model!;
const MODELS_DIR = resolve(args['models-dir']!);
const DURATION_MS = num('duration-s', args['duration-s']!, 0.1) * 1000;
const WARMUP_MS = num('warmup-s', args['warmup-s']!, 0) * 1000;
const ROUNDS = num('rounds', args.rounds!, 1, true);
const CONCURRENCY = num('concurrency', args.concurrency!, 1, true);
const INTRA = num('intra-op-threads', args['intra-op-threads']!, 0, true);
/** Intra-op thread counts of the extra table: --intra-op-threads first, then the others. */
const INTRAS = [
  INTRA,
  ...numList('extra-intra', args['extra-intra']!, 0, true),
].filter((v, i, a) => a.indexOf(v) === i);
const DEVICE = args.device!;
const N_SEQS = num('requests', args.requests!, 64, true);
const SEED = num('seed', args.seed!, 0, true);
const TEXTS = args.texts!;
const REPORT = args.report!;
if (REPORT !== 'median' && REPORT !== 'best') {
  console.error(`--report: expected median or best, got "${REPORT}"`);
  process.exit(2);
}
const IDS = args.ids!;
if (IDS && TEXTS) {
  console.error('--ids and --texts exclude each other');
  process.exit(2);
}
if (args['http-only'] && (args['skip-http'] || IDS)) {
  console.error('--http-only needs the HTTP rows: not with --skip-http or --ids');
  process.exit(2);
}
const HTTP_ONLY = args['http-only']!;
const HTTP = !args['skip-http'] && !IDS;
const ENGINES = !HTTP_ONLY;
const EXTRA = !args['skip-extra'] && !HTTP_ONLY;
const HTTP_CLIENTS = numList('http-clients', args['http-clients']!, 1, true).filter((v, i, a) => a.indexOf(v) === i);
const HTTP_CLIENT = args['http-client']! as ClientKind;
if (HTTP_CLIENT !== 'http' && HTTP_CLIENT !== 'undici') {
  console.error(`--http-client: expected http or undici, got "${HTTP_CLIENT}"`);
  process.exit(2);
}
/** WebSocket configurations: sockets x requests in flight per socket. */
const WS_CONFIGS = (args['skip-ws'] ? '' : args.ws!)
  .split(',')
  .filter((x) => x.trim() !== '')
  .map((x) => {
    const m = /^\s*(\d+)x(\d+)\s*$/.exec(x);
    if (!m || Number(m[1]) < 1 || Number(m[2]) < 1) {
      console.error(`--ws: expected SOCKETSxIN_FLIGHT (e.g. 1x64), got "${x}"`);
      process.exit(2);
    }
    return { sockets: Number(m[1]), depth: Number(m[2]) };
  });
const WS = HTTP && WS_CONFIGS.length > 0;
const RAW_BATCHES = [1, 8, 32];
const MIN_LEN = 8; // tokens, [CLS] and [SEP] included
const MAX_LEN = 32;

// ---------------------------------------------------------------- workload


const randInt = (r: () => number, lo: number, hi: number) => lo + Math.floor(r() * (hi - lo + 1));

interface Seq {
  ids: Int32Array;
  typeIds: Int32Array;
  text?: string;
}

const CLS = 101;
const SEP = 102;

/** [CLS] random ids in 1000..29000 [SEP], lengths uniform in MIN_LEN..MAX_LEN. */
function tokenWorkload(r: () => number, n: number): Seq[] {
  return Array.from({ length: n }, () => {
    const len = randInt(r, MIN_LEN, MAX_LEN);
    const ids = new Int32Array(len);
    ids[0] = CLS;
    for (let i = 1; i < len - 1; i++) ids[i] = randInt(r, 1000, 29000);
    ids[len - 1] = SEP;
    return { ids, typeIds: new Int32Array(len) };
  });
}

/** Short English-looking texts from vocabulary words, kept when they tokenize to MIN_LEN..MAX_LEN tokens. */
async function textWorkload(r: () => number, n: number, spec: ModelSpec): Promise<Seq[]> {
  const tokenizer = await loadTokenizer(spec.tokenizerPath);
  const vocab = bertUncasedVocab();
  const words = vocab.filter((t) => /^[a-z]{2,}$/.test(t));
  const pieces = vocab.filter((t) => /^##[a-z]{2,}$/.test(t)).map((t) => t.slice(2));
  const pick = <T>(xs: readonly T[]) => xs[Math.floor(r() * xs.length)]!;
  const out: Seq[] = [];
  while (out.length < n) {
    const target = randInt(r, MIN_LEN, MAX_LEN);
    const parts: string[] = [];
    for (let i = 0; i < Math.max(1, Math.round((target - 2) * 0.8)); i++) {
      let w = pick(words);
      if (r() < 0.15) w += pick(pieces);
      if (i === 0) w = w[0]!.toUpperCase() + w.slice(1);
      if (r() < 0.1) w += pick([',', ';', '.']);
      parts.push(w);
    }
    const text = parts.join(' ') + pick(['.', '?', '!']);
    const enc = tokenizer.encode(text, { maxLength: spec.maxLength, truncate: false });
    if (enc.ids.length < MIN_LEN || enc.ids.length > MAX_LEN) continue;
    out.push({ ids: enc.ids, typeIds: enc.typeIds, text });
  }
  return out;
}

// ---------------------------------------------------------------- results

interface PhaseResult {
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
  /** http and ws: the load generator (this process) and its connections. */
  client?: { cores: number; elu: number; cpuUsPerReq: number; connections: number | null };
  /** ws only: sockets and requests in flight per socket. */
  ws?: { sockets: number; depth: number };
  sequences: number;
  batches: number;
  errors: number;
  windowMs: number;
}

function histogram() {
  return hdr.build({ numberOfSignificantValueDigits: 3, lowestDiscernibleValue: 1 });
}

const cpuMs = (u: NodeJS.CpuUsage) => (u.user + u.system) / 1000;
const sleep = (ms: number) => new Promise<void>((res) => setTimeout(res, ms));

// ---------------------------------------------------------------- raw onnxruntime

async function runRaw(config: string, round: number, session: ort.InferenceSession, batches: RawBatch[]): Promise<PhaseResult> {
  const h = histogram();
  const r = await runRawLoop(session, batches, WARMUP_MS, DURATION_MS, h);
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

/** The engine's summed session.run time, ms. */
const DEFAULT_INFLIGHT = ENGINE_DEFAULTS.maxInflightBatches;

function runMsCounter(engine: Engine, model: string): number {
  return engine.stats()[model]!.runMs;
}

async function runEngine(config: string, round: number, engine: Engine, seqs: Seq[], concurrency: number): Promise<PhaseResult> {
  let cursor = 0;
  let stop = false;
  let windowStart = Infinity;
  let windowEnd = Infinity;
  let done = 0;
  let errors = 0;
  let firstError: unknown;
  const h = histogram();
  const call = TEXTS
    ? (s: Seq) => engine.embed(s.text!, { model: MODEL })
    : (s: Seq) => engine.runTokens(MODEL, [s]);
  const caller = async () => {
    while (!stop) {
      const s = seqs[cursor++ % seqs.length]!;
      const t0 = performance.now();
      try {
        await call(s);
      } catch (err) {
        errors++;
        firstError ??= err;
        continue;
      }
      const t1 = performance.now();
      if (t1 >= windowStart && t1 < windowEnd) {
        h.recordValue(Math.max(1, Math.round((t1 - t0) * 1000)));
        done++;
      }
    }
  };
  const callers = Array.from({ length: concurrency }, caller);
  await sleep(WARMUP_MS);
  const s0 = engine.stats()[MODEL]!;
  const r0 = runMsCounter(engine, MODEL);
  const cpu0 = process.cpuUsage();
  windowStart = performance.now();
  await sleep(DURATION_MS);
  windowEnd = performance.now();
  const s1 = engine.stats()[MODEL]!;
  const r1 = runMsCounter(engine, MODEL);
  const cpu = cpuMs(process.cpuUsage(cpu0));
  stop = true;
  await Promise.all(callers);
  if (errors > 0) console.error(`  ${config}: ${errors} requests failed, first: ${(firstError as Error)?.message ?? String(firstError)}`);
  const windowMs = windowEnd - windowStart;
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
    ortMsPerBatch: r0 !== null && r1 !== null ? (r1 - r0) / batches : null,
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

// ---------------------------------------------------------------- http

/**
 * One closed-loop phase against a server over HTTP keep-alive (`clients`
 * callers, one connection each) or /ws (`ws.sockets` sockets x `ws.depth` in
 * flight), through the suite's load generator (bench/load.ts). A fresh client
 * per phase: uWS closes connections idle for 10 s, and the other phases in
 * between take longer than that; connecting happens during the warm-up.
 */
async function runServer(
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
      model: MODEL,
      transport: ws ? 'ws' : 'http',
      workload,
      arrivals: { kind: 'closed', concurrency: clients },
      warmupMs: WARMUP_MS,
      durationMs: DURATION_MS,
      client: HTTP_CLIENT,
      ...(ws ? { ws: { sockets: ws.sockets, depth: ws.depth }, rowBytes: ws.rowBytes } : {}),
    },
    rng(SEED + round),
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
      client: { cores: r.clientCpuMs / r.windowMs, elu: r.clientElu, cpuUsPerReq: (r.clientCpuMs * 1000) / r.requests, connections: r.connections },
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

/** Before timing over /ws: the f32 rows must be the vectors POST /embed answers (same server). */
async function checkWs(server: ServerProcess, seqs: Seq[], n = 4): Promise<{ line: string; rowBytes: number }> {
  const client = await createLoadClient(HTTP_CLIENT, server.origin, 1);
  try {
    let maxDiff = 0;
    let dim = 0;
    for (const s of seqs.slice(0, n)) {
      const r = await client.post('/embed', Buffer.from(JSON.stringify({ inputs: s.text })));
      if (r.status !== 200) throw new Error(`ws check: POST /embed answered ${r.status}`);
      const want = (JSON.parse(r.body.toString('utf8')) as number[][])[0]!;
      const got = await embedOnce(server.origin, s.text!);
      if (got.length !== want.length) throw new Error(`ws check: /ws answered ${got.length} dimensions, POST /embed ${want.length}`);
      dim = got.length;
      want.forEach((v, i) => (maxDiff = Math.max(maxDiff, Math.abs(v - got[i]!))));
    }
    if (maxDiff > 1e-5) throw new Error(`ws check: /ws f32 rows differ from POST /embed by up to ${maxDiff}`);
    return { line: `${n} texts over /ws (f32, ${dim} dims) = POST /embed (max diff ${maxDiff.toExponential(1)})`, rowBytes: 4 * dim };
  } finally {
    await client.close();
  }
}

/**
 * Before timing: the server must compute what raw computes. Sends `n` texts one by one and
 * checks the server counted exactly the tokens of the bench's own tokenization, and (with an
 * engine at hand) that the vectors match engine.embed of the same texts.
 */
async function checkServer(name: string, server: ServerProcess, seqs: Seq[], engine: Engine | undefined, n = 16): Promise<string> {
  const client = await createLoadClient(HTTP_CLIENT, server.origin, 1);
  try {
    const before = await server.counters(MODEL);
    let maxDiff = 0;
    for (const s of seqs.slice(0, n)) {
      const r = await client.post('/embed', Buffer.from(JSON.stringify({ inputs: s.text })));
      if (r.status !== 200) throw new Error(`${name}: POST /embed answered ${r.status}: ${r.body.toString('utf8').slice(0, 300)}`);
      const got = JSON.parse(r.body.toString('utf8')) as number[][];
      if (engine) {
        const want = (await engine.embed(s.text!, { model: MODEL }))[0]!;
        if (got[0]!.length !== want.length) throw new Error(`${name}: ${got[0]!.length} dimensions, engine ${want.length}`);
        want.forEach((v, i) => (maxDiff = Math.max(maxDiff, Math.abs(v - got[0]![i]!))));
      }
    }
    const after = await server.counters(MODEL);
    const want = seqs.slice(0, n).reduce((a, s) => a + s.ids.length, 0);
    const real = after.realTokens - before.realTokens;
    if (real !== want) throw new Error(`${name}: the server computed ${real} real tokens for ${n} texts, the bench's tokenization has ${want}`);
    if (maxDiff > 1e-4) throw new Error(`${name}: vectors differ from engine.embed by up to ${maxDiff}`);
    return `${n} texts, ${real} tokens as tokenized here${engine ? `, vectors = engine.embed (max diff ${maxDiff.toExponential(1)})` : ''}`;
  } finally {
    await client.close();
  }
}

// ---------------------------------------------------------------- table

function fmt(v: number | null | undefined, digits: number): string {
  if (v === null || v === undefined || !Number.isFinite(v)) return '-';
  return v.toFixed(digits);
}

function table(headers: string[], rows: string[][], rightFrom = 1): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) =>
    '| ' + cells.map((c, i) => (i < rightFrom ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join(' | ') + ' |';
  const sep = '|' + widths.map((w, i) => (i < rightFrom ? '-'.repeat(w + 2) : '-'.repeat(w + 1) + ':')).join('|') + '|';
  return [line(headers), sep, ...rows.map(line)].join('\n');
}

// ---------------------------------------------------------------- main

interface EngineConfig {
  name: string;
  maxBatchSize?: number;
  maxInflightBatches: number;
  intraOpThreads: number;
}

async function main(): Promise<void> {
  const started = performance.now();
  const spec = loadModelSpec(join(MODELS_DIR, MODEL), MODEL);
  const ortVersion = (require('onnxruntime-node/package.json') as { version: string }).version;
  const modelConfig = JSON.parse(readFileSync(join(spec.dir, 'config.json'), 'utf8')) as { num_hidden_layers?: number };
  const machine = {
    cpu: cpus()[0]?.model ?? 'unknown',
    cores: cpus().length,
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    node: process.version,
    onnxruntime: ortVersion,
    platform: `${process.platform}-${process.arch}`,
    loadavg: loadavg().map((x) => Number(x.toFixed(2))),
  };

  const batching = resolveBatching(spec, {});
  const buckets = batching.buckets;
  const r = rng(SEED);
  const seqs = IDS ? tokenWorkload(r, N_SEQS) : await textWorkload(r, N_SEQS, spec);
  const lens = seqs.map((s) => s.ids.length);
  const bucketMix = buckets.map((T, b) => ({ T, n: seqs.filter((s) => bucketFor(buckets, s.ids.length) === b).length })).filter((x) => x.n > 0);

  console.log(`slabserve quick bench: ${MODEL} (${spec.task}, hidden ${spec.hiddenSize}, ${modelConfig.num_hidden_layers ?? '?'} layers)`);
  console.log(
    `machine: ${machine.cpu}, ${machine.cores} cores, ${machine.memoryGiB} GiB, node ${machine.node}, onnxruntime-node ${machine.onnxruntime}, ${machine.platform}, loadavg ${machine.loadavg.join(' ')}`,
  );
  const how = IDS
    ? 'random token sequences (raw: padded batches of them; engine: engine.runTokens)'
    : `generated texts, tokenized here by the model's tokenizer (raw: padded batches of their ids; engine: ${TEXTS ? 'engine.embed(text), tokenization included' : 'engine.runTokens(ids)'}` +
      `${HTTP ? '; http: POST /embed {"inputs": text}, the server tokenizes' : ''})`;
  console.log(
    `workload: ${seqs.length} ${how}, seed ${SEED}, ` +
      `${Math.min(...lens)}..${Math.max(...lens)} tokens (mean ${(lens.reduce((a, b) => a + b, 0) / lens.length).toFixed(1)}), ` +
      `buckets ${bucketMix.map((x) => `${x.T}:${((100 * x.n) / seqs.length).toFixed(0)}%`).join(' ')}`,
  );
  console.log(
    `phases: ${WARMUP_MS / 1000}s warm-up + ${DURATION_MS / 1000}s measured, ${ROUNDS} rounds in alternating order, ${REPORT} round reported; ` +
      `${ENGINES ? `engine: device ${DEVICE}, ${CONCURRENCY} closed-loop callers; ` : ''}` +
      `${HTTP ? `http: ${HTTP_CLIENTS.join(' and ')} clients, one keep-alive connection each (${HTTP_CLIENT === 'http' ? 'node:http Agent' : 'undici Pool'}), server in a child process; ` : ''}` +
      `intra-op threads ${INTRA}${INTRA === 0 ? ' (onnxruntime default)' : ''}`,
  );

  // --- sessions, engines and servers, opened once and kept for every round
  const t = performance.now();
  const prepared = prepareModel(readFileSync(spec.onnxPath), spec);
  const openRaw = (intra: number) => openRawSession(prepared, DEVICE, intra);
  const rawSession = await openRaw(INTRA);
  /** Extra raw b=32 sessions, one per other intra-op setting. */
  const rawAlt = new Map<number, ort.InferenceSession>();
  if (EXTRA) for (const intra of INTRAS.slice(1)) rawAlt.set(intra, await openRaw(intra));
  const rawSets = new Map(RAW_BATCHES.map((b) => [b, rawBatches(seqs, buckets, b, prepared, rng(SEED + b))]));
  const rawMs = performance.now() - t;

  const engineConfigs: EngineConfig[] = [];
  if (ENGINES) {
    engineConfigs.push(
      { name: 'engine batched', maxInflightBatches: DEFAULT_INFLIGHT, intraOpThreads: INTRA },
      { name: 'engine maxBatchSize=1', maxBatchSize: 1, maxInflightBatches: DEFAULT_INFLIGHT, intraOpThreads: INTRA },
    );
  }
  if (EXTRA) {
    for (const intra of INTRAS) {
      for (const inflight of [1, 2]) {
        if (intra === INTRA && inflight === DEFAULT_INFLIGHT) continue; // that is 'engine batched'
        engineConfigs.push({ name: `engine inflight=${inflight} intra=${intra}`, maxInflightBatches: inflight, intraOpThreads: intra });
      }
    }
  }
  // Two servers, `slabserve serve` as a user runs it, on loopback: batching on (the defaults) and --max-batch-size 1.
  // Started now, so their warm-up overlaps the engines' (each start-up keeps one core busy).
  const HTTP_BATCHED = 'http batched';
  const HTTP_MBS1 = 'http maxBatchSize=1';
  const serverArgs = ['--host', '127.0.0.1', '--port', '0', '--models-dir', MODELS_DIR, '--model', MODEL, '--device', DEVICE, '--intra-op-threads', String(INTRA), '--max-inflight-batches', String(DEFAULT_INFLIGHT)];
  const cliPath = resolve(here, '..', 'src', 'cli.js');
  const t3 = performance.now();
  const starting = HTTP
    ? [
        [HTTP_BATCHED, startServerProcess({ cliPath, args: serverArgs })],
        [HTTP_MBS1, startServerProcess({ cliPath, args: [...serverArgs, '--max-batch-size', '1'] })],
      ] as const
    : [];
  for (const [, p] of starting) p.catch(() => {}); // awaited below
  const t2 = performance.now();
  // Every engine stays open for all rounds (an idle engine's inference thread only wakes every 250 ms),
  // so no phase pays for start-up. Opened one after the other: start-up is mostly warm-up runs, CPU-bound.
  const engines = new Map<string, Engine>();
  for (const c of engineConfigs) {
    const engine = await createEngine({
      modelsDir: MODELS_DIR,
      models: [MODEL],
      device: DEVICE,
      maxInflightBatches: c.maxInflightBatches,
      intraOpThreads: c.intraOpThreads,
      ...(c.maxBatchSize ? { batching: { maxBatchSize: c.maxBatchSize } } : {}),
      log: () => {},
    });
    engines.set(c.name, engine);
  }
  const engineStartMs = engineConfigs.length ? (performance.now() - t2) / engineConfigs.length : 0;
  const first = engines.values().next().value;
  console.log(
    `set-up: raw sessions + batches ${(rawMs / 1000).toFixed(1)}s` +
      (first
        ? `; createEngine ${(engineStartMs / 1000).toFixed(1)}s each x ${engineConfigs.length} (engine device: ${first.device.label}, ${first.device.name}); ` +
          `engine batching: maxBatchSize ${first.info()[0]!.batching.maxBatchSize}, maxBatchDelayMs ${first.info()[0]!.batching.maxBatchDelayMs}, maxBatchTokens ${first.info()[0]!.batching.maxBatchTokens}, buckets ${buckets.join(',')}`
        : ''),
  );

  const servers = new Map<string, ServerProcess>();
  const serverChecks: Record<string, string> = {};
  let serverReadyMs = 0;
  let wsRowBytes = 0;
  /** The HTTP and WebSocket rows' requests: one text each, bodies serialized before timing. */
  const workload: Workload = {
    name: 'short',
    description: 'quick.ts texts',
    requests: seqs.map((s) => [{ text: s.text!, ids: s.ids, typeIds: s.typeIds }]),
    bodies: seqs.map((s) => Buffer.from(JSON.stringify({ inputs: s.text }))),
    form: 'text',
  };
  if (HTTP) {
    try {
      for (const [name, p] of starting) servers.set(name, await p);
      serverReadyMs = performance.now() - t3;
      for (const [name, server] of servers) serverChecks[name] = await checkServer(name, server, seqs, engines.get('engine batched'));
      if (WS) {
        const c = await checkWs(servers.get(HTTP_BATCHED)!, seqs);
        serverChecks.ws = c.line;
        wsRowBytes = c.rowBytes;
      }
    } catch (err) {
      for (const [, p] of starting) await p.then((server) => server.stop(1000)).catch(() => {});
      for (const e of engines.values()) await e.close();
      throw err;
    }
    const line = (name: string) => servers.get(name)!.startLines.find((l) => l.includes('maxBatchSize=')) ?? '';
    console.log(
      `set-up: ${servers.size} x slabserve serve ${serverArgs.join(' ')} [--max-batch-size 1], ready ${(serverReadyMs / 1000).toFixed(1)}s after start${ENGINES ? ' (alongside the engines)' : ''}; ` +
        `${line(HTTP_BATCHED).replace(/^slabserve: /, '')} | ${line(HTTP_MBS1).replace(/^slabserve: model \S+ /, '')}`,
    );
    console.log(`check: ${Object.entries(serverChecks).map(([n, c]) => `${n}: ${c}`).join('; ')}`);
  }

  // --- phases, in alternating order
  const engineAt = (c: number) => (c === CONCURRENCY ? 'engine batched' : `engine batched c=${c}`);
  const httpAt = (name: string, c: number) => `${name} c=${c}`;
  const wsName = (sockets: number, depth: number) => `ws ${sockets}x${depth}`;
  type Phase = { name: string; run: (round: number) => Promise<PhaseResult> };
  const phases: Phase[] = [
    ...RAW_BATCHES.map((b) => ({ name: `raw b=${b}`, run: (round: number) => runRaw(`raw b=${b}`, round, rawSession, rawSets.get(b)!) })),
    ...[...rawAlt].map(([intra, session]) => ({
      name: `raw b=32 intra=${intra}`,
      run: (round: number) => runRaw(`raw b=32 intra=${intra}`, round, session, rawSets.get(32)!),
    })),
    ...engineConfigs.map((c) => ({ name: c.name, run: (round: number) => runEngine(c.name, round, engines.get(c.name)!, seqs, CONCURRENCY) })),
    // the in-process reference for each HTTP client count the engine rows above do not cover
    ...(HTTP && ENGINES
      ? HTTP_CLIENTS.filter((c) => c !== CONCURRENCY).map((c) => ({
          name: engineAt(c),
          run: (round: number) => runEngine(engineAt(c), round, engines.get('engine batched')!, seqs, c),
        }))
      : []),
    ...HTTP_CLIENTS.flatMap((c) =>
      [...servers].map(([name, server]) => ({ name: httpAt(name, c), run: (round: number) => runServer(httpAt(name, c), round, server, workload, c) })),
    ),
    ...(WS
      ? WS_CONFIGS.map(({ sockets, depth }) => ({
          name: wsName(sockets, depth),
          run: (round: number) => runServer(wsName(sockets, depth), round, servers.get(HTTP_BATCHED)!, workload, sockets * depth, { sockets, depth, rowBytes: wsRowBytes }),
        }))
      : []),
  ];
  const all: PhaseResult[] = [];
  const serverExits: Record<string, { code: number | null; signal: string | null }> = {};
  try {
    for (let round = 0; round < ROUNDS; round++) {
      const order = round % 2 === 0 ? phases : [...phases].reverse();
      const line: string[] = [];
      for (const p of order) {
        const res = await p.run(round);
        all.push(res);
        line.push(`${p.name} ${res.seqPerSec.toFixed(0)}`);
      }
      console.error(`round ${round + 1}/${ROUNDS} (seq/s): ${line.join(', ')}`);
    }
  } finally {
    // Every load client is closed by now (runHttp closes its own), so the servers can drain.
    for (const [name, server] of servers) {
      const exit = await server.stop();
      serverExits[name] = exit;
      if (exit.code !== 0) console.error(`warning: the ${name} server exited with code ${exit.code}, signal ${exit.signal} after SIGTERM`);
    }
    for (const e of engines.values()) await e.close();
    await rawSession.release();
    for (const session of rawAlt.values()) await session.release();
  }

  // --- the reported round per configuration (median or best by seq/s), and the spread between rounds
  const best = new Map<string, PhaseResult & { spreadPct: number; roundsSeqPerSec: number[] }>();
  for (const p of phases) {
    const runs = all.filter((x) => x.config === p.name).sort((a, b) => a.seqPerSec - b.seqPerSec);
    // median: the middle round (the faster middle one for an even count)
    const pick = REPORT === 'best' ? runs[runs.length - 1]! : runs[Math.floor(runs.length / 2)]!;
    const hi = runs[runs.length - 1]!.seqPerSec;
    const lo = runs[0]!.seqPerSec;
    best.set(p.name, { ...pick, spreadPct: (100 * (hi - lo)) / hi, roundsSeqPerSec: all.filter((x) => x.config === p.name).map((x) => x.seqPerSec) });
  }
  const get = (name: string) => best.get(name)!;
  const has = (name: string) => best.has(name);
  const mbs1 = ENGINES ? get('engine maxBatchSize=1').seqPerSec : NaN;
  const rawBest = Math.max(...RAW_BATCHES.map((b) => get(`raw b=${b}`).seqPerSec));
  const rawBestName = RAW_BATCHES.map((b) => `raw b=${b}`).find((n) => get(n).seqPerSec === rawBest)!;

  const headers = ['config', 'seq/s', 'spread', 'P50 ms', 'P99 ms', 'latency of', 'mean batch', 'pad eff', 'ms/batch', 'ORT ms/batch', 'cores', 'CPU us/seq', 'vs mbs=1', 'vs raw best'];
  const row = (name: string): string[] => {
    const x = get(name);
    return [
      name,
      fmt(x.seqPerSec, 0),
      `${fmt(x.spreadPct, 0)}%`,
      fmt(x.p50Ms, 2),
      fmt(x.p99Ms, 2),
      x.kind === 'raw' ? 'batch' : 'request',
      fmt(x.meanBatch, 1),
      `${fmt(100 * x.paddingEfficiency, 0)}%`,
      fmt(x.msPerBatch, 2),
      fmt(x.ortMsPerBatch, 2),
      fmt(x.cores, 2),
      fmt(x.cpuUsPerSeq, 0),
      x.kind === 'engine' ? `${fmt(x.seqPerSec / mbs1, 2)}x` : '',
      `${fmt(x.seqPerSec / rawBest, 2)}x`,
    ];
  };
  const mainNames = [...RAW_BATCHES.map((b) => `raw b=${b}`), ...(ENGINES ? ['engine batched', 'engine maxBatchSize=1'] : [])];
  console.log('');
  console.log(`## ${MODEL}: raw onnxruntime${ENGINES ? ' vs engine' : ''} (intra-op threads ${INTRA}, engine maxInflightBatches ${DEFAULT_INFLIGHT})`);
  console.log('');
  console.log(table(headers, mainNames.map(row)));
  console.log('');
  const gain = ENGINES ? get('engine batched').seqPerSec / mbs1 : NaN;
  const vsRaw = ENGINES ? get('engine batched').seqPerSec / rawBest : NaN;
  if (ENGINES) console.log(`batching gain (engine batched / engine maxBatchSize=1): ${gain.toFixed(2)}x; engine/raw (engine batched / ${rawBestName}): ${vsRaw.toFixed(2)}x`);

  if (EXTRA) {
    const extraNames = [
      'raw b=32',
      ...INTRAS.slice(1).map((i) => `raw b=32 intra=${i}`),
      ...INTRAS.flatMap((i) => [i === INTRA ? 'engine batched' : `engine inflight=1 intra=${i}`, `engine inflight=2 intra=${i}`]),
    ];
    const label = (n: string) => (n === 'engine batched' ? `engine inflight=${DEFAULT_INFLIGHT} intra=${INTRA}` : n === 'raw b=32' ? `raw b=32 intra=${INTRA}` : n);
    const base = get('engine batched').seqPerSec;
    const xHeaders = ['config', 'seq/s', 'spread', 'P50 ms', 'P99 ms', 'mean batch', 'ms/batch', 'ORT ms/batch', 'cores', 'CPU us/seq', 'vs default'];
    const xRows = extraNames.map((n) => {
      const x = get(n);
      return [
        label(n) + (n === 'engine batched' ? ' (default)' : ''),
        fmt(x.seqPerSec, 0),
        `${fmt(x.spreadPct, 0)}%`,
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
    console.log('');
    console.log(`## engine defaults: maxInflightBatches x intraOpThreads (batching on, ${CONCURRENCY} callers)`);
    console.log('');
    console.log(table(xHeaders, xRows));
  }

  // --- HTTP table: the server over loopback, beside raw and the in-process engine
  const httpDerived: Record<string, unknown> = {};
  if (HTTP) {
    const names: string[] = [rawBestName];
    for (const c of HTTP_CLIENTS) {
      if (ENGINES) {
        names.push(engineAt(c));
        if (c === CONCURRENCY) names.push('engine maxBatchSize=1');
      }
      names.push(httpAt(HTTP_BATCHED, c), httpAt(HTTP_MBS1, c));
    }
    /** The row batching gain divides by, and the in-process row the HTTP row compares with. */
    const unbatchedOf = (n: string, x: PhaseResult): string | null =>
      x.kind === 'http' ? httpAt(HTTP_MBS1, x.concurrency!) : n === 'engine batched' || n === 'engine maxBatchSize=1' ? 'engine maxBatchSize=1' : null;
    const engineOf = (n: string, x: PhaseResult): string | null =>
      x.kind !== 'http' ? null : n.startsWith(HTTP_MBS1) ? (x.concurrency === CONCURRENCY ? 'engine maxBatchSize=1' : null) : engineAt(x.concurrency!);
    const ratio = (a: number, name: string | null) => (name && has(name) ? `${fmt(a / get(name).seqPerSec, 2)}x` : '');
    const hHeaders = ['config', 'clients', 'req/s', 'spread', 'P50 ms', 'P99 ms', 'latency of', 'mean batch', 'ORT us/seq', 'cores', 'CPU us/req', 'client cores', 'client ELU', 'conns', 'batching gain', 'vs engine', 'vs raw best'];
    const hRows = names.map((n) => {
      const x = get(n);
      return [
        n.replace(/ c=\d+$/, ''),
        x.concurrency === null ? '' : String(x.concurrency),
        fmt(x.seqPerSec, 0),
        `${fmt(x.spreadPct, 0)}%`,
        fmt(x.p50Ms, 2),
        fmt(x.p99Ms, 2),
        x.kind === 'raw' ? 'batch' : 'request',
        fmt(x.meanBatch, 1),
        fmt(x.ortMsPerBatch === null ? null : (1000 * x.ortMsPerBatch) / x.meanBatch, 0),
        fmt(x.cores, 2),
        fmt(x.cpuUsPerSeq, 0),
        x.client ? fmt(x.client.cores, 2) : '',
        x.client ? `${fmt(100 * x.client.elu, 0)}%` : '',
        x.client ? fmt(x.client.connections, 0) : '',
        ratio(x.seqPerSec, unbatchedOf(n, x)),
        ratio(x.seqPerSec, engineOf(n, x)),
        `${fmt(x.seqPerSec / rawBest, 2)}x`,
      ];
    });
    console.log('');
    console.log(`## ${MODEL} over HTTP: slabserve serve (child process, 127.0.0.1, POST /embed with one text, JSON) beside ${rawBestName} and the in-process engine`);
    console.log('');
    console.log(table(hHeaders, hRows, 1));
    console.log('');
    for (const c of HTTP_CLIENTS) {
      const b = get(httpAt(HTTP_BATCHED, c));
      const u = get(httpAt(HTTP_MBS1, c));
      const e = ENGINES ? get(engineAt(c)) : null;
      // The two rows run back to back in every round: their ratio round by round shows how much of the gain is noise.
      const paired = Array.from({ length: ROUNDS }, (_, round) => {
        const find = (name: string) => all.find((x) => x.config === name && x.round === round)!.seqPerSec;
        return find(httpAt(HTTP_BATCHED, c)) / find(httpAt(HTTP_MBS1, c));
      });
      httpDerived[`c${c}`] = {
        batchingGain: b.seqPerSec / u.seqPerSec,
        batchingGainByRound: paired,
        serverVsRaw: b.seqPerSec / rawBest,
        p50BatchedMs: b.p50Ms,
        p50UnbatchedMs: u.p50Ms,
        ...(e ? { vsEngine: b.seqPerSec / e.seqPerSec, p50EngineMs: e.p50Ms } : {}),
      };
      console.log(
        `${c} client${c > 1 ? 's' : ''}: batching gain ${fmt(b.seqPerSec / u.seqPerSec, 2)}x (round by round ${paired.map((x) => fmt(x, 2)).join(' ')}; ` +
          `P50 ${fmt(b.p50Ms, 2)} ms batched, ${fmt(u.p50Ms, 2)} ms maxBatchSize=1); ` +
          `server/raw ${fmt(b.seqPerSec / rawBest, 2)}x` +
          (e ? `; HTTP/engine ${fmt(b.seqPerSec / e.seqPerSec, 2)}x, P50 ${fmt(b.p50Ms - e.p50Ms, 2)} ms over the engine's` : '') +
          `; server ${fmt(b.cpuUsPerSeq, 0)} us CPU per request (${rawBestName}: ${fmt(get(rawBestName).cpuUsPerSeq, 0)} us per sequence), load generator ${fmt(b.client!.cpuUsPerReq, 0)} us`,
      );
      for (const x of [b, u]) {
        if (x.client?.connections !== null && x.client?.connections !== c) console.log(`  note: ${x.config} opened ${x.client?.connections} connections for ${c} clients`);
      }
    }
  }

  // --- WebSocket table: the same batched server, pipelined sockets beside HTTP keep-alive at as many requests in flight
  const wsDerived: Record<string, unknown> = {};
  if (WS) {
    const httpRef = (inflight: number) => (has(httpAt(HTTP_BATCHED, inflight)) ? httpAt(HTTP_BATCHED, inflight) : null);
    const refs = [...new Set(WS_CONFIGS.map((w) => httpRef(w.sockets * w.depth)).filter((n): n is string => n !== null))];
    const names = [...refs, ...WS_CONFIGS.map((w) => wsName(w.sockets, w.depth))];
    const r2 = (a: number, b: number | undefined) => (b === undefined || !Number.isFinite(a / b) ? '' : `${fmt(a / b, 2)}x`);
    const wHeaders = ['config', 'conns', 'in flight', 'req/s', 'spread', 'P50 ms', 'P99 ms', 'mean batch', 'cores', 'CPU us/req', 'client us/req', 'client cores', 'req/s ws/http', 'P50 ws/http', 'P99 ws/http', 'CPU/req ws/http', 'by round (req/s)'];
    const wRows = names.map((n) => {
      const x = get(n);
      const ref = x.kind === 'ws' ? httpRef(x.concurrency!) : null;
      const h = ref ? get(ref) : undefined;
      // ws/http req/s round by round: both rows ran in every round, a few seconds apart
      const byRound = ref
        ? Array.from({ length: ROUNDS }, (_, round) => {
            const find = (name: string) => all.find((y) => y.config === name && y.round === round)!.seqPerSec;
            return find(n) / find(ref);
          })
        : [];
      if (x.kind === 'ws') wsDerived[n] = { vsHttp: ref, reqPerSecRatio: h ? x.seqPerSec / h.seqPerSec : null, byRound, p50Ratio: h ? x.p50Ms / h.p50Ms : null, p99Ratio: h ? x.p99Ms / h.p99Ms : null, cpuPerReqRatio: h ? x.cpuUsPerSeq / h.cpuUsPerSeq : null };
      return [
        x.kind === 'ws' ? `${n} (${x.ws!.sockets} socket${x.ws!.sockets > 1 ? 's' : ''} x ${x.ws!.depth} pipelined)` : `${n.replace(/ c=\d+$/, '')} (${x.concurrency} keep-alive clients)`,
        x.client ? fmt(x.client.connections, 0) : '',
        String(x.concurrency),
        fmt(x.seqPerSec, 0),
        `${fmt(x.spreadPct, 0)}%`,
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
    console.log('');
    console.log(`## ${MODEL} over WebSocket: the same 'http batched' server, /ws, one text per request, msgpack, encoding f32 (ws + msgpackr client, bench/ws-load.ts)`);
    console.log('');
    console.log(table(wHeaders, wRows, 1));
    const missing = WS_CONFIGS.filter((w) => !httpRef(w.sockets * w.depth));
    if (missing.length) console.log(`note: no 'http batched' row at ${missing.map((w) => w.sockets * w.depth).join(', ')} clients to compare with (add it to --http-clients)`);
  }

  console.log('');
  console.log(`columns:
  seq/s, req/s  sequences (= requests: one sequence each) answered per second in the measured window (${REPORT} of ${ROUNDS} rounds; other columns from that round)
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
  client cores  http rows: the load generator's CPU (this process) / wall time; client ELU: its event loop's utilization
  conns         http rows: TCP connections the client opened in the phase (one per client: keep-alive held); ws rows: sockets
  in flight     (WebSocket table) requests in flight at once: http clients, or ws sockets x requests pipelined per socket
  client us/req the load generator's CPU per request (this process)
  x ws/http     (WebSocket table) the ws row / 'http batched' with as many clients as the ws row has requests in flight;
                by round: req/s ws/http in each round (both rows run in every round)
  vs mbs=1      this row / engine maxBatchSize=1: the batching gain on the 'engine batched' row
  batching gain (HTTP table) batched / maxBatchSize=1 at the same number of clients
  vs engine     (HTTP table) this row / the in-process engine with the same batching and the same number of callers
  vs raw best   this row / the best raw row (${rawBestName}): how close the engine (or the server) gets to calling onnxruntime directly
  vs default    this row / the default engine (maxInflightBatches ${DEFAULT_INFLIGHT}, intraOpThreads ${INTRA})`);
  let floor: FloorRow[] | null = null;
  if (HTTP && !args['skip-floor']) {
    // The floor (bench/floor.ts): the gateway's CPU per request against a server doing only its unavoidable work.
    floor = floorRows(
      await runFloorCase({
        cliPath: join(repoRoot, 'dist', 'src', 'cli.js'),
        modelsDir: MODELS_DIR,
        model: MODEL,
        rounds: ROUNDS,
        warmupMs: WARMUP_MS,
        durationMs: DURATION_MS,
        clients: HTTP_CLIENTS,
        transports: WS ? ['http', 'ws'] : ['http'],
        forms: ['text', 'ids'],
        seed: SEED,
      }),
    );
    console.log('');
    console.log(`## ${MODEL}: CPU per request by thread, slabserve beside the floor (read, tokenize, serialise; no batching, no model), median of ${ROUNDS} rounds`);
    console.log('');
    console.log(floorTable(floor));
  }
  console.log(`total time ${((performance.now() - started) / 1000).toFixed(0)}s`);

  if (args.json) {
    const out = {
      machine,
      options: {
        report: REPORT,
        model: MODEL,
        durationS: DURATION_MS / 1000,
        warmupS: WARMUP_MS / 1000,
        rounds: ROUNDS,
        concurrency: CONCURRENCY,
        intraOpThreads: INTRA,
        device: DEVICE,
        texts: TEXTS,
        ids: IDS,
        seed: SEED,
        requests: N_SEQS,
        http: HTTP ? { clients: HTTP_CLIENTS, client: HTTP_CLIENT } : null,
        ws: WS ? WS_CONFIGS : null,
      },
      workload: { sequences: seqs.length, minTokens: Math.min(...lens), maxTokens: Math.max(...lens), bucketMix },
      setup: { rawMs, engineStartMs, serverReadyMs, serverChecks, serverExits },
      reported: Object.fromEntries(best),
      derived: { batchingGain: gain, engineVsRaw: vsRaw, rawBest: rawBestName, http: httpDerived, ws: wsDerived },
      rounds: all,
      floor,
    };
    writeFileSync(args.json, JSON.stringify(out, null, 2) + '\n');
    console.log(`wrote ${args.json}`);
  }
}

await main();
