/**
 * What the scheduling bench prints at the end: one table per cell, a summary
 * line per configuration across the cells, the "reading" (the facts the
 * questions of SCHEDULING.md ask about, computed), the column legend.
 */
import { performance } from 'node:perf_hooks';
import { alignedTable, fmt } from '../table.js';
import { LONG_MIN, SHORT_MAX, type Aggregate, type Aggregates } from './aggregate.js';
import type { Cell } from './arrivals.js';
import type { Capacity } from './capacity.js';
import type { Config } from './configs.js';
import { pct } from './format.js';
import { phaseKey, refused, timedOut, type PhaseResult } from './results.js';
import type { Bench } from './setup.js';

/** The rows, looked up by configuration and cell. */
type Rows = (config: string, cell: string) => Aggregate;

function cellHeaders(b: Bench): string[] {
  return [
    'config',
    'offered/s',
    'answered/s',
    'vs ref',
    'tok/s vs ref',
    'P50 ms',
    'P99 ms',
    'P99 vs ref',
    'P99 by round',
    'refused',
    'timed out',
    `answered ≤${SHORT_MAX} / >${LONG_MIN} tok`,
    'mean batch',
    `fill${b.uniformCapacity ? '' : ' (approx)'}`,
    'pad eff',
    'ORT ms/batch',
    'send lag P99',
  ];
}

function cellRow(c: Config, a: Aggregate, ref: Aggregate): string[] {
  return [
    c.name + (c.kind === 'fixed' && c.maxInflightBatches === 1 ? ' *' : ''),
    fmt(a.offeredPerS, 0),
    fmt(a.answeredPerS, 0),
    `${fmt(a.answeredPerS / ref.answeredPerS, 2)}x`,
    `${fmt(a.answeredTokensPerS / ref.answeredTokensPerS, 2)}x`,
    fmt(a.p50Ms, 1),
    fmt(a.p99Ms, 1),
    `${fmt(a.p99Ms / ref.p99Ms, 2)}x`,
    a.roundsP99Ms.map((x) => fmt(x, 1)).join(' / '),
    pct(refused(a.counts) / a.counts.offered),
    pct(timedOut(a.counts) / a.counts.offered),
    `${pct(a.shortAnswered, 0)} / ${pct(a.longAnswered, 0)}`,
    fmt(a.meanBatch, 1),
    pct(a.batchFill, 0),
    pct(a.paddingEfficiency, 0),
    fmt(a.ortMsPerBatch, 2),
    fmt(a.sendLagP99Ms, 1),
  ];
}

/** One table per (pattern, load) cell, a row per configuration. */
function printCellTables(b: Bench, capacity: Capacity, rows: Rows): void {
  const s = b.settings;
  const refName = s.configs[0]!.name;
  const headers = cellHeaders(b);
  console.log('');
  console.log(
    `Offered load as % of the measured capacity (${fmt(capacity.perS, 0)} req/s). answered/s = answered within the deadline; latency of answered requests, from the scheduled arrival; ` +
      `refused = OverloadedError at once (admission or no free slot); timed out = DeadlineExceededError; "ref" = ${refName}. ${s.rounds > 1 ? `${s.rounds} rounds of ${s.durationMs / 1000}s merged per row.` : ''}`,
  );
  for (const cell of s.cells) {
    const ref = rows(refName, cell.name);
    const bursts = cell.pattern === 'burst' ? `, bursts at ${fmt((capacity.perS * cell.loadPct * s.burst.factor) / 100, 0)} req/s` : '';
    console.log('');
    console.log(`## ${cell.name} (${fmt((capacity.perS * cell.loadPct) / 100, 0)} req/s mean${bursts})`);
    console.log('');
    console.log(alignedTable(headers, s.configs.map((c) => cellRow(c, rows(c.name, cell.name), ref))));
  }
}

/** One line per configuration across every cell. */
function printSummary(b: Bench, rows: Rows): void {
  const { configs, cells } = b.settings;
  console.log('');
  console.log(`## summary: P99 ms of answered requests / share answered in time (ref ${configs[0]!.name})`);
  console.log('');
  const line = (c: Config) => [
    c.name,
    ...cells.map((cell) => {
      const a = rows(c.name, cell.name);
      return `${fmt(a.p99Ms, 1)} / ${pct(a.counts.answered / a.counts.offered, 0)}`;
    }),
  ];
  console.log(alignedTable(['config', ...cells.map((c) => c.name)], configs.map(line)));
  console.log('');
  console.log(
    `* maxInflightBatches 1: the scheduler only decides when the device is idle, so a batch closes at once and maxBatchDelayMs never applies; ` +
      `this row stands for fixed windows 0, 5 and 20 ms alike. The fixed windows act only in the if=2 rows.`,
  );
}

/** Each latency-target row against its target, in every cell. */
function readTargets(configs: Config[], cells: Cell[], rows: Rows): string[] {
  return configs
    .filter((x) => x.kind === 'slo')
    .map((c) => {
      const parts = cells.map((cell) => {
        const a = rows(c.name, cell.name);
        const ok = a.p99Ms <= c.sloP99Ms!;
        return `${cell.name}: P99 ${fmt(a.p99Ms, 1)} ms ${ok ? '<=' : '>'} ${c.sloP99Ms} (refused ${pct(refused(a.counts) / a.counts.offered, 0)}, timed out ${pct(timedOut(a.counts) / a.counts.offered, 0)})`;
      });
      return `${c.name}: ${parts.join('; ')}`;
    });
}

/** The fixed windows with 2+ batches in flight against the shortest of them, per cell. */
function readFixedWindows(configs: Config[], cells: Cell[], rows: Rows): string[] {
  const fixed2 = configs.filter((x) => x.kind === 'fixed' && x.maxInflightBatches > 1).sort((a, b) => a.maxBatchDelayMs - b.maxBatchDelayMs);
  if (fixed2.length <= 1) return [];
  const base = fixed2[0]!;
  return cells.map((cell) => {
    const b = rows(base.name, cell.name);
    const parts = fixed2.slice(1).map((c) => {
      const a = rows(c.name, cell.name);
      return `${c.name}: P50 ${fmt(a.p50Ms / b.p50Ms, 2)}x, P99 ${fmt(a.p99Ms / b.p99Ms, 2)}x, mean batch ${fmt(a.meanBatch, 1)} vs ${fmt(b.meanBatch, 1)}, answered ${fmt(a.answeredPerS / b.answeredPerS, 2)}x`;
    });
    return `fixed windows vs ${base.name}, ${cell.name}: ${parts.join('; ')}`;
  });
}

/** Over capacity: how each configuration's requests ended. */
function readOverload(configs: Config[], cells: Cell[], rows: Rows): string[] {
  return cells
    .filter((x) => x.loadPct > 100)
    .map((cell) => {
      const parts = configs.map((c) => {
        const a = rows(c.name, cell.name);
        const o = a.counts.offered;
        return `${c.name} answered ${pct(a.counts.answered / o, 0)}, refused ${pct(a.counts.refusedAdmission / o, 0)} by admission + ${pct(a.counts.refusedSlots / o, 0)} no slot, timed out ${pct(a.counts.timedOutQueued / o, 0)} in queue + ${pct(a.counts.timedOutLate / o, 0)} late + ${pct(a.counts.timedOutUnsent / o, 0)} unsent`;
      });
      return `${cell.name}: ${parts.join('; ')}`;
    });
}

function printReading(b: Bench, rows: Rows): void {
  const { configs, cells } = b.settings;
  const reading = [...readTargets(configs, cells, rows), ...readFixedWindows(configs, cells, rows), ...readOverload(configs, cells, rows)];
  console.log('');
  console.log('reading (computed):');
  for (const l of reading) console.log(`- ${l}`);
}

function printColumns(b: Bench): void {
  const refName = b.settings.configs[0]!.name;
  const capacityNote = b.uniformCapacity ? b.capacities[0] : "per bucket; approximated by the capacity the workload's rows see on average";
  console.log('');
  console.log(`columns:
  offered/s     requests scheduled per second in the measured window(s)
  answered/s    requests answered within their deadline per second; vs ref: / the ${refName} row
  tok/s vs ref  real tokens of the requests answered in time per second, / the ref row's (shedding long requests lowers it more than answered/s)
  P50, P99 ms   latency of answered requests, from the scheduled arrival to the answer (HDR histogram; rounds merged); P99 by round: each round alone
  refused       share of offered requests refused at once with OverloadedError (SLABSERVE_OVERLOADED: admission's predicted wait, or no free slot)
  timed out     share of offered requests that failed with DeadlineExceededError (dropped in the queue, answered late, or sent too late)
  answered ≤${SHORT_MAX} / >${LONG_MIN} tok   share answered in time of the requests in buckets up to ${SHORT_MAX} tokens / above ${LONG_MIN} tokens
  mean batch    engine.stats() rows / batches over the measured window
  fill          mean batch / batch capacity of the bucket (min(maxBatchSize, maxBatchTokens / bucket) = ${capacityNote})
  pad eff       engine.stats() realTokens / paddedTokens over the window
  ORT ms/batch  engine.stats() runMs / batches (with 2 batches in flight it includes the wait behind the other one)
  send lag P99  ms the generator sent a request after its scheduled time (counted in the latency, and off the deadline)`);
}

/** The tables, the summary, the reading and the legend. */
export function printReport(b: Bench, capacity: Capacity, aggregates: Aggregates): void {
  const rows: Rows = (config, cell) => aggregates.get(phaseKey(config, cell))!;
  printCellTables(b, capacity, rows);
  printSummary(b, rows);
  printReading(b, rows);
  printColumns(b);
}

/** The run's wall time, and how loaded the machine was while the phases ran (others' work included). */
export function printTotals(b: Bench, phases: PhaseResult[], startedMs: number): void {
  const la = phases.map((x) => x.loadavg1);
  console.log(`total time ${((performance.now() - startedMs) / 1000).toFixed(0)}s; 1-min load average during the phases ${fmt(Math.min(...la), 1)}..${fmt(Math.max(...la), 1)} on ${b.machine.cores} cores`);
}
