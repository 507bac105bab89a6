/**
 * Before any timing: the machine, one engine per configuration (all opened
 * first and kept open, so no phase pays for a start-up), the workload drawn
 * from the seed, and the batch capacity each configuration's buckets have.
 * `Bench` carries all of it to the phases and the report.
 */
import { performance } from 'node:perf_hooks';
import { createEngine, type Engine } from '../../src/main/engine.js';
import { mulberry32 } from '../../models/generator/rng.js';
import { batchCapacity, type BatchingOptions } from '../../src/gpu-worker/scheduler.js';
import { fmt } from '../table.js';
import type { Config } from './configs.js';
import { machineLine } from '../machine.js';
import type { MachineInfo as Machine } from '../suite-results.js';
import { pct } from './format.js';
import type { Settings } from './options.js';
import { bucketedWorkload, workload, type Workload } from './workload.js';

/** The batch capacity a row sees in one configuration. */
export interface BatchCapacity {
  /** Per bucket: min(maxBatchSize, maxBatchTokens / bucket). */
  caps: number[];
  uniform: boolean;
  /** Exact when every bucket has the same capacity, else the mean over the workload's rows (so `fill` is approximate). */
  rowCapacity: number;
}

export interface Bench {
  settings: Settings;
  machine: Machine;
  engines: Map<string, Engine>;
  /** The first configuration's engine: the capacity probe runs on it. */
  ref: Engine;
  /** Mean createEngine time per configuration. */
  engineStartMs: number;
  /** The model's maximum input length (the workload is clipped to it). */
  maxLength: number;
  /** The reference engine's batching options, its buckets and their batch capacities. */
  batching: BatchingOptions;
  buckets: number[];
  capacities: number[];
  workload: Workload;
  capacityOf: Map<string, BatchCapacity>;
  /** Every configuration has the reference's one capacity in every bucket (so `fill` is exact). */
  uniformCapacity: boolean;
}

export function printHeader(s: Settings, machine: Machine): void {
  console.log(`slabserve scheduling bench: ${s.model}, device ${s.device}, intra-op threads ${s.intraOpThreads}${s.intraOpThreads === 0 ? ' (onnxruntime default)' : ''}`);
  console.log(
    machineLine(machine),
  );
}

function openEngine(s: Settings, c: Config): Promise<Engine> {
  return createEngine({
    modelsDir: s.modelsDir,
    models: [s.model],
    device: s.device,
    intraOpThreads: s.intraOpThreads,
    maxInflightBatches: c.maxInflightBatches,
    batching: { maxBatchDelayMs: c.maxBatchDelayMs, ...(c.maxBatchTokens !== undefined ? { maxBatchTokens: c.maxBatchTokens } : {}) },
    ...(c.sloP99Ms !== undefined ? { sloP99Ms: c.sloP99Ms } : {}),
    log: () => {},
  });
}

/** One engine per configuration, by name; if one fails to open, those already open are closed. */
async function openEngines(s: Settings): Promise<Map<string, Engine>> {
  const engines = new Map<string, Engine>();
  try {
    for (const c of s.configs) engines.set(c.name, await openEngine(s, c));
  } catch (err) {
    await closeEngines(engines);
    throw err;
  }
  return engines;
}

export async function closeEngines(engines: Map<string, Engine>): Promise<void> {
  for (const e of engines.values()) await e.close();
}

function batchCapacityOf(engine: Engine, model: string, w: Workload): BatchCapacity {
  const bo = engine.info().find((m) => m.name === model)!.batching;
  const caps = bo.buckets.map((b) => batchCapacity(bo, b));
  const uniform = caps.every((x) => x === caps[0]);
  return { caps, uniform, rowCapacity: uniform ? caps[0]! : w.rowsByBucket.reduce((a, n, b) => a + n * caps[b]!, 0) / w.seqs.length };
}

/** Opens the engines and draws the workload; prints what was set up. */
export async function openBench(settings: Settings, machine: Machine): Promise<Bench> {
  const t = performance.now();
  const engines = await openEngines(settings);
  const engineStartMs = (performance.now() - t) / settings.configs.length;
  const ref = engines.get(settings.configs[0]!.name)!;
  const info = ref.info().find((m) => m.name === settings.model)!;
  const batching = info.batching;
  const buckets = batching.buckets;
  const capacities = buckets.map((b) => batchCapacity(batching, b));
  const w = bucketedWorkload(workload(mulberry32(settings.seed), settings.requests, info.maxLength), buckets);
  const capacityOf = new Map(settings.configs.map((c) => [c.name, batchCapacityOf(engines.get(c.name)!, settings.model, w)]));
  const uniformCapacity = [...capacityOf.values()].every((x) => x.uniform && x.caps[0] === capacities[0]);
  const bench: Bench = { settings, machine, engines, ref, engineStartMs, maxLength: info.maxLength, batching, buckets, capacities, workload: w, capacityOf, uniformCapacity };
  printSetup(bench);
  return bench;
}

function printSetup(b: Bench): void {
  const { seqs, lens, rowsByBucket, realTotal, paddedTotal } = b.workload;
  const s = b.settings;
  const quantile = (q: number) => lens[Math.min(lens.length - 1, Math.floor(q * lens.length))]!;
  console.log(
    `workload: ${seqs.length} token sequences from seed ${s.seed} (80% queries ~16 tokens, 20% passages ~160, clipped to ${b.maxLength}), engine.runTokens one sequence per request; ` +
      `lengths ${lens[0]}..${lens[lens.length - 1]} (median ${quantile(0.5)}, P90 ${quantile(0.9)}, P99 ${quantile(0.99)}, mean ${(realTotal / lens.length).toFixed(1)}); ` +
      `buckets ${b.buckets.map((T, i) => `${T}:${fmt((100 * rowsByBucket[i]!) / seqs.length, 0)}%`).join(' ')}; ` +
      `padding efficiency of perfect bucketing ${pct(realTotal / paddedTotal, 0)}`,
  );
  console.log(
    `engines: ${s.configs.length} (${s.configs.map((c) => c.name).join(', ')}), createEngine ${(b.engineStartMs / 1000).toFixed(1)}s each (${b.ref.device.label}); ` +
      `batching maxBatchSize ${b.batching.maxBatchSize}, maxBatchTokens ${b.batching.maxBatchTokens}, batch capacity per bucket ${b.capacities.join(',')}`,
  );
}
