/**
 * The --json file: the machine, the settings, the workload, the set-up, the
 * capacity, every (configuration, cell) row with its rounds merged, and every
 * phase's raw numbers.
 */
import { writeFileSync } from 'node:fs';
import type { Aggregates } from './aggregate.js';
import type { Capacity } from './capacity.js';
import type { PhaseResult } from './results.js';
import type { Bench } from './setup.js';

function optionsRecord(b: Bench) {
  const s = b.settings;
  return {
    model: s.model,
    device: s.device,
    intraOpThreads: s.intraOpThreads,
    configs: s.configs,
    loads: s.loads,
    burstLoads: s.burstLoads,
    burst: { factor: s.burst.factor, duty: s.burst.duty, periodMs: s.burst.periodMs },
    deadlineMs: s.deadlineMs,
    warmupS: s.warmupMs / 1000,
    durationS: s.durationMs / 1000,
    rounds: s.rounds,
    capacityConcurrency: s.capacityConcurrency,
    capacityS: s.capacityMs / 1000,
    requests: s.requests,
    seed: s.seed,
    quick: s.quick,
  };
}

function workloadRecord(b: Bench) {
  const { seqs, lens, realTotal, rowsByBucket } = b.workload;
  return {
    sequences: seqs.length,
    minTokens: lens[0],
    maxTokens: lens[lens.length - 1],
    meanTokens: realTotal / lens.length,
    bucketMix: b.buckets.map((T, i) => ({ T, capacity: b.capacities[i], n: rowsByBucket[i] })),
  };
}

export function writeJson(path: string, b: Bench, capacity: Capacity, aggregates: Aggregates, phases: PhaseResult[]): void {
  const out = {
    machine: b.machine,
    options: optionsRecord(b),
    workload: workloadRecord(b),
    setup: { engineStartMs: b.engineStartMs, batching: b.batching, batchCapacity: Object.fromEntries(b.capacityOf) },
    capacity,
    aggregated: [...aggregates.values()],
    phases,
  };
  writeFileSync(path, JSON.stringify(out, null, 2) + '\n');
  console.log(`wrote ${path}`);
}
