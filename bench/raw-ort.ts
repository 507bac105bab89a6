/**
 * The ceiling: onnxruntime called directly in the bench's own thread, with the
 * model slabserve serves (pooling appended by prepareModel, so it computes
 * exactly what the server computes) and the same session options as the
 * server's runner. Batches are bucket-homogeneous, padded to the bucket, and
 * built before timing starts, so a raw phase pays for `session.run` only: the
 * best case for slabserve's scheduler. Used by the suite (bench/suite/).
 */
import { performance } from 'node:perf_hooks';
import type { Histogram } from 'hdr-histogram-js';
import * as ort from 'onnxruntime-node';
import type { PreparedModel } from '../src/gpu-worker/graph.js';
import { parseDevice } from '../src/gpu-worker/device.js';
import { bucketFor } from '../src/gpu-worker/scheduler.js';
import { keepOnnxruntimeTelemetryOff } from '../src/main/onnxruntime-telemetry.js';

export interface RawSeq {
  ids: Int32Array;
  typeIds: Int32Array;
}

export interface RawBatch {
  feeds: Record<string, ort.Tensor>;
  rows: number;
  realTokens: number;
}

/** A session as the server's runner opens one: graph optimizations on, the given device and intra-op threads. */
export function openRawSession(prepared: PreparedModel, device: string, intraOpThreads: number): Promise<ort.InferenceSession> {
  keepOnnxruntimeTelemetryOff(); // as the server does
  const d = parseDevice(device);
  const providers: ort.InferenceSession.ExecutionProviderConfig[] = d.kind === 'cuda' ? [{ name: 'cuda', deviceId: d.id }] : ['cpu'];
  return ort.InferenceSession.create(prepared.bytes, {
    executionProviders: providers,
    graphOptimizationLevel: 'all',
    intraOpNumThreads: intraOpThreads,
    logSeverityLevel: 3,
  });
}

/** Bucket-homogeneous batches of exactly `size` rows, in seeded random order. */
export function rawBatches(seqs: readonly RawSeq[], buckets: number[], size: number, prepared: PreparedModel, r: () => number): RawBatch[] {
  const byBucket: RawSeq[][] = buckets.map(() => []);
  for (const s of seqs) byBucket[bucketFor(buckets, s.ids.length)]!.push(s);
  const out: RawBatch[] = [];
  const type = prepared.inputType;
  const make = (n: number) => (type === 'int64' ? new BigInt64Array(n) : new Int32Array(n));
  const put = (a: BigInt64Array | Int32Array, at: number, v: number) => {
    if (a instanceof BigInt64Array) a[at] = BigInt(v);
    else a[at] = v;
  };
  for (let b = 0; b < buckets.length; b++) {
    const T = buckets[b]!;
    const group = byBucket[b]!;
    for (let at = 0; at + size <= group.length; at += size) {
      const n = size * T;
      const ids = make(n);
      const mask = make(n);
      const types = make(n);
      let real = 0;
      group.slice(at, at + size).forEach((s, i) => {
        for (let t = 0; t < s.ids.length; t++) {
          put(ids, i * T + t, s.ids[t]!);
          put(mask, i * T + t, 1);
          put(types, i * T + t, s.typeIds[t]!);
        }
        real += s.ids.length;
      });
      const feeds: Record<string, ort.Tensor> = {
        input_ids: new ort.Tensor(type, ids, [size, T]),
        attention_mask: new ort.Tensor(type, mask, [size, T]),
      };
      if (prepared.hasTokenTypeIds) feeds.token_type_ids = new ort.Tensor(type, types, [size, T]);
      out.push({ feeds, rows: size, realTokens: real });
    }
  }
  if (out.length === 0) throw new Error(`workload too small for raw batches of ${size}`);
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(r() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

export interface RawLoopResult {
  rows: number;
  realTokens: number;
  batches: number;
  windowMs: number;
  /** This process's CPU over the window. */
  cpuMs: number;
}

/**
 * Runs the batches back to back (round-robin) for `warmupMs`, then measures
 * `durationMs`, recording each batch's run time (µs) in `histogram`.
 */
export async function runRawLoop(
  session: ort.InferenceSession,
  batches: readonly RawBatch[],
  warmupMs: number,
  durationMs: number,
  histogram: Histogram,
): Promise<RawLoopResult> {
  const fetches = session.outputNames.slice();
  let i = 0;
  const warmEnd = performance.now() + warmupMs;
  while (performance.now() < warmEnd) await session.run(batches[i++ % batches.length]!.feeds, fetches);
  let rows = 0;
  let real = 0;
  let n = 0;
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const end = t0 + durationMs;
  while (performance.now() < end) {
    const b = batches[i++ % batches.length]!;
    const s = performance.now();
    await session.run(b.feeds, fetches);
    histogram.recordValue(Math.max(1, Math.round((performance.now() - s) * 1000)));
    rows += b.rows;
    real += b.realTokens;
    n++;
  }
  const windowMs = performance.now() - t0;
  const u = process.cpuUsage(cpu0);
  return { rows, realTokens: real, batches: n, windowMs, cpuMs: (u.user + u.system) / 1000 };
}
