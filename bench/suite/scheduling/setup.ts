/**
 * The scheduling case's set-up, before any timing: one engine per
 * configuration (all opened first and kept open, so no phase pays for a
 * start-up), the workload's sequences and their length buckets, the batch
 * capacity each configuration's buckets have, and the capacity probe that
 * says what 100% load means. `Bench` carries it to the phases and the rows.
 */
import type { Engine, ModelStats } from '../../../src/main/engine.js';
import { batchCapacity, bucketFor } from '../../../src/gpu-worker/scheduler.js';
import { runClosedLoop } from '../../closed-loop.js';
import type { RawSeq } from '../../raw-ort.js';
import { openEngine } from '../engine.js';
import type { SuiteOptions } from '../options.js';
import type { ModelSetup } from '../setup.js';

/** The batch capacity a row sees in one configuration. */
export interface BatchCapacity {
  /** Per bucket: min(maxBatchSize, maxBatchTokens / bucket). */
  caps: number[];
  uniform: boolean;
  /** Exact when every bucket has the same capacity, else the mean over the workload's rows (so `fill` is approximate). */
  rowCapacity: number;
}

export interface Bench {
  /** The suite's settings: the configurations and cells are its `scheduling`; the first configuration is the reference (it runs the capacity probe, the ratio columns divide by its rows). */
  options: SuiteOptions;
  model: ModelSetup;
  engines: Map<string, Engine>;
  buckets: number[];
  capacities: number[];
  seqs: RawSeq[];
  /** Each sequence's bucket index (into `buckets`). */
  seqBucket: Uint8Array;
  capacityOf: Map<string, BatchCapacity>;
  /** Every configuration has the reference's one capacity in every bucket (so `fill` is exact). */
  uniformCapacity: boolean;
}

export interface Capacity {
  /** Requests/s taken as 100%. */
  perS: number;
  /** Of the probe (NaN when given). */
  meanBatch: number;
  p50Ms: number;
  errors: number;
  given: boolean;
}

export async function closeEngines(engines: Map<string, Engine>): Promise<void> {
  for (const e of engines.values()) await e.close();
}

/** Opens one engine per configuration (closing those open if one fails) over the mixed workload's token ids. */
export async function openBench(options: SuiteOptions, model: ModelSetup): Promise<Bench> {
  const { configs } = options.scheduling;
  const engines = new Map<string, Engine>();
  try {
    for (const { name, kind, ...choice } of configs) engines.set(name, await openEngine(options.device, model.dir, model.name, choice));
  } catch (err) {
    await closeEngines(engines);
    throw err;
  }
  const buckets = engines.get(configs[0]!.name)!.info().find((m) => m.name === model.name)!.batching.buckets;
  const seqs = model.workloads.get('mixed')!.requests.map((q) => ({ ids: q[0]!.ids, typeIds: q[0]!.typeIds }));
  const seqBucket = Uint8Array.from(seqs, (s) => bucketFor(buckets, s.ids.length));
  const rowsByBucket = buckets.map((_, b) => seqBucket.filter((x) => x === b).length);
  const capacityOf = new Map(
    configs.map((c) => {
      const bo = engines.get(c.name)!.info().find((m) => m.name === model.name)!.batching;
      const caps = bo.buckets.map((b) => batchCapacity(bo, b));
      const uniform = caps.every((x) => x === caps[0]);
      return [c.name, { caps, uniform, rowCapacity: uniform ? caps[0]! : rowsByBucket.reduce((a, n, b) => a + n * caps[b]!, 0) / seqs.length }];
    }),
  );
  const capacities = capacityOf.get(configs[0]!.name)!.caps;
  const uniformCapacity = [...capacityOf.values()].every((x) => x.uniform && x.caps[0] === capacities[0]);
  return { options, model, engines, buckets, capacities, seqs, seqBucket, capacityOf, uniformCapacity };
}

/** Closed-loop callers of the capacity probe. */
const PROBE_CALLERS = 128;

/**
 * What 100% load means: the requests/s the first configuration's engine answers when never idle
 * (a closed loop of PROBE_CALLERS callers, bench/closed-loop.ts), or the capacity given.
 */
export async function measureCapacity(b: Bench): Promise<Capacity> {
  const { options: o, model } = b;
  if (o.scheduling.capacity !== null) return { perS: o.scheduling.capacity, meanBatch: NaN, p50Ms: NaN, errors: 0, given: true };
  const ref = b.engines.get(o.scheduling.configs[0]!.name)!;
  const stats = (): ModelStats => ref.stats()[model.name]!;
  const loop = await runClosedLoop({
    clients: PROBE_CALLERS,
    warmupMs: Math.max(500, o.warmupMs),
    durationMs: o.durationMs,
    call: (n) => ref.runTokens(model.name, [b.seqs[n % b.seqs.length]!], { timeoutMs: 30_000 }),
    snapshot: stats,
  });
  const out = {
    perS: (loop.requests / loop.windowMs) * 1000,
    meanBatch: (loop.after.rows - loop.before.rows) / (loop.after.batches - loop.before.batches),
    p50Ms: loop.histogram.getValueAtPercentile(50) / 1000,
    errors: loop.errors,
    given: false,
  };
  loop.histogram.destroy();
  return out;
}
