/**
 * The report's scheduling section (bench/report.ts calls it), from
 * results.json's `scheduling` (bench/suite/scheduling/aggregate.ts): one table
 * per (pattern, load) cell, a summary line per configuration across the cells,
 * and the reading (the facts the case asks about, computed).
 */
import { alignedTable, fmt, pct } from './table.js';
import { LONG_MIN, refused, SHORT_MAX, timedOut, type Aggregate, type SchedulingSection } from './suite/scheduling/aggregate.js';
import type { Cell, Config } from './suite/scheduling/configs.js';

/** The rows, looked up by configuration and cell. */
type Rows = (config: string, cell: string) => Aggregate;

function cellHeaders(sec: SchedulingSection): string[] {
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
    `fill${sec.uniformCapacity ? '' : ' (approx)'}`,
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
function cellTables(sec: SchedulingSection, rows: Rows): string[] {
  const refName = sec.configs[0]!.name;
  const perS = sec.capacity.perS;
  const out = [
    `Offered load as % of the measured capacity (${fmt(perS, 0)} req/s${sec.capacity.given ? ', given' : ''}), ${sec.model}, the ${sec.workload} workload's token ids through engine.runTokens. answered/s = answered within the ${sec.deadlineMs} ms deadline; latency of answered requests, from the scheduled arrival; ` +
      `refused = OverloadedError at once (admission or no free slot); timed out = DeadlineExceededError; "ref" = ${refName}. ${sec.rounds} round${sec.rounds > 1 ? 's' : ''} of ${sec.durationS} s merged per row.`,
  ];
  for (const cell of sec.cells) {
    const ref = rows(refName, cell.name);
    const bursts = cell.pattern === 'burst' ? `, bursts at ${fmt((perS * cell.loadPct * sec.burst.factor) / 100, 0)} req/s` : '';
    out.push('', `### ${cell.name} (${fmt((perS * cell.loadPct) / 100, 0)} req/s mean${bursts})`, '', alignedTable(cellHeaders(sec), sec.configs.map((c) => cellRow(c, rows(c.name, cell.name), ref))));
  }
  return out;
}

/** One line per configuration across every cell. */
function summary(sec: SchedulingSection, rows: Rows): string[] {
  const line = (c: Config) => [
    c.name,
    ...sec.cells.map((cell) => {
      const a = rows(c.name, cell.name);
      return `${fmt(a.p99Ms, 1)} / ${pct(a.counts.answered / a.counts.offered, 0)}`;
    }),
  ];
  return [
    '',
    `### Summary: P99 ms of answered requests / share answered in time (ref ${sec.configs[0]!.name})`,
    '',
    alignedTable(['config', ...sec.cells.map((c) => c.name)], sec.configs.map(line)),
    '',
    `\\* maxInflightBatches 1: the scheduler only decides when the device is idle, so a batch closes at once and maxBatchDelayMs never applies; ` +
      `this row stands for fixed windows 0, 5 and 20 ms alike. The fixed windows act only in the if=2 rows.`,
  ];
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

/** The section's Markdown. */
export function schedulingMarkdown(sec: SchedulingSection): string {
  const rows: Rows = (config, cell) => sec.rows.find((x) => x.config === config && x.cell === cell)!;
  const reading = [...readTargets(sec.configs, sec.cells, rows), ...readFixedWindows(sec.configs, sec.cells, rows), ...readOverload(sec.configs, sec.cells, rows)];
  return [...cellTables(sec, rows), ...summary(sec, rows), '', 'Reading (computed):', '', ...reading.map((l) => `- ${l}`)].join('\n');
}
