/**
 * What the scheduling case records and results.json keeps: per open-loop phase
 * (SchedulingPhase) how each offered request ended and the engine's counters
 * over the window; then the rounds of each (configuration, cell) merged into
 * one row: counts and engine counters summed, latency histograms added (the
 * case merged them as the rounds ran), rates over the summed windows. These
 * rows are results.json's `scheduling.rows` and the report's tables
 * (bench/report-scheduling.ts).
 */
import type { Histogram } from 'hdr-histogram-js';
import type { ModelStats } from '../../../src/main/engine.js';
import { SlabserveError } from '../../../src/shared/errors.js';
import type { Bursts } from '../../arrivals.js';
import type { Cell, Config } from './configs.js';
import type { Bench, Capacity } from './setup.js';

export interface Counts {
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

export interface BucketCounts {
  offered: number;
  answered: number;
  refused: number;
  timedOut: number;
}

export const zeroBuckets = (n: number): BucketCounts[] => Array.from({ length: n }, () => ({ offered: 0, answered: 0, refused: 0, timedOut: 0 }));

export const zeroCounts = (): Counts => ({ offered: 0, answered: 0, refusedAdmission: 0, refusedSlots: 0, timedOutQueued: 0, timedOutLate: 0, timedOutUnsent: 0, otherErrors: 0 });
export const refused = (c: Counts) => c.refusedAdmission + c.refusedSlots;
export const timedOut = (c: Counts) => c.timedOutQueued + c.timedOutLate + c.timedOutUnsent;

/** The engine's counters (engine.stats()) over a window. */
export interface EngineDelta {
  batches: number;
  rows: number;
  realTokens: number;
  paddedTokens: number;
  runMs: number;
}

export const zeroEngineDelta = (): EngineDelta => ({ batches: 0, rows: 0, realTokens: 0, paddedTokens: 0, runMs: 0 });

export function engineDelta(a: ModelStats, b: ModelStats): EngineDelta {
  return {
    batches: b.batches - a.batches,
    rows: b.rows - a.rows,
    realTokens: b.realTokens - a.realTokens,
    paddedTokens: b.paddedTokens - a.paddedTokens,
    runMs: b.runMs - a.runMs,
  };
}

/** Counts a failed request in `c` and in its bucket's `bc` by its error; returns the message of an error that is neither a refusal nor a timeout. */
export function classify(err: unknown, c: Counts, bc: BucketCounts): string | null {
  const e = err as SlabserveError;
  const code = err instanceof SlabserveError ? e.code : '';
  const msg = err instanceof Error ? err.message : String(err);
  if (code === 'SLABSERVE_OVERLOADED') {
    bc.refused++;
    if (msg.startsWith('all ')) c.refusedSlots++;
    else c.refusedAdmission++;
  } else if (code === 'SLABSERVE_DEADLINE_EXCEEDED') {
    bc.timedOut++;
    if (msg.includes('after its deadline')) c.timedOutLate++;
    else if (msg.includes('no time left')) c.timedOutUnsent++;
    else c.timedOutQueued++;
  } else {
    c.otherErrors++;
    return msg;
  }
  return null;
}

/** The key of a (configuration, cell) pair in the merged histograms. */
export const phaseKey = (config: string, cell: string) => `${config}\u0000${cell}`;

export interface SchedulingPhase {
  config: string;
  cell: string;
  round: number;
  windowMs: number;
  counts: Counts;
  p50Ms: number;
  p99Ms: number;
  /** Send time - scheduled time: how far the generator fell behind (P99, ms). */
  sendLagP99Ms: number;
  engine: EngineDelta;
  /** Per length bucket (index as in the engine's buckets): offered and answered requests, refused and timed out. */
  byBucket: BucketCounts[];
  /** Real tokens of the requests answered in time. */
  answeredTokens: number;
  firstOtherError?: string;
}

/** Every phase's result, and per (configuration, cell) the latency histogram of all its rounds merged. */
export interface PhaseRecords {
  phases: SchedulingPhase[];
  histograms: Map<string, Histogram>;
}

/** The scheduling case in results.json. */
export interface SchedulingSection {
  model: string;
  workload: string;
  capacity: Capacity;
  /** The first is the reference of the ratio columns. */
  configs: Config[];
  cells: Cell[];
  burst: Bursts;
  deadlineMs: number;
  rounds: number;
  durationS: number;
  /** Batch capacity per bucket of the reference configuration, and whether every configuration has it in every bucket. */
  buckets: number[];
  capacities: number[];
  uniformCapacity: boolean;
  rows: Aggregate[];
  phases: SchedulingPhase[];
}

/** "Short" and "long" requests for the per-length columns: buckets up to SHORT_MAX tokens, and above LONG_MIN. */
export const SHORT_MAX = 64;
export const LONG_MIN = 128;

export interface Aggregate {
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
  p99Ms: number;
  /** Per round: P99 ms (how far apart the rounds were). */
  roundsP99Ms: number[];
  meanBatch: number;
  batchFill: number;
  paddingEfficiency: number;
  ortMsPerBatch: number;
  sendLagP99Ms: number;
}

function sumCounts(runs: SchedulingPhase[]): { counts: Counts; eng: EngineDelta } {
  const counts = zeroCounts();
  const eng = zeroEngineDelta();
  for (const x of runs) {
    for (const k of Object.keys(counts) as (keyof Counts)[]) counts[k] += x.counts[k];
    for (const k of Object.keys(eng) as (keyof EngineDelta)[]) eng[k] += x.engine[k];
  }
  return { counts, eng };
}

function sumBuckets(buckets: number[], runs: SchedulingPhase[]): (BucketCounts & { bucket: number })[] {
  return buckets.map((T, b) => {
    const z = { bucket: T, offered: 0, answered: 0, refused: 0, timedOut: 0 };
    for (const x of runs) for (const k of ['offered', 'answered', 'refused', 'timedOut'] as const) z[k] += x.byBucket[b]![k];
    return z;
  });
}

function aggregateOne(b: Bench, config: Config, cell: Cell, runs: SchedulingPhase[], h: Histogram): Aggregate {
  const { counts, eng } = sumCounts(runs);
  const windowMs = runs.reduce((a, x) => a + x.windowMs, 0);
  const byBucket = sumBuckets(b.buckets, runs);
  const share = (pick: (T: number) => boolean) => {
    const sel = byBucket.filter((z) => pick(z.bucket));
    return sel.reduce((a, z) => a + z.answered, 0) / sel.reduce((a, z) => a + z.offered, 0);
  };
  const meanBatch = eng.rows / eng.batches;
  return {
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
    p99Ms: h.getValueAtPercentile(99) / 1000,
    roundsP99Ms: runs.map((x) => x.p99Ms),
    meanBatch,
    batchFill: meanBatch / b.capacityOf.get(config.name)!.rowCapacity,
    paddingEfficiency: eng.realTokens / eng.paddedTokens,
    ortMsPerBatch: eng.runMs / eng.batches,
    sendLagP99Ms: Math.max(...runs.map((x) => x.sendLagP99Ms)),
  };
}

/** Every (configuration, cell)'s rounds merged, cells in order and configurations within each; destroys the merged histograms. */
export function aggregateRounds(b: Bench, records: PhaseRecords): Aggregate[] {
  const { cells, configs } = b.options.scheduling;
  const rows = cells.flatMap((cell) =>
    configs.map((config) => {
      const runs = records.phases.filter((x) => x.cell === cell.name && x.config === config.name);
      return aggregateOne(b, config, cell, runs, records.histograms.get(phaseKey(config.name, cell.name))!);
    }),
  );
  for (const h of records.histograms.values()) h.destroy();
  return rows;
}
