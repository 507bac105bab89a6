/** Seconds the run should take, for the progress bar and the first line (server start-ups estimated). */
import { RAW_BATCH_SIZES } from './efficiency.js';
import { INSTANCES_CLIENTS } from './instances.js';
import type { CaseName } from '../suite-results.js';
import type { SuiteOptions } from './options.js';

export function planSeconds(o: SuiteOptions, nModels: number): number {
  const { cases, rounds, quick } = o;
  const phase = (o.warmupMs + o.durationMs) / 1000;
  const point = (o.warmupMs + o.curvePointMs) / 1000;
  let s = 0;
  if (cases.has('batching')) s += rounds * (2 * 4 + 2) * phase + 10; // four shapes a side, and the two engines' loops
  if (cases.has('efficiency')) s += RAW_BATCH_SIZES.length * phase;
  if (cases.has('bucketing')) s += rounds * 3 * phase + 9;
  if (cases.has('curve')) s += (quick ? 2 : 3) * ((o.loadFractions.length + (quick ? 0 : 1)) * point + 3);
  if (cases.has('scheduling')) s += rounds * o.scheduling.cells.length * o.scheduling.configs.length * (phase + 0.5) + o.scheduling.configs.length * 3 + 5; // engines' start-ups and the probe
  if (cases.has('defaults')) s += rounds * 9 * phase + 15; // six engines and three raw sessions
  if (cases.has('peer')) s += rounds * 2 * 4 * phase + 8; // 64, 16, 4 and 1 clients
  if (cases.has('instances')) s += rounds * 2 * INSTANCES_CLIENTS.length * phase + 8;
  if (cases.has('floor')) s += rounds * 16 * phase + 6;
  const optIn = { cache: 8 * rounds * phase + 20, grpc: 4 * rounds * phase + 5, tracing: 5 * rounds * phase + 20, outputs: 14 * rounds * phase + 15, idle: rounds * (quick ? 20 : 45), 'model-load': 4 * rounds * phase + 30, 'long-inputs': 3 * rounds * phase + 10 };
  for (const [c, seconds] of Object.entries(optIn)) if (cases.has(c as CaseName)) s += seconds;
  s += (nModels - 1) * (rounds * 2 * phase + RAW_BATCH_SIZES.length * phase + rounds * 2 * phase + 40);
  return s;
}
