/**
 * The scheduling case's engine configurations (--scheduling-configs), its
 * (pattern, load) cells, its bursts and its deadline:
 *
 *   fixed:D[:I[:N]]   maxBatchDelayMs D, maxInflightBatches I (default 1), no latency target
 *   slo:T[:I[:N]]     sloP99Ms T, maxInflightBatches I (default 1)
 *   (N: maxBatchTokens, default the engine's)
 */
import { fail } from '../../args.js';

export interface Config {
  /** e.g. "fixed 5ms if=1", "slo 50ms if=1 tok=4096": the row's name in every table. */
  name: string;
  kind: 'fixed' | 'slo';
  maxBatchDelayMs: number;
  maxInflightBatches: number;
  sloP99Ms?: number;
  /** maxBatchTokens override (default: the engine's). */
  maxBatchTokens?: number;
}

/** 5x the mean rate for 20% of every second: silence in between. */
export const SCHEDULING_BURSTS = { factor: 5, duty: 0.2, periodMs: 1000 };
/** Every request's deadline, from its scheduled arrival. */
export const DEADLINE_MS = 1000;

export const CONFIG_FORMS = 'fixed:DELAY_MS[:INFLIGHT[:MAX_BATCH_TOKENS]] or slo:TARGET_MS[:INFLIGHT[:MAX_BATCH_TOKENS]]';

/** One --configs item as a configuration, or exit 2 naming --configs. */
export function parseConfig(s: string): Config {
  const m = /^(fixed|slo):(\d+(?:\.\d+)?)(?::(\d+)(?::(\d+))?)?$/.exec(s.trim());
  if (!m) fail(`--scheduling-configs: expected ${CONFIG_FORMS}, got "${s}"`);
  const kind = m[1] as 'fixed' | 'slo';
  const v = Number(m[2]);
  const inflight = m[3] === undefined ? 1 : Number(m[3]);
  if (inflight < 1) fail(`--scheduling-configs: inflight must be >= 1 in "${s}"`);
  const tokens = m[4] === undefined ? {} : { maxBatchTokens: Number(m[4]) };
  const suffix = m[4] === undefined ? '' : ` tok=${m[4]}`;
  if (kind === 'fixed') return { name: `fixed ${v}ms if=${inflight}${suffix}`, kind, maxBatchDelayMs: v, maxInflightBatches: inflight, ...tokens };
  if (!(v > 0)) fail(`--scheduling-configs: a latency target must be > 0 in "${s}"`);
  // maxBatchDelayMs 5: the engine's default window; what this row varies is the latency target.
  return { name: `slo ${v}ms if=${inflight}${suffix}`, kind, maxBatchDelayMs: 5, maxInflightBatches: inflight, sloP99Ms: v, ...tokens };
}

/** The --configs items (already split on commas) as configurations: at least one, no name twice. */
export function parseConfigs(items: readonly string[]): Config[] {
  const configs = items.filter((x) => x.trim() !== '').map(parseConfig);
  if (configs.length === 0) fail('--scheduling-configs: nothing to run');
  if (new Set(configs.map((c) => c.name)).size !== configs.length) fail('--scheduling-configs: a configuration is listed twice');
  return configs;
}

/** One (pattern, load) cell: every configuration runs it. */
export interface Cell {
  /** e.g. "poisson 60%". */
  name: string;
  pattern: 'poisson' | 'burst';
  /** Mean offered load, % of the measured capacity. */
  loadPct: number;
}

/** The cells in the order they run: the Poisson loads, then the burst loads. */
export function cellsOf(loads: readonly number[], burstLoads: readonly number[]): Cell[] {
  return [
    ...loads.map((l): Cell => ({ name: `poisson ${l}%`, pattern: 'poisson', loadPct: l })),
    ...burstLoads.map((l): Cell => ({ name: `burst ${l}%`, pattern: 'burst', loadPct: l })),
  ];
}
