/**
 * Scheduling benchmark (issue #5): what the batch window and the latency target
 * (--slo-p99-ms) do to latency, batch fill, shedding and timeouts under
 * open-loop load, on the in-process engine (createEngine, runTokens: no
 * tokenization, no HTTP).
 *
 *   npx tsc -p tsconfig.json && node dist/models/generate.js --missing
 *   node dist/bench/scheduling.js                 # full run: about 5-6 min on 2 cores
 *   node dist/bench/scheduling.js --quick         # about 1 min: 1 round, loads 60 and 120%, bursts at 60%
 *   node dist/bench/scheduling.js --json bench/results/scheduling.json
 *   node dist/bench/scheduling.js --help
 *
 * What runs:
 *   workload   a fixed-seed list of token sequences, 8..512 tokens with [CLS]/[SEP]: 80% "queries"
 *              (log-normal, median 16 tokens) and 20% "passages" (log-normal, median 160, clipped to 512)
 *   capacity   first, a short closed-loop run (--capacity-concurrency callers) on the first
 *              configuration's engine: requests/s it answers when never idle. Offered loads are
 *              percentages of it (--capacity RPS skips the measurement).
 *   phases     open loop: arrival times are drawn in advance (seeded), the same for every
 *              configuration within a round, and each request is sent at its time whatever
 *              happened to earlier ones. Patterns: `poisson` (exponential gaps at the mean rate)
 *              and `burst` (on/off: --burst-factor x the mean rate for --burst-duty of every
 *              --burst-period-ms, the rest of the period at the rate that keeps the mean; with
 *              5 x 20% that is silence). Latency runs from the *scheduled* arrival to the answer
 *              (coordinated omission corrected: if the generator falls behind, the lag counts),
 *              and each request's deadline (--deadline-ms) also runs from its scheduled arrival.
 *              Only requests scheduled inside the measured window count; the engine's counters
 *              (batches, rows, tokens) are read at both ends of that window.
 *   configs    one engine per configuration, all opened before any timing and kept open; every
 *              (pattern, load) cell runs each configuration once per round, in the order
 *              A B C ... then C B A ... in the next round, so drift on a shared box hits all alike.
 *
 * Configurations (--configs, comma separated):
 *   fixed:D[:I[:N]]   maxBatchDelayMs D, maxInflightBatches I (default 1), no latency target
 *   slo:T[:I[:N]]     sloP99Ms T, maxInflightBatches I (default 1)
 *   (N: maxBatchTokens, default the engine's 16384)
 * With maxInflightBatches 1 (the default: onnxruntime-node runs a session synchronously) the
 * scheduler is only asked when the device is idle, so a batch closes at once and maxBatchDelayMs
 * never applies (docs/architecture.md): one `fixed:5:1` row stands for every fixed window there.
 * The fixed windows act only with 2 batches in flight, hence the fixed:D:2 rows.
 */
import { writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, loadavg, totalmem } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import hdr from 'hdr-histogram-js';
import { createEngine, type Engine, type ModelStats } from '../src/engine.js';
import { batchCapacity, bucketFor, type BatchingOptions } from '../src/gpu-worker/scheduler.js';
import { SlabserveError } from '../src/shared/errors.js';
import { mulberry32 } from '../src/modelgen/rng.js';
import { fail, num, numList } from './args.js';

type Histogram = ReturnType<typeof hdr.build>;

const here = dirname(fileURLToPath(import.meta.url));
const repoRoot = resolve(here, '..', '..'); // dist/bench/scheduling.js -> the repo root
const require = createRequire(import.meta.url);

// ---------------------------------------------------------------- options

const HELP = `usage: node dist/bench/scheduling.js [options]
  --model NAME              model folder under --models-dir (default tiny-embed)
  --models-dir DIR          (default <repo>/models)
  --device D                engine device (default cpu)
  --intra-op-threads N      onnxruntime intra-op threads per engine (default 0: onnxruntime's choice)
  --configs LIST            fixed:DELAY_MS[:INFLIGHT[:MAX_BATCH_TOKENS]] and slo:TARGET_MS[:INFLIGHT[:MAX_BATCH_TOKENS]],
                            comma separated
                            (default fixed:5:1,fixed:0:2,fixed:5:2,fixed:20:2,slo:25,slo:50);
                            the first is the reference for the ratio columns and runs the capacity probe
  --loads LIST              Poisson offered loads, % of capacity (default 30,60,90,120; quick: 60,120)
  --burst-loads LIST        on/off burst loads, % of capacity as a mean (default 30,60; quick: 60; "" for none)
  --burst-factor X          rate during a burst / mean rate (default 5)
  --burst-duty F            share of each period in a burst (default 0.2)
  --burst-period-ms MS      burst period (default 1000)
  --deadline-ms MS          each request's deadline from its scheduled arrival (default 1000)
  --warmup-s S              warm-up seconds of each phase, not measured (default 1; quick: 0.5)
  --duration-s S            measured seconds of each phase (default 3; quick: 2)
  --rounds N                rounds, alternating configuration order (default 2; quick: 1)
  --capacity RPS            skip the capacity probe and use this many requests/s as 100%
  --capacity-s S            measured seconds of the capacity probe (default 3; quick: 2)
  --capacity-concurrency N  closed-loop callers of the capacity probe (default 128)
  --requests N              workload size: sequences generated from the seed (default 8192)
  --seed N                  workload and arrival seed (default 1234)
  --quick                   the shorter defaults marked quick above (~1 min)
  --json PATH               also write every phase's raw numbers as JSON`;

const { values: args } = parseArgs({
  options: {
    model: { type: 'string', default: 'tiny-embed' },
    'models-dir': { type: 'string', default: join(repoRoot, 'models') },
    device: { type: 'string', default: 'cpu' },
    'intra-op-threads': { type: 'string', default: '0' },
    configs: { type: 'string', default: 'fixed:5:1,fixed:0:2,fixed:5:2,fixed:20:2,slo:25,slo:50' },
    loads: { type: 'string' },
    'burst-loads': { type: 'string' },
    'burst-factor': { type: 'string', default: '5' },
    'burst-duty': { type: 'string', default: '0.2' },
    'burst-period-ms': { type: 'string', default: '1000' },
    'deadline-ms': { type: 'string', default: '1000' },
    'warmup-s': { type: 'string' },
    'duration-s': { type: 'string' },
    rounds: { type: 'string' },
    capacity: { type: 'string' },
    'capacity-s': { type: 'string' },
    'capacity-concurrency': { type: 'string', default: '128' },
    requests: { type: 'string', default: '8192' },
    seed: { type: 'string', default: '1234' },
    quick: { type: 'boolean', default: false },
    json: { type: 'string' },
    help: { type: 'boolean', short: 'h', default: false },
  },
  strict: true,
});
if (args.help) {
  console.log(HELP);
  process.exit(0);
}

const QUICK = args.quick!;
const MODEL = args.model!;
const MODELS_DIR = resolve(args['models-dir']!);
const DEVICE = args.device!;
const INTRA = num('intra-op-threads', args['intra-op-threads']!, 0, true);
const LOADS = numList('loads', args.loads ?? (QUICK ? '60,120' : '30,60,90,120'), 1);
const BURST_LOADS = numList('burst-loads', args['burst-loads'] ?? (QUICK ? '60' : '30,60'), 1);
const BURST_FACTOR = num('burst-factor', args['burst-factor']!, 1);
const BURST_DUTY = num('burst-duty', args['burst-duty']!, 0.01);
if (BURST_DUTY > 1 || BURST_FACTOR * BURST_DUTY > 1 + 1e-9) fail(`--burst-factor x --burst-duty must be at most 1 (the burst alone would exceed the mean), got ${BURST_FACTOR} x ${BURST_DUTY}`);
const BURST_PERIOD_MS = num('burst-period-ms', args['burst-period-ms']!, 1);
const DEADLINE_MS = num('deadline-ms', args['deadline-ms']!, 1);
const WARMUP_MS = num('warmup-s', args['warmup-s'] ?? (QUICK ? '0.5' : '1'), 0) * 1000;
const DURATION_MS = num('duration-s', args['duration-s'] ?? (QUICK ? '2' : '3'), 0.1) * 1000;
const ROUNDS = num('rounds', args.rounds ?? (QUICK ? '1' : '2'), 1, true);
const CAPACITY_GIVEN = args.capacity === undefined ? null : num('capacity', args.capacity, 1);
const CAPACITY_MS = num('capacity-s', args['capacity-s'] ?? (QUICK ? '2' : '3'), 0.1) * 1000;
const CAPACITY_CONCURRENCY = num('capacity-concurrency', args['capacity-concurrency']!, 1, true);
const N_SEQS = num('requests', args.requests!, 64, true);
const SEED = num('seed', args.seed!, 0, true);

interface Config {
  name: string;
  kind: 'fixed' | 'slo';
  maxBatchDelayMs: number;
  maxInflightBatches: number;
  sloP99Ms?: number;
  /** maxBatchTokens override (default: the engine's). */
  maxBatchTokens?: number;
}

function parseConfig(s: string): Config {
  const m = /^(fixed|slo):(\d+(?:\.\d+)?)(?::(\d+)(?::(\d+))?)?$/.exec(s.trim());
  if (!m) fail(`--configs: expected fixed:DELAY_MS[:INFLIGHT[:MAX_BATCH_TOKENS]] or slo:TARGET_MS[:INFLIGHT[:MAX_BATCH_TOKENS]], got "${s}"`);
  const kind = m[1] as 'fixed' | 'slo';
  const v = Number(m[2]);
  const inflight = m[3] === undefined ? 1 : Number(m[3]);
  if (inflight < 1) fail(`--configs: inflight must be >= 1 in "${s}"`);
  const tokens = m[4] === undefined ? {} : { maxBatchTokens: Number(m[4]) };
  const suffix = m[4] === undefined ? '' : ` tok=${m[4]}`;
  if (kind === 'fixed') return { name: `fixed ${v}ms if=${inflight}${suffix}`, kind, maxBatchDelayMs: v, maxInflightBatches: inflight, ...tokens };
  if (!(v > 0)) fail(`--configs: a latency target must be > 0 in "${s}"`);
  return { name: `slo ${v}ms if=${inflight}${suffix}`, kind, maxBatchDelayMs: 5, maxInflightBatches: inflight, sloP99Ms: v, ...tokens };
}
const CONFIGS = args.configs!
  .split(',')
  .filter((x) => x.trim() !== '')
  .map(parseConfig);
if (CONFIGS.length === 0) fail('--configs: nothing to run');
if (new Set(CONFIGS.map((c) => c.name)).size !== CONFIGS.length) fail('--configs: a configuration is listed twice');

// ---------------------------------------------------------------- workload

interface Seq {
  ids: Int32Array;
  typeIds: Int32Array;
}

const CLS = 101;
const SEP = 102;
const MIN_LEN = 8;

function normal(r: () => number): number {
  const u1 = 1 - r(); // (0, 1]
  return Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * r());
}

/** 80% queries (log-normal, median 16 tokens, sigma 0.5), 20% passages (median 160, sigma 0.6); [CLS] ids [SEP], 8..maxLen. */
function workload(r: () => number, n: number, maxLen: number): Seq[] {
  return Array.from({ length: n }, () => {
    const passage = r() < 0.2;
    const raw = Math.round(Math.exp(Math.log(passage ? 160 : 16) + (passage ? 0.6 : 0.5) * normal(r)));
    const len = Math.min(maxLen, Math.max(MIN_LEN, raw));
    const ids = new Int32Array(len);
    ids[0] = CLS;
    for (let i = 1; i < len - 1; i++) ids[i] = 1000 + Math.floor(r() * 28001);
    ids[len - 1] = SEP;
    return { ids, typeIds: new Int32Array(len) };
  });
}

// ---------------------------------------------------------------- arrivals

interface Cell {
  /** e.g. "poisson 60%". */
  name: string;
  pattern: 'poisson' | 'burst';
  loadPct: number;
}

interface Schedule {
  /** Arrival times, ms from the phase start, ascending. */
  times: Float64Array;
  /** Index into the workload of each arrival. */
  seq: Uint32Array;
}

/** Arrivals per ms at time t (ms from the phase start), and when that rate next changes. */
function rateAt(cell: Cell, meanPerMs: number, t: number): { rate: number; until: number } {
  if (cell.pattern === 'poisson') return { rate: meanPerMs, until: Infinity };
  const period = BURST_PERIOD_MS;
  const on = BURST_DUTY * period;
  const start = Math.floor(t / period) * period;
  const inPeriod = t - start;
  if (inPeriod < on) return { rate: meanPerMs * BURST_FACTOR, until: start + on };
  const offRate = BURST_DUTY >= 1 ? 0 : (meanPerMs * Math.max(0, 1 - BURST_FACTOR * BURST_DUTY)) / (1 - BURST_DUTY);
  return { rate: offRate, until: start + period };
}

/** A Poisson process with the cell's piecewise-constant rate over [0, totalMs): exact (inverts the integrated rate). */
function schedule(cell: Cell, capacityPerS: number, totalMs: number, r: () => number, nSeqs: number): Schedule {
  const meanPerMs = (capacityPerS * cell.loadPct) / 100 / 1000;
  const times: number[] = [];
  let t = 0;
  let need = -Math.log(1 - r()); // Exp(1) of integrated rate until the next arrival
  while (t < totalMs) {
    const { rate, until } = rateAt(cell, meanPerMs, t);
    const end = Math.min(until, totalMs);
    const room = rate * (end - t);
    if (rate > 0 && room >= need) {
      t += need / rate;
      times.push(t);
      need = -Math.log(1 - r());
    } else {
      need -= room;
      t = end;
    }
  }
  const start = Math.floor(r() * nSeqs);
  return { times: Float64Array.from(times), seq: Uint32Array.from(times, (_, i) => (start + i) % nSeqs) };
}

// ---------------------------------------------------------------- results

interface Counts {
  offered: number;
  answered: number;
  /** OverloadedError from admission (predicted wait over the limit). */
  refusedAdmission: number;
  /** OverloadedError because every slot was in use. */
  refusedSlots: number;
  /** DeadlineExceededError: dropped while queued (never ran, or predicted to finish late). */
  timedOutQueued: number;
  /** DeadlineExceededError: ran, but the answer came after the deadline. */
  timedOutLate: number;
  /** DeadlineExceededError: the generator sent it after its deadline had passed. */
  timedOutUnsent: number;
  otherErrors: number;
}

interface BucketCounts {
  offered: number;
  answered: number;
  refused: number;
  timedOut: number;
}

const zeroBuckets = (n: number): BucketCounts[] => Array.from({ length: n }, () => ({ offered: 0, answered: 0, refused: 0, timedOut: 0 }));

const zeroCounts = (): Counts => ({ offered: 0, answered: 0, refusedAdmission: 0, refusedSlots: 0, timedOutQueued: 0, timedOutLate: 0, timedOutUnsent: 0, otherErrors: 0 });
const refused = (c: Counts) => c.refusedAdmission + c.refusedSlots;
const timedOut = (c: Counts) => c.timedOutQueued + c.timedOutLate + c.timedOutUnsent;

interface EngineDelta {
  batches: number;
  rows: number;
  realTokens: number;
  paddedTokens: number;
  droppedExpired: number;
  runMs: number;
}

interface PhaseResult {
  config: string;
  cell: string;
  round: number;
  windowMs: number;
  counts: Counts;
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  p999Ms: number;
  maxMs: number;
  /** Send time - scheduled time: how far the generator fell behind (P99 and max, ms). */
  sendLagP99Ms: number;
  sendLagMaxMs: number;
  /** Longest time from sending a request to its refusal, ms ("at once"?). */
  refusalMaxMs: number;
  engine: EngineDelta;
  /** Per length bucket (index as in the engine's buckets): offered and answered requests, refused and timed out. */
  byBucket: BucketCounts[];
  /** Real tokens of the requests answered in time. */
  answeredTokens: number;
  /** Process CPU (all threads) / wall time over the window. */
  cores: number;
  /** Ms after the window until every request of the phase had settled. */
  drainMs: number;
  /** 1-minute load average of the machine at the end of the window (others' work included). */
  loadavg1: number;
  firstOtherError?: string;
}

function histogram(): Histogram {
  return hdr.build({ numberOfSignificantValueDigits: 3, lowestDiscernibleValue: 1 });
}

const sleep = (ms: number) => new Promise<void>((res) => setTimeout(res, ms));
const yieldNow = () => new Promise<void>((res) => setImmediate(res));
const cpuMs = (u: NodeJS.CpuUsage) => (u.user + u.system) / 1000;

function delta(a: ModelStats, b: ModelStats): EngineDelta {
  return {
    batches: b.batches - a.batches,
    rows: b.rows - a.rows,
    realTokens: b.realTokens - a.realTokens,
    paddedTokens: b.paddedTokens - a.paddedTokens,
    droppedExpired: b.droppedExpired - a.droppedExpired,
    runMs: b.runMs - a.runMs,
  };
}

function classify(err: unknown, c: Counts): string | null {
  const e = err as SlabserveError;
  const code = err instanceof SlabserveError ? e.code : '';
  const msg = err instanceof Error ? err.message : String(err);
  if (code === 'SLABSERVE_OVERLOADED') {
    if (msg.startsWith('all ')) c.refusedSlots++;
    else c.refusedAdmission++;
  } else if (code === 'SLABSERVE_DEADLINE_EXCEEDED') {
    if (msg.includes('after its deadline')) c.timedOutLate++;
    else if (msg.includes('no time left')) c.timedOutUnsent++;
    else c.timedOutQueued++;
  } else {
    c.otherErrors++;
    return msg;
  }
  return null;
}

// ---------------------------------------------------------------- one open-loop phase

async function runPhase(
  config: Config,
  engine: Engine,
  cell: Cell,
  round: number,
  sched: Schedule,
  seqs: Seq[],
  seqBucket: Uint8Array,
  nBuckets: number,
): Promise<{ result: PhaseResult; latency: Histogram }> {
  const latency = histogram();
  const lag = histogram();
  const counts = zeroCounts();
  const byBucket = zeroBuckets(nBuckets);
  let answeredTokens = 0;
  let refusalMaxMs = 0;
  let firstOther: string | undefined;
  const windowStart = WARMUP_MS;
  const windowEnd = WARMUP_MS + DURATION_MS;
  let outstanding = 0;
  let allSettled: (() => void) | null = null;

  const t0 = performance.now() + 2;
  const fire = (i: number) => {
    const at = sched.times[i]!;
    const scheduled = t0 + at;
    const sent = performance.now();
    const measured = at >= windowStart && at < windowEnd;
    const seq = seqs[sched.seq[i]!]!;
    const bc = byBucket[seqBucket[sched.seq[i]!]!]!;
    if (measured) {
      counts.offered++;
      bc.offered++;
      lag.recordValue(Math.max(1, Math.round((sent - scheduled) * 1000)));
    }
    outstanding++;
    // The deadline runs from the scheduled arrival: a late send has less time left.
    engine
      .runTokens(MODEL, [seq], { timeoutMs: DEADLINE_MS - (sent - scheduled) })
      .then(
        () => {
          if (!measured) return;
          counts.answered++;
          bc.answered++;
          answeredTokens += seq.ids.length;
          latency.recordValue(Math.max(1, Math.round((performance.now() - scheduled) * 1000)));
        },
        (err: unknown) => {
          if (!measured) return;
          const other = classify(err, counts);
          if (other !== null) firstOther ??= other;
          const code = (err as SlabserveError).code;
          if (code === 'SLABSERVE_OVERLOADED') {
            bc.refused++;
            refusalMaxMs = Math.max(refusalMaxMs, performance.now() - sent);
          } else if (code === 'SLABSERVE_DEADLINE_EXCEEDED') bc.timedOut++;
        },
      )
      .finally(() => {
        outstanding--;
        if (outstanding === 0 && allSettled) allSettled();
      });
  };

  while (performance.now() < t0) await yieldNow();
  let s0: ModelStats | null = null;
  let cpu0: NodeJS.CpuUsage | null = null;
  let wall0 = 0;
  const n = sched.times.length;
  let i = 0;
  for (;;) {
    const now = performance.now() - t0;
    if (s0 === null && now >= windowStart) {
      s0 = engine.stats()[MODEL]!;
      cpu0 = process.cpuUsage();
      wall0 = performance.now();
    }
    while (i < n && sched.times[i]! <= now) fire(i++);
    const next = Math.min(i < n ? sched.times[i]! : windowEnd, s0 === null ? windowStart : Infinity);
    if (i >= n && now >= windowEnd) break;
    const wait = next - (performance.now() - t0);
    // No busy-waiting (it would take CPU from the inference thread on a small box): sleep until due,
    // with setTimeout's 1 ms granularity; the lag this adds is measured and counted in the latency.
    if (wait > 0) await sleep(wait);
    else await yieldNow();
  }
  const s1 = engine.stats()[MODEL]!;
  const cpu = cpuMs(process.cpuUsage(cpu0!));
  const wall1 = performance.now();
  // Every request of the phase settles by its deadline; give stragglers a bounded grace.
  const drainStart = performance.now();
  if (outstanding > 0) {
    await Promise.race([new Promise<void>((res) => (allSettled = res)), sleep(DEADLINE_MS + 5000)]);
    allSettled = null;
  }
  const drainMs = performance.now() - drainStart;
  if (outstanding > 0) console.error(`  ${config.name} / ${cell.name}: ${outstanding} requests still open ${Math.round(drainMs)} ms after the window`);
  const result: PhaseResult = {
    config: config.name,
    cell: cell.name,
    round,
    windowMs: DURATION_MS,
    counts,
    p50Ms: latency.getValueAtPercentile(50) / 1000,
    p90Ms: latency.getValueAtPercentile(90) / 1000,
    p99Ms: latency.getValueAtPercentile(99) / 1000,
    p999Ms: latency.getValueAtPercentile(99.9) / 1000,
    maxMs: latency.maxValue / 1000,
    sendLagP99Ms: lag.getValueAtPercentile(99) / 1000,
    sendLagMaxMs: lag.maxValue / 1000,
    refusalMaxMs,
    engine: delta(s0!, s1),
    byBucket,
    answeredTokens,
    cores: cpu / (wall1 - wall0),
    drainMs,
    loadavg1: Number(loadavg()[0]!.toFixed(2)),
    ...(firstOther !== undefined ? { firstOtherError: firstOther } : {}),
  };
  lag.destroy();
  return { result, latency };
}

// ---------------------------------------------------------------- capacity probe

async function probeCapacity(engine: Engine, seqs: Seq[]): Promise<{ perS: number; meanBatch: number; p50Ms: number; errors: number }> {
  let cursor = 0;
  let stop = false;
  let counting = false;
  let done = 0;
  let errors = 0;
  const h = histogram();
  const caller = async () => {
    while (!stop) {
      const s = seqs[cursor++ % seqs.length]!;
      const t = performance.now();
      try {
        await engine.runTokens(MODEL, [s], { timeoutMs: 30_000 });
      } catch {
        errors++;
        await sleep(1);
        continue;
      }
      if (counting) {
        done++;
        h.recordValue(Math.max(1, Math.round((performance.now() - t) * 1000)));
      }
    }
  };
  const callers = Array.from({ length: CAPACITY_CONCURRENCY }, caller);
  await sleep(Math.max(500, WARMUP_MS));
  const s0 = engine.stats()[MODEL]!;
  counting = true;
  const t0 = performance.now();
  await sleep(CAPACITY_MS);
  counting = false;
  const windowMs = performance.now() - t0;
  const s1 = engine.stats()[MODEL]!;
  stop = true;
  await Promise.all(callers);
  const d = delta(s0, s1);
  const out = { perS: (done / windowMs) * 1000, meanBatch: d.rows / d.batches, p50Ms: h.getValueAtPercentile(50) / 1000, errors };
  h.destroy();
  return out;
}

// ---------------------------------------------------------------- tables

function fmt(v: number | null | undefined, digits: number): string {
  if (v === null || v === undefined || !Number.isFinite(v)) return '-';
  return v.toFixed(digits);
}

const pct = (x: number, digits = 1) => (Number.isFinite(x) ? `${(100 * x).toFixed(digits)}%` : '-');

function table(headers: string[], rows: string[][], rightFrom = 1): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) => '| ' + cells.map((c, i) => (i < rightFrom ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join(' | ') + ' |';
  const sep = '|' + widths.map((w, i) => (i < rightFrom ? '-'.repeat(w + 2) : '-'.repeat(w + 1) + ':')).join('|') + '|';
  return [line(headers), sep, ...rows.map(line)].join('\n');
}

// ---------------------------------------------------------------- main

interface Aggregate {
  config: string;
  cell: string;
  counts: Counts;
  windowMs: number;
  answeredPerS: number;
  offeredPerS: number;
  /** Real tokens of the requests answered in time, per second. */
  answeredTokensPerS: number;
  byBucket: (BucketCounts & { bucket: number })[];
  /** Share of offered requests answered in time, among short (bucket <= SHORT_MAX) and long (bucket > LONG_MIN) ones. */
  shortAnswered: number;
  longAnswered: number;
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  p999Ms: number;
  maxMs: number;
  /** Per round: P99 ms and answered/s (how far apart the rounds were). */
  roundsP99Ms: number[];
  roundsAnsweredPerS: number[];
  meanBatch: number;
  batchFill: number;
  paddingEfficiency: number;
  droppedExpired: number;
  ortMsPerBatch: number;
  sendLagP99Ms: number;
  sendLagMaxMs: number;
  refusalMaxMs: number;
  cores: number;
}

async function main(): Promise<void> {
  const started = performance.now();
  const ortVersion = (require('onnxruntime-node/package.json') as { version: string }).version;
  const machine = {
    cpu: cpus()[0]?.model ?? 'unknown',
    cores: cpus().length,
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    node: process.version,
    onnxruntime: ortVersion,
    platform: `${process.platform}-${process.arch}`,
    loadavg: loadavg().map((x) => Number(x.toFixed(2))),
  };
  console.log(`slabserve scheduling bench: ${MODEL}, device ${DEVICE}, intra-op threads ${INTRA}${INTRA === 0 ? ' (onnxruntime default)' : ''}`);
  console.log(
    `machine: ${machine.cpu}, ${machine.cores} cores, ${machine.memoryGiB} GiB, node ${machine.node}, onnxruntime-node ${machine.onnxruntime}, ${machine.platform}, loadavg ${machine.loadavg.join(' ')}`,
  );

  // --- engines, one per configuration, opened before any timing and kept open
  const t = performance.now();
  const engines = new Map<string, Engine>();
  try {
    for (const c of CONFIGS) {
      const engine = await createEngine({
        modelsDir: MODELS_DIR,
        models: [MODEL],
        device: DEVICE,
        intraOpThreads: INTRA,
        maxInflightBatches: c.maxInflightBatches,
        batching: { maxBatchDelayMs: c.maxBatchDelayMs, ...(c.maxBatchTokens !== undefined ? { maxBatchTokens: c.maxBatchTokens } : {}) },
        ...(c.sloP99Ms !== undefined ? { sloP99Ms: c.sloP99Ms } : {}),
        log: () => {},
      });
      engines.set(c.name, engine);
    }
  } catch (err) {
    for (const e of engines.values()) await e.close();
    throw err;
  }
  const engineStartMs = (performance.now() - t) / CONFIGS.length;
  const ref = engines.get(CONFIGS[0]!.name)!;
  const info = ref.info().find((m) => m.name === MODEL)!;
  const batching: BatchingOptions = info.batching;
  const buckets = batching.buckets;
  const capacities = buckets.map((b) => batchCapacity(batching, b));

  const r = mulberry32(SEED);
  const seqs = workload(r, N_SEQS, info.maxLength);
  const lens = seqs.map((s) => s.ids.length).sort((a, b) => a - b);
  const seqBucket = Uint8Array.from(seqs, (s) => bucketFor(buckets, s.ids.length));
  const rowsByBucket = buckets.map((_, b) => seqBucket.filter((x) => x === b).length);
  /** "Short" and "long" requests for the per-length columns: buckets up to SHORT_MAX tokens, and above LONG_MIN. */
  const SHORT_MAX = 64;
  const LONG_MIN = 128;
  const realTotal = lens.reduce((a, b) => a + b, 0);
  const paddedTotal = seqs.reduce((a, s) => a + buckets[bucketFor(buckets, s.ids.length)]!, 0);
  /**
   * Per configuration, the batch capacity a row sees: exact when every bucket has the same capacity,
   * else the mean over the workload's rows (so `fill` is approximate).
   */
  const capacityOf = new Map(
    CONFIGS.map((c) => {
      const bo = engines.get(c.name)!.info().find((m) => m.name === MODEL)!.batching;
      const caps = bo.buckets.map((b) => batchCapacity(bo, b));
      const uniform = caps.every((x) => x === caps[0]);
      return [c.name, { caps, uniform, rowCapacity: uniform ? caps[0]! : rowsByBucket.reduce((a, n, b) => a + n * caps[b]!, 0) / seqs.length }];
    }),
  );
  const uniformCapacity = [...capacityOf.values()].every((x) => x.uniform && x.caps[0] === capacities[0]);
  const quantile = (q: number) => lens[Math.min(lens.length - 1, Math.floor(q * lens.length))]!;
  console.log(
    `workload: ${seqs.length} token sequences from seed ${SEED} (80% queries ~16 tokens, 20% passages ~160, clipped to ${info.maxLength}), engine.runTokens one sequence per request; ` +
      `lengths ${lens[0]}..${lens[lens.length - 1]} (median ${quantile(0.5)}, P90 ${quantile(0.9)}, P99 ${quantile(0.99)}, mean ${(realTotal / lens.length).toFixed(1)}); ` +
      `buckets ${buckets.map((T, b) => `${T}:${fmt((100 * rowsByBucket[b]!) / seqs.length, 0)}%`).join(' ')}; ` +
      `padding efficiency of perfect bucketing ${pct(realTotal / paddedTotal, 0)}`,
  );
  console.log(
    `engines: ${CONFIGS.length} (${CONFIGS.map((c) => c.name).join(', ')}), createEngine ${(engineStartMs / 1000).toFixed(1)}s each (${ref.device.label}); ` +
      `batching maxBatchSize ${batching.maxBatchSize}, maxBatchTokens ${batching.maxBatchTokens}, batch capacity per bucket ${capacities.join(',')}`,
  );

  // --- capacity: a short closed loop on the reference engine
  let capacity: { perS: number; meanBatch: number; p50Ms: number; errors: number; given: boolean };
  if (CAPACITY_GIVEN !== null) {
    capacity = { perS: CAPACITY_GIVEN, meanBatch: NaN, p50Ms: NaN, errors: 0, given: true };
    console.log(`capacity: ${CAPACITY_GIVEN} requests/s (given with --capacity)`);
  } else {
    capacity = { ...(await probeCapacity(ref, seqs)), given: false };
    console.log(
      `capacity: ${fmt(capacity.perS, 0)} requests/s (closed loop, ${CAPACITY_CONCURRENCY} callers, ${CAPACITY_MS / 1000}s on "${CONFIGS[0]!.name}": mean batch ${fmt(capacity.meanBatch, 1)}, P50 ${fmt(capacity.p50Ms, 1)} ms` +
        `${capacity.errors ? `, ${capacity.errors} errors` : ''})`,
    );
  }

  const cells: Cell[] = [
    ...LOADS.map((l): Cell => ({ name: `poisson ${l}%`, pattern: 'poisson', loadPct: l })),
    ...BURST_LOADS.map((l): Cell => ({ name: `burst ${l}%`, pattern: 'burst', loadPct: l })),
  ];
  if (cells.length === 0) fail('nothing to run: --loads and --burst-loads are both empty');
  const burstLine = `burst = on/off: ${BURST_FACTOR}x the mean rate for ${fmt(100 * BURST_DUTY, 0)}% of every ${BURST_PERIOD_MS} ms${BURST_FACTOR * BURST_DUTY < 1 - 1e-9 ? ', the rest at the rate that keeps the mean' : ', silence in between'}`;
  const phaseS = (WARMUP_MS + DURATION_MS) / 1000;
  console.log(
    `phases: ${cells.map((c) => c.name).join(', ')} x ${CONFIGS.length} configs x ${ROUNDS} round${ROUNDS > 1 ? 's' : ''} (alternating order), ` +
      `each ${WARMUP_MS / 1000}s warm-up + ${DURATION_MS / 1000}s measured (+ drain); deadline ${DEADLINE_MS} ms from the scheduled arrival; ${burstLine}; ` +
      `expected ~${Math.round(cells.length * CONFIGS.length * ROUNDS * (phaseS + 0.4))} s`,
  );

  // --- phases: cells in order, configurations A B C ... then reversed in the next round
  const all: PhaseResult[] = [];
  const histos = new Map<string, Histogram>();
  const key = (config: string, cell: string) => `${config}\u0000${cell}`;
  const order: { cell: Cell; config: Config }[] = cells.flatMap((cell) => CONFIGS.map((config) => ({ cell, config })));
  try {
    for (let round = 0; round < ROUNDS; round++) {
      const seq = round % 2 === 0 ? order : [...order].reverse();
      const scheds = new Map(
        cells.map((cell, ci) => [cell.name, schedule(cell, capacity.perS, WARMUP_MS + DURATION_MS, mulberry32((SEED * 7919 + round * 104729 + ci * 1299709) >>> 0), seqs.length)]),
      );
      let lastCell = '';
      let line: string[] = [];
      for (const { cell, config } of seq) {
        if (cell.name !== lastCell && line.length) {
          console.error(`round ${round + 1}/${ROUNDS} ${lastCell} (answered/s, P99 ms): ${line.join(', ')}`);
          line = [];
        }
        lastCell = cell.name;
        const { result, latency } = await runPhase(config, engines.get(config.name)!, cell, round, scheds.get(cell.name)!, seqs, seqBucket, buckets.length);
        all.push(result);
        const k = key(config.name, cell.name);
        const h = histos.get(k);
        if (h) {
          h.add(latency);
          latency.destroy();
        } else histos.set(k, latency);
        line.push(`${config.name} ${fmt((result.counts.answered / result.windowMs) * 1000, 0)}/${fmt(result.p99Ms, 1)}`);
        if (result.firstOtherError) console.error(`  ${config.name} / ${cell.name}: ${result.counts.otherErrors} other errors, first: ${result.firstOtherError}`);
        await sleep(100);
      }
      if (line.length) console.error(`round ${round + 1}/${ROUNDS} ${lastCell} (answered/s, P99 ms): ${line.join(', ')}`);
    }
  } finally {
    for (const e of engines.values()) await e.close();
  }

  // --- aggregate the rounds: counts and engine counters summed, histograms merged
  const agg = new Map<string, Aggregate>();
  for (const cell of cells) {
    for (const config of CONFIGS) {
      const runs = all.filter((x) => x.cell === cell.name && x.config === config.name);
      const counts = zeroCounts();
      const eng: EngineDelta = { batches: 0, rows: 0, realTokens: 0, paddedTokens: 0, droppedExpired: 0, runMs: 0 };
      for (const x of runs) {
        for (const k of Object.keys(counts) as (keyof Counts)[]) counts[k] += x.counts[k];
        for (const k of Object.keys(eng) as (keyof EngineDelta)[]) eng[k] += x.engine[k];
      }
      const h = histos.get(key(config.name, cell.name))!;
      const windowMs = runs.reduce((a, x) => a + x.windowMs, 0);
      const byBucket = buckets.map((T, b) => {
        const z = { bucket: T, offered: 0, answered: 0, refused: 0, timedOut: 0 };
        for (const x of runs) for (const k of ['offered', 'answered', 'refused', 'timedOut'] as const) z[k] += x.byBucket[b]![k];
        return z;
      });
      const share = (pick: (T: number) => boolean) => {
        const sel = byBucket.filter((z) => pick(z.bucket));
        return sel.reduce((a, z) => a + z.answered, 0) / sel.reduce((a, z) => a + z.offered, 0);
      };
      const meanBatch = eng.rows / eng.batches;
      agg.set(key(config.name, cell.name), {
        config: config.name,
        cell: cell.name,
        counts,
        windowMs,
        answeredPerS: (counts.answered / windowMs) * 1000,
        offeredPerS: (counts.offered / windowMs) * 1000,
        answeredTokensPerS: (runs.reduce((a, x) => a + x.answeredTokens, 0) / windowMs) * 1000,
        byBucket,
        shortAnswered: share((T) => T <= SHORT_MAX),
        longAnswered: share((T) => T > LONG_MIN),
        p50Ms: h.getValueAtPercentile(50) / 1000,
        p90Ms: h.getValueAtPercentile(90) / 1000,
        p99Ms: h.getValueAtPercentile(99) / 1000,
        p999Ms: h.getValueAtPercentile(99.9) / 1000,
        maxMs: h.maxValue / 1000,
        roundsP99Ms: runs.map((x) => x.p99Ms),
        roundsAnsweredPerS: runs.map((x) => (x.counts.answered / x.windowMs) * 1000),
        meanBatch,
        batchFill: meanBatch / capacityOf.get(config.name)!.rowCapacity,
        paddingEfficiency: eng.realTokens / eng.paddedTokens,
        droppedExpired: eng.droppedExpired,
        ortMsPerBatch: eng.runMs / eng.batches,
        sendLagP99Ms: Math.max(...runs.map((x) => x.sendLagP99Ms)),
        sendLagMaxMs: Math.max(...runs.map((x) => x.sendLagMaxMs)),
        refusalMaxMs: Math.max(...runs.map((x) => x.refusalMaxMs)),
        cores: runs.reduce((a, x) => a + x.cores, 0) / runs.length,
      });
    }
  }
  for (const h of histos.values()) h.destroy();
  const get = (config: string, cell: string) => agg.get(key(config, cell))!;

  // --- tables, one per (pattern, load)
  const refName = CONFIGS[0]!.name;
  const headers = [
    'config',
    'offered/s',
    'answered/s',
    'vs ref',
    'tok/s vs ref',
    'P50 ms',
    'P99 ms',
    'P99 vs ref',
    'P99 by round',
    'refused',
    'timed out',
    `answered ≤${SHORT_MAX} / >${LONG_MIN} tok`,
    'mean batch',
    `fill${uniformCapacity ? '' : ' (approx)'}`,
    'pad eff',
    'ORT ms/batch',
    'send lag P99',
  ];
  console.log('');
  console.log(
    `Offered load as % of the measured capacity (${fmt(capacity.perS, 0)} req/s). answered/s = answered within the deadline; latency of answered requests, from the scheduled arrival; ` +
      `refused = OverloadedError at once (admission or no free slot); timed out = DeadlineExceededError; "ref" = ${refName}. ${ROUNDS > 1 ? `${ROUNDS} rounds of ${DURATION_MS / 1000}s merged per row.` : ''}`,
  );
  for (const cell of cells) {
    const refA = get(refName, cell.name);
    const rows = CONFIGS.map((c) => {
      const a = get(c.name, cell.name);
      return [
        c.name + (c.kind === 'fixed' && c.maxInflightBatches === 1 ? ' *' : ''),
        fmt(a.offeredPerS, 0),
        fmt(a.answeredPerS, 0),
        `${fmt(a.answeredPerS / refA.answeredPerS, 2)}x`,
        `${fmt(a.answeredTokensPerS / refA.answeredTokensPerS, 2)}x`,
        fmt(a.p50Ms, 1),
        fmt(a.p99Ms, 1),
        `${fmt(a.p99Ms / refA.p99Ms, 2)}x`,
        a.roundsP99Ms.map((x) => fmt(x, 1)).join(' / '),
        pct(refused(a.counts) / a.counts.offered),
        pct(timedOut(a.counts) / a.counts.offered),
        `${pct(a.shortAnswered, 0)} / ${pct(a.longAnswered, 0)}`,
        fmt(a.meanBatch, 1),
        pct(a.batchFill, 0),
        pct(a.paddingEfficiency, 0),
        fmt(a.ortMsPerBatch, 2),
        fmt(a.sendLagP99Ms, 1),
      ];
    });
    console.log('');
    console.log(`## ${cell.name} (${fmt((capacity.perS * cell.loadPct) / 100, 0)} req/s mean${cell.pattern === 'burst' ? `, bursts at ${fmt((capacity.perS * cell.loadPct * BURST_FACTOR) / 100, 0)} req/s` : ''})`);
    console.log('');
    console.log(table(headers, rows));
  }
  // --- one line per configuration across every cell
  console.log('');
  console.log(`## summary: P99 ms of answered requests / share answered in time (ref ${refName})`);
  console.log('');
  console.log(
    table(
      ['config', ...cells.map((c) => c.name)],
      CONFIGS.map((c) => [c.name, ...cells.map((cell) => {
        const a = get(c.name, cell.name);
        return `${fmt(a.p99Ms, 1)} / ${pct(a.counts.answered / a.counts.offered, 0)}`;
      })]),
    ),
  );
  console.log('');
  console.log(
    `* maxInflightBatches 1: the scheduler only decides when the device is idle, so a batch closes at once and maxBatchDelayMs never applies; ` +
      `this row stands for fixed windows 0, 5 and 20 ms alike. The fixed windows act only in the if=2 rows.`,
  );

  // --- reading: the facts the questions ask about, computed
  const reading: string[] = [];
  for (const c of CONFIGS.filter((x) => x.kind === 'slo')) {
    const parts = cells.map((cell) => {
      const a = get(c.name, cell.name);
      const ok = a.p99Ms <= c.sloP99Ms!;
      return `${cell.name}: P99 ${fmt(a.p99Ms, 1)} ms ${ok ? '<=' : '>'} ${c.sloP99Ms} (refused ${pct(refused(a.counts) / a.counts.offered, 0)}, timed out ${pct(timedOut(a.counts) / a.counts.offered, 0)})`;
    });
    reading.push(`${c.name}: ${parts.join('; ')}`);
  }
  const fixed2 = CONFIGS.filter((x) => x.kind === 'fixed' && x.maxInflightBatches > 1).sort((a, b) => a.maxBatchDelayMs - b.maxBatchDelayMs);
  if (fixed2.length > 1) {
    const base = fixed2[0]!;
    for (const cell of cells) {
      const b = get(base.name, cell.name);
      const parts = fixed2.slice(1).map((c) => {
        const a = get(c.name, cell.name);
        return `${c.name}: P50 ${fmt(a.p50Ms / b.p50Ms, 2)}x, P99 ${fmt(a.p99Ms / b.p99Ms, 2)}x, mean batch ${fmt(a.meanBatch, 1)} vs ${fmt(b.meanBatch, 1)}, answered ${fmt(a.answeredPerS / b.answeredPerS, 2)}x`;
      });
      reading.push(`fixed windows vs ${base.name}, ${cell.name}: ${parts.join('; ')}`);
    }
  }
  for (const cell of cells.filter((x) => x.loadPct > 100)) {
    const parts = CONFIGS.map((c) => {
      const a = get(c.name, cell.name);
      const o = a.counts.offered;
      return `${c.name} answered ${pct(a.counts.answered / o, 0)}, refused ${pct(a.counts.refusedAdmission / o, 0)} by admission + ${pct(a.counts.refusedSlots / o, 0)} no slot, timed out ${pct(a.counts.timedOutQueued / o, 0)} in queue + ${pct(a.counts.timedOutLate / o, 0)} late + ${pct(a.counts.timedOutUnsent / o, 0)} unsent`;
    });
    reading.push(`${cell.name}: ${parts.join('; ')}`);
  }
  console.log('');
  console.log('reading (computed):');
  for (const l of reading) console.log(`- ${l}`);
  console.log('');
  console.log(`columns:
  offered/s     requests scheduled per second in the measured window(s)
  answered/s    requests answered within their deadline per second; vs ref: / the ${refName} row
  tok/s vs ref  real tokens of the requests answered in time per second, / the ref row's (shedding long requests lowers it more than answered/s)
  P50, P99 ms   latency of answered requests, from the scheduled arrival to the answer (HDR histogram; rounds merged); P99 by round: each round alone
  refused       share of offered requests refused at once with OverloadedError (SLABSERVE_OVERLOADED: admission's predicted wait, or no free slot)
  timed out     share of offered requests that failed with DeadlineExceededError (dropped in the queue, answered late, or sent too late)
  answered ≤${SHORT_MAX} / >${LONG_MIN} tok   share answered in time of the requests in buckets up to ${SHORT_MAX} tokens / above ${LONG_MIN} tokens
  mean batch    engine.stats() rows / batches over the measured window
  fill          mean batch / batch capacity of the bucket (min(maxBatchSize, maxBatchTokens / bucket) = ${uniformCapacity ? capacities[0] : 'per bucket; approximated by the capacity the workload\'s rows see on average'})
  pad eff       engine.stats() realTokens / paddedTokens over the window
  ORT ms/batch  engine.stats() runMs / batches (with 2 batches in flight it includes the wait behind the other one)
  send lag P99  ms the generator sent a request after its scheduled time (counted in the latency, and off the deadline)`);
  const la = all.map((x) => x.loadavg1);
  console.log(`total time ${((performance.now() - started) / 1000).toFixed(0)}s; 1-min load average during the phases ${fmt(Math.min(...la), 1)}..${fmt(Math.max(...la), 1)} on ${machine.cores} cores`);

  if (args.json) {
    const out = {
      machine,
      options: {
        model: MODEL,
        device: DEVICE,
        intraOpThreads: INTRA,
        configs: CONFIGS,
        loads: LOADS,
        burstLoads: BURST_LOADS,
        burst: { factor: BURST_FACTOR, duty: BURST_DUTY, periodMs: BURST_PERIOD_MS },
        deadlineMs: DEADLINE_MS,
        warmupS: WARMUP_MS / 1000,
        durationS: DURATION_MS / 1000,
        rounds: ROUNDS,
        capacityConcurrency: CAPACITY_CONCURRENCY,
        capacityS: CAPACITY_MS / 1000,
        requests: N_SEQS,
        seed: SEED,
        quick: QUICK,
      },
      workload: {
        sequences: seqs.length,
        minTokens: lens[0],
        maxTokens: lens[lens.length - 1],
        meanTokens: realTotal / lens.length,
        bucketMix: buckets.map((T, b) => ({ T, capacity: capacities[b], n: rowsByBucket[b] })),
      },
      setup: { engineStartMs, batching, batchCapacity: Object.fromEntries(capacityOf) },
      capacity,
      aggregated: [...agg.values()],
      phases: all,
    };
    writeFileSync(args.json, JSON.stringify(out, null, 2) + '\n');
    console.log(`wrote ${args.json}`);
  }
}

await main();
