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
import type { SlabserveError } from '../../../src/shared/errors.js';
import type { Cell, Config } from './configs.js';
import type { Histogram } from 'hdr-histogram-js';
import { newHistogram } from '../../load.js';
import { classify, engineDelta, zeroBuckets, zeroCounts, type BucketCounts, type SchedulingPhase } from './results.js';
import type { Bench } from './setup.js';

const sleep = (ms: number) => new Promise<void>((res) => setTimeout(res, ms));
const yieldNow = () => new Promise<void>((res) => setImmediate(res));
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

/** The measured window, ms from the phase start: [warm-up, warm-up + duration). */
interface Window {
  start: number;
  end: number;
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
    const other = classify(err, this.counts);
    if (other !== null) this.firstOther ??= other;
    const code = (err as SlabserveError).code;
    if (code === 'SLABSERVE_OVERLOADED') bc.refused++;
    else if (code === 'SLABSERVE_DEADLINE_EXCEEDED') bc.timedOut++;
  }
}

/** Requests sent and not settled yet. */
class InFlight {
  count = 0;
  private onNone: (() => void) | null = null;

  add(): void {
    this.count++;
  }

  done(): void {
    this.count--;
    if (this.count === 0 && this.onNone) this.onNone();
  }

  /** Resolves once none is left, or after `graceMs`. */
  async settled(graceMs: number): Promise<void> {
    if (this.count === 0) return;
    await Promise.race([new Promise<void>((res) => (this.onNone = res)), sleep(graceMs)]);
    this.onNone = null;
  }
}

/** Sends arrival `i` of the schedule, whose clock started at `t0`, and tallies how it ends. */
function send(b: Bench, run: PhaseRun, tally: Tally, inFlight: InFlight, window: Window, i: number, t0: number): void {
  const at = run.sched.times[i]!;
  const scheduled = t0 + at;
  const sent = performance.now();
  const measured = at >= window.start && at < window.end;
  const seq = b.seqs[run.sched.seq[i]!]!;
  const bc = tally.byBucket[b.seqBucket[run.sched.seq[i]!]!]!;
  if (measured) tally.offered(bc, sent - scheduled);
  inFlight.add();
  // The deadline runs from the scheduled arrival: a late send has less time left.
  run.engine
    .runTokens(b.settings.model, [seq], { timeoutMs: b.settings.deadlineMs - (sent - scheduled) })
    .then(
      () => {
        if (measured) tally.answered(bc, seq.ids.length, performance.now() - scheduled);
      },
      (err: unknown) => {
        if (measured) tally.failed(bc, err);
      },
    )
    .finally(() => inFlight.done());
}

/** The engine's counters at both ends of the measured window. */
interface WindowReading {
  stats0: ModelStats;
  stats1: ModelStats;
}

/** Calls `send(i, t0)` for each arrival at its time until the schedule and the window are over. */
async function sendOnSchedule(engine: Engine, model: string, times: readonly number[], window: Window, send: (i: number, t0: number) => void): Promise<WindowReading> {
  const t0 = performance.now() + 2;
  while (performance.now() < t0) await yieldNow();
  let s0: ModelStats | null = null;
  const n = times.length;
  let i = 0;
  for (;;) {
    const now = performance.now() - t0;
    if (s0 === null && now >= window.start) s0 = engine.stats()[model]!;
    while (i < n && times[i]! <= now) send(i++, t0);
    const next = Math.min(i < n ? times[i]! : window.end, s0 === null ? window.start : Infinity);
    if (i >= n && now >= window.end) break;
    const wait = next - (performance.now() - t0);
    // No busy-waiting (it would take CPU from the inference thread on a small box): sleep until due,
    // with setTimeout's 1 ms granularity; the lag this adds is measured and counted in the latency.
    if (wait > 0) await sleep(wait);
    else await yieldNow();
  }
  return { stats0: s0!, stats1: engine.stats()[model]! };
}

function phaseResult(run: PhaseRun, windowMs: number, tally: Tally, reading: WindowReading): SchedulingPhase {
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
    engine: engineDelta(reading.stats0, reading.stats1),
    byBucket: tally.byBucket,
    answeredTokens: tally.answeredTokens,
    ...(tally.firstOther !== undefined ? { firstOtherError: tally.firstOther } : {}),
  };
}

/** Runs one phase; the latency histogram (µs) is the caller's to merge and destroy. */
export async function runPhase(b: Bench, run: PhaseRun): Promise<{ result: SchedulingPhase; latency: Histogram }> {
  const s = b.settings;
  const window: Window = { start: s.warmupMs, end: s.warmupMs + s.durationMs };
  const tally = new Tally(b.buckets.length);
  const inFlight = new InFlight();
  const reading = await sendOnSchedule(run.engine, s.model, run.sched.times, window, (i, t0) => send(b, run, tally, inFlight, window, i, t0));
  // Every request of the phase settles by its deadline; give stragglers a bounded grace.
  const drainStart = performance.now();
  await inFlight.settled(s.deadlineMs + 5000);
  const drainMs = performance.now() - drainStart;
  if (inFlight.count > 0) process.stderr.write(`  ${run.config.name} / ${run.cell.name}: ${inFlight.count} requests still open ${Math.round(drainMs)} ms after the window\n`);
  const result = phaseResult(run, s.durationMs, tally, reading);
  tally.lag.destroy();
  return { result, latency: tally.latency };
}
