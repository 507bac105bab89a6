/**
 * The rounds of each (configuration, cell) merged into one row: counts and
 * engine counters summed, latency histograms added (the case merged them as
 * the rounds ran), rates over the summed windows. These rows are results.json's
 * `scheduling.rows` and the report's tables (bench/report-scheduling.ts).
 */
import type { Bursts } from '../../arrivals.js';
import type { Cell, Config } from './configs.js';
import type { Histogram } from 'hdr-histogram-js';
import { phaseKey, zeroCounts, zeroEngineDelta, type BucketCounts, type Counts, type EngineDelta, type SchedulingPhase } from './results.js';
import type { Bench, Capacity } from './setup.js';

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
