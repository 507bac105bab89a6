/**
 * The order the phases run in: every (cell, configuration) pair once per
 * round, cells in order, configurations A B C ... and in the next round the
 * whole order reversed, so drift on a shared box hits all alike. Within a
 * round every configuration of a cell gets the same arrival schedule.
 */
import { mulberry32 } from '../../models/generator/rng.js';
import { fmt } from '../table.js';
import { describeBurst, schedule, type Cell, type Schedule } from './arrivals.js';
import { sleep } from './clock.js';
import type { Config } from './configs.js';
import { runPhase } from './open-loop-phase.js';
import type { Settings } from './options.js';
import { phaseKey, type Histogram, type PhaseResult } from './results.js';
import type { Bench } from './setup.js';

/** Every phase's result, and per (configuration, cell) the latency histogram of all its rounds merged. */
export interface PhaseRecords {
  phases: PhaseResult[];
  histograms: Map<string, Histogram>;
}

/** What will run, and about how long it takes. */
export function printPlan(s: Settings): void {
  const phaseS = (s.warmupMs + s.durationMs) / 1000;
  const n = s.cells.length * s.configs.length * s.rounds;
  console.log(
    `phases: ${s.cells.map((c) => c.name).join(', ')} x ${s.configs.length} configs x ${s.rounds} round${s.rounds > 1 ? 's' : ''} (alternating order), ` +
      `each ${s.warmupMs / 1000}s warm-up + ${s.durationMs / 1000}s measured (+ drain); deadline ${s.deadlineMs} ms from the scheduled arrival; ${describeBurst(s.burst)}; ` +
      `expected ~${Math.round(n * (phaseS + 0.4))} s`,
  );
}

/** Each cell's arrivals for one round, seeded by the seed, the round and the cell's place. */
function roundSchedules(b: Bench, capacityPerS: number, round: number): Map<string, Schedule> {
  const s = b.settings;
  return new Map(
    s.cells.map((cell, ci) => [cell.name, schedule(cell, s.burst, capacityPerS, s.warmupMs + s.durationMs, mulberry32((s.seed * 7919 + round * 104729 + ci * 1299709) >>> 0), b.workload.seqs.length)]),
  );
}

function record(records: PhaseRecords, result: PhaseResult, latency: Histogram): void {
  records.phases.push(result);
  const k = phaseKey(result.config, result.cell);
  const h = records.histograms.get(k);
  if (h) {
    h.add(latency);
    latency.destroy();
  } else records.histograms.set(k, latency);
}

async function runRound(b: Bench, capacityPerS: number, round: number, order: { cell: Cell; config: Config }[], records: PhaseRecords): Promise<void> {
  const rounds = b.settings.rounds;
  const scheds = roundSchedules(b, capacityPerS, round);
  // One progress line (stderr) per cell: each configuration's answered/s and P99.
  let lastCell = '';
  let line: string[] = [];
  const flush = () => console.error(`round ${round + 1}/${rounds} ${lastCell} (answered/s, P99 ms): ${line.join(', ')}`);
  for (const { cell, config } of order) {
    if (cell.name !== lastCell && line.length) {
      flush();
      line = [];
    }
    lastCell = cell.name;
    const { result, latency } = await runPhase(b, { config, engine: b.engines.get(config.name)!, cell, round, sched: scheds.get(cell.name)! });
    record(records, result, latency);
    line.push(`${config.name} ${fmt((result.counts.answered / result.windowMs) * 1000, 0)}/${fmt(result.p99Ms, 1)}`);
    if (result.firstOtherError) console.error(`  ${config.name} / ${cell.name}: ${result.counts.otherErrors} other errors, first: ${result.firstOtherError}`);
    await sleep(100);
  }
  if (line.length) flush();
}

/** Runs every phase of every round, offered loads as percentages of `capacityPerS`. */
export async function runRounds(b: Bench, capacityPerS: number): Promise<PhaseRecords> {
  const s = b.settings;
  const records: PhaseRecords = { phases: [], histograms: new Map() };
  const order = s.cells.flatMap((cell) => s.configs.map((config) => ({ cell, config })));
  for (let round = 0; round < s.rounds; round++) {
    await runRound(b, capacityPerS, round, round % 2 === 0 ? order : [...order].reverse(), records);
  }
  return records;
}
