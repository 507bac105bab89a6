/**
 * What one open-loop phase of the scheduling case records (SchedulingPhase):
 * how each offered request ended and the engine's counters over the window.
 */
import type { ModelStats } from '../../../src/main/engine.js';
import { SlabserveError } from '../../../src/shared/errors.js';

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

/** Counts a failed request in `c` by its error; returns the message of an error that is neither a refusal nor a timeout. */
export function classify(err: unknown, c: Counts): string | null {
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
