/**
 * scheduling: fixed batch windows against the latency target, in-process, under
 * open-loop Poisson and bursts (bench/README.md). One engine per
 * --scheduling-configs item; a capacity probe on the first says what 100% is;
 * every configuration runs each cell once per round on the same arrivals, in
 * alternating order. First model only.
 */
import { mulberry32 } from '../../models/generator/rng.js';
import { arrivalTimes } from '../arrivals.js';
import { fmt } from '../table.js';
import type { SuiteContext } from './context.js';
import { roundOrder } from './phases.js';
import { aggregateRounds, type PhaseRecords, type SchedulingSection } from './scheduling/aggregate.js';
import type { Cell, Config } from './scheduling/configs.js';
import { runPhase, type Schedule } from './scheduling/open-loop-phase.js';
import { phaseKey } from './scheduling/results.js';
import { closeEngines, measureCapacity, openBench, type Bench, type Settings } from './scheduling/setup.js';
import type { ModelSetup } from './setup.js';

/** 5x the mean rate for 20% of every second: silence in between. */
export const SCHEDULING_BURSTS = { factor: 5, duty: 0.2, periodMs: 1000 };
const DEADLINE_MS = 1000;

/** A cell's arrivals in one round, seeded by the seed, the round and the cell's place. */
function schedule(b: Bench, cell: Cell, ci: number, capacityPerS: number, round: number): Schedule {
  const s = b.settings;
  const r = mulberry32((s.seed * 7919 + round * 104729 + ci * 1299709) >>> 0);
  const times = arrivalTimes((capacityPerS * cell.loadPct) / 100, s.warmupMs + s.durationMs, r, cell.pattern === 'burst' ? s.burst : undefined);
  const start = Math.floor(r() * b.seqs.length);
  return { times, seq: Uint32Array.from(times, (_, i) => (start + i) % b.seqs.length) };
}

/** Every (cell, configuration) phase once per round, the whole order reversed every other round. */
async function runRounds(ctx: SuiteContext, b: Bench, capacityPerS: number): Promise<PhaseRecords> {
  const s = b.settings;
  const records: PhaseRecords = { phases: [], histograms: new Map() };
  const order = s.cells.flatMap((cell, ci) => s.configs.map((config) => ({ cell, ci, config })));
  const phaseS = (s.warmupMs + s.durationMs) / 1000;
  for (let k = 1; k <= s.rounds; k++) {
    const scheds = s.cells.map((cell, ci) => schedule(b, cell, ci, capacityPerS, k - 1));
    for (const i of roundOrder(k, order.length)) {
      const { cell, ci, config } = order[i]!;
      const label = `scheduling ${s.model} ${config.name} ${cell.name} round ${k}`;
      ctx.progress.start(label, phaseS);
      const { result, latency } = await runPhase(b, { config, engine: b.engines.get(config.name)!, cell, round: k - 1, sched: scheds[ci]! });
      records.phases.push(result);
      const key = phaseKey(config.name, cell.name);
      const merged = records.histograms.get(key);
      if (merged) {
        merged.add(latency);
        latency.destroy();
      } else records.histograms.set(key, latency);
      const other = result.firstOtherError ? `, ${result.counts.otherErrors} other errors, first: ${result.firstOtherError}` : '';
      ctx.progress.finish(label, phaseS, `${fmt((result.counts.answered / result.windowMs) * 1000, 0)} answered/s, P99 ${fmt(result.p99Ms, 1)} ms${other}`);
      await new Promise((res) => setTimeout(res, 100));
    }
  }
  return records;
}

export async function runScheduling(ctx: SuiteContext, m: ModelSetup, first: boolean): Promise<void> {
  const o = ctx.options;
  if (!first || !o.cases.has('scheduling')) return;
  const settings: Settings = {
    model: m.name,
    modelsDir: m.dir,
    device: o.device,
    configs: o.scheduling.configs,
    cells: o.scheduling.cells,
    burst: SCHEDULING_BURSTS,
    deadlineMs: DEADLINE_MS,
    warmupMs: o.warmupMs,
    durationMs: o.durationMs,
    rounds: o.rounds,
    capacityGiven: o.scheduling.capacity,
    seed: o.seed,
  };
  const b = await openBench(settings, m.workloads.get('mixed')!);
  try {
    const capacity = await measureCapacity(b);
    ctx.progress.log(`scheduling ${m.name}: capacity ${fmt(capacity.perS, 0)} requests/s (${capacity.given ? 'given' : `closed loop on "${settings.configs[0]!.name}", mean batch ${fmt(capacity.meanBatch, 1)}`})`);
    const records = await runRounds(ctx, b, capacity.perS);
    const section: SchedulingSection = {
      model: m.name,
      workload: 'mixed',
      capacity,
      configs: settings.configs,
      cells: settings.cells,
      burst: settings.burst,
      deadlineMs: settings.deadlineMs,
      rounds: settings.rounds,
      durationS: settings.durationMs / 1000,
      buckets: b.buckets,
      capacities: b.capacities,
      uniformCapacity: b.uniformCapacity,
      rows: [...aggregateRounds(b, records).values()],
      phases: records.phases,
    };
    ctx.scheduling = section;
  } finally {
    await closeEngines(b.engines);
  }
}
