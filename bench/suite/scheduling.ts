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
import { aggregateRounds, phaseKey, type PhaseRecords, type SchedulingSection } from './scheduling/aggregate.js';
import { DEADLINE_MS, SCHEDULING_BURSTS, type Cell } from './scheduling/configs.js';
import { runPhase, type Schedule } from './scheduling/open-loop-phase.js';
import { closeEngines, measureCapacity, openBench, type Bench } from './scheduling/setup.js';
import type { ModelSetup } from './setup.js';

/** A cell's arrivals in one round, seeded by the seed, the round and the cell's place. */
function schedule(b: Bench, cell: Cell, ci: number, capacityPerS: number, round: number): Schedule {
  const o = b.options;
  const r = mulberry32((o.seed * 7919 + round * 104729 + ci * 1299709) >>> 0);
  const times = arrivalTimes((capacityPerS * cell.loadPct) / 100, o.warmupMs + o.durationMs, r, cell.pattern === 'burst' ? SCHEDULING_BURSTS : undefined);
  const start = Math.floor(r() * b.seqs.length);
  return { times, seq: Uint32Array.from(times, (_, i) => (start + i) % b.seqs.length) };
}

/** Every (cell, configuration) phase once per round, the whole order reversed every other round. */
async function runRounds(ctx: SuiteContext, b: Bench, capacityPerS: number): Promise<PhaseRecords> {
  const o = b.options;
  const { cells, configs } = o.scheduling;
  const records: PhaseRecords = { phases: [], histograms: new Map() };
  const order = cells.flatMap((cell, ci) => configs.map((config) => ({ cell, ci, config })));
  const phaseS = (o.warmupMs + o.durationMs) / 1000;
  for (let k = 1; k <= o.rounds; k++) {
    const scheds = cells.map((cell, ci) => schedule(b, cell, ci, capacityPerS, k - 1));
    for (const i of roundOrder(k, order.length)) {
      const { cell, ci, config } = order[i]!;
      const label = `scheduling ${b.model.name} ${config.name} ${cell.name} round ${k}`;
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
  const { configs, cells } = o.scheduling;
  const b = await openBench(o, m);
  try {
    const capacity = await measureCapacity(b);
    ctx.progress.log(`scheduling ${m.name}: capacity ${fmt(capacity.perS, 0)} requests/s (${capacity.given ? 'given' : `closed loop on "${configs[0]!.name}", mean batch ${fmt(capacity.meanBatch, 1)}`})`);
    const records = await runRounds(ctx, b, capacity.perS);
    const section: SchedulingSection = {
      model: m.name,
      workload: 'mixed',
      capacity,
      configs,
      cells,
      burst: SCHEDULING_BURSTS,
      deadlineMs: DEADLINE_MS,
      rounds: o.rounds,
      durationS: o.durationMs / 1000,
      buckets: b.buckets,
      capacities: b.capacities,
      uniformCapacity: b.uniformCapacity,
      rows: aggregateRounds(b, records),
      phases: records.phases,
    };
    ctx.scheduling = section;
  } finally {
    await closeEngines(b.engines);
  }
}
