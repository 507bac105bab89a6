/**
 * The scheduling bench's workload: a fixed-seed list of token sequences,
 * 80% "queries" (log-normal, median 16 tokens) and 20% "passages"
 * (log-normal, median 160, clipped to the model's maximum length), and how
 * they fall into the engine's length buckets.
 */
import { bucketFor } from '../../src/gpu-worker/scheduler.js';

export interface Seq {
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
export function workload(r: () => number, n: number, maxLen: number): Seq[] {
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

/** The workload and where its sequences fall in the engine's length buckets. */
export interface Workload {
  seqs: Seq[];
  /** Each sequence's bucket index (into `buckets`). */
  seqBucket: Uint8Array;
  /** Sequence lengths, ascending. */
  lens: number[];
  /** How many sequences fall in each bucket. */
  rowsByBucket: number[];
  /** Real tokens of the whole workload, and padded to their buckets. */
  realTotal: number;
  paddedTotal: number;
}

export function bucketedWorkload(seqs: Seq[], buckets: readonly number[]): Workload {
  const lens = seqs.map((s) => s.ids.length).sort((a, b) => a - b);
  const seqBucket = Uint8Array.from(seqs, (s) => bucketFor(buckets, s.ids.length));
  return {
    seqs,
    seqBucket,
    lens,
    rowsByBucket: buckets.map((_, b) => seqBucket.filter((x) => x === b).length),
    realTotal: lens.reduce((a, b) => a + b, 0),
    paddedTotal: seqs.reduce((a, s) => a + buckets[bucketFor(buckets, s.ids.length)]!, 0),
  };
}
