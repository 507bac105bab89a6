/**
 * One open-loop phase of the scheduling case: one configuration's engine, one
 * cell's arrival schedule (Poisson or bursts, bench/arrivals.ts). Each request is
 * sent at its scheduled time whatever happened to the earlier ones; its
 * latency and its deadline both run from the *scheduled* arrival, so a
 * generator that falls behind is counted (coordinated omission corrected).
 * Only requests scheduled inside the measured window (after the warm-up)
 * count; the engine's counters are read at both ends of that window. Then a
 * bounded drain until every request has settled.
 */
import { performance } from 'node:perf_hooks';
import type { Engine, ModelStats } from '../../../src/main/engine.js';
import { DEADLINE_MS, type Cell, type Config } from './configs.js';
import type { Histogram } from 'hdr-histogram-js';
import { newHistogram, sendOnSchedule } from '../../load.js';
import { classify, engineDelta, zeroBuckets, zeroCounts, type BucketCounts, type SchedulingPhase } from './aggregate.js';
import type { Bench } from './setup.js';

const sleep = (ms: number) => new Promise<void>((res) => setTimeout(res, ms));
/** A duration in ms as the µs a histogram records: at least 1, its lowest discernible value. */
const toUs = (ms: number) => Math.max(1, Math.round(ms * 1000));

/** A phase's arrivals: times (ms from the phase start, ascending) and each one's index into the workload. */
export interface Schedule {
  times: number[];
  seq: Uint32Array;
}

export interface PhaseRun {
  config: Config;
  engine: Engine;
  cell: Cell;
  round: number;
  sched: Schedule;
}

/** What the requests scheduled inside the measured window did. */
class Tally {
  readonly latency = newHistogram();
  readonly lag = newHistogram();
  readonly counts = zeroCounts();
  readonly byBucket: BucketCounts[];
  answeredTokens = 0;
  firstOther: string | undefined;

  constructor(nBuckets: number) {
    this.byBucket = zeroBuckets(nBuckets);
  }

  offered(bc: BucketCounts, lagMs: number): void {
    this.counts.offered++;
    bc.offered++;
    this.lag.recordValue(toUs(lagMs));
  }

  answered(bc: BucketCounts, tokens: number, latencyMs: number): void {
    this.counts.answered++;
    bc.answered++;
    this.answeredTokens += tokens;
    this.latency.recordValue(toUs(latencyMs));
  }

  failed(bc: BucketCounts, err: unknown): void {
    const other = classify(err, this.counts, bc);
    if (other !== null) this.firstOther ??= other;
  }
}

/** Sends arrival `i` of the schedule at `scheduled` and tallies how it ends; the promise is in flight until it settles. */
function send(b: Bench, run: PhaseRun, tally: Tally, measured: boolean, i: number, scheduled: number): Promise<void> {
  const sent = performance.now();
  const seq = b.seqs[run.sched.seq[i]!]!;
  const bc = tally.byBucket[b.seqBucket[run.sched.seq[i]!]!]!;
  if (measured) tally.offered(bc, sent - scheduled);
  // The deadline runs from the scheduled arrival: a late send has less time left.
  return run.engine.runTokens(b.model.name, [seq], { timeoutMs: DEADLINE_MS - (sent - scheduled) }).then(
    () => {
      if (measured) tally.answered(bc, seq.ids.length, performance.now() - scheduled);
    },
    (err: unknown) => {
      if (measured) tally.failed(bc, err);
    },
  );
}

/** The phase's record, from its tally and the engine's counters at both ends of the measured window. */
function phaseResult(run: PhaseRun, windowMs: number, tally: Tally, stats0: ModelStats, stats1: ModelStats): SchedulingPhase {
  const { latency, lag } = tally;
  return {
    config: run.config.name,
    cell: run.cell.name,
    round: run.round,
    windowMs,
    counts: tally.counts,
    p50Ms: latency.getValueAtPercentile(50) / 1000,
    p99Ms: latency.getValueAtPercentile(99) / 1000,
    sendLagP99Ms: lag.getValueAtPercentile(99) / 1000,
    engine: engineDelta(stats0, stats1),
    byBucket: tally.byBucket,
    answeredTokens: tally.answeredTokens,
    ...(tally.firstOther !== undefined ? { firstOtherError: tally.firstOther } : {}),
  };
}

/** Runs one phase; the latency histogram (µs) is the caller's to merge and destroy. */
export async function runPhase(b: Bench, run: PhaseRun): Promise<{ result: SchedulingPhase; latency: Histogram }> {
  const { warmupMs, durationMs } = b.options;
  const model = b.model.name;
  const tally = new Tally(b.buckets.length);
  const inFlight = new Set<Promise<void>>();
  let stats0: ModelStats | undefined;
  const sendOne = (i: number, scheduled: number) => {
    const p = send(b, run, tally, run.sched.times[i]! >= warmupMs, i, scheduled).finally(() => inFlight.delete(p));
    inFlight.add(p);
  };
  await sendOnSchedule(run.sched.times, warmupMs, warmupMs + durationMs, sendOne, () => (stats0 = run.engine.stats()[model]!));
  const stats1 = run.engine.stats()[model]!;
  // Every request of the phase settles by its deadline; give stragglers a bounded grace.
  const drainStart = performance.now();
  await Promise.race([Promise.all(inFlight), sleep(DEADLINE_MS + 5000)]);
  const drainMs = performance.now() - drainStart;
  if (inFlight.size > 0) process.stderr.write(`  ${run.config.name} / ${run.cell.name}: ${inFlight.size} requests still open ${Math.round(drainMs)} ms after the window\n`);
  const result = phaseResult(run, durationMs, tally, stats0!, stats1);
  tally.lag.destroy();
  return { result, latency: tally.latency };
}
