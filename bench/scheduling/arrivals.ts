/**
 * The open-loop arrival patterns: `poisson` (exponential gaps at the mean
 * rate) and `burst` (on/off: factor x the mean rate for `duty` of every
 * period, the rest of the period at the rate that keeps the mean). Arrival
 * times are drawn before a phase starts, from a seed, so every configuration
 * of a round gets the same schedule.
 */
import { fmt } from '../table.js';

/** One (pattern, load) cell of the bench: every configuration runs it. */
export interface Cell {
  /** e.g. "poisson 60%". */
  name: string;
  pattern: 'poisson' | 'burst';
  /** Mean offered load, % of the measured capacity. */
  loadPct: number;
}

/** The shape of a burst cell (--burst-factor, --burst-duty, --burst-period-ms). */
export interface BurstShape {
  factor: number;
  duty: number;
  periodMs: number;
}

export interface Schedule {
  /** Arrival times, ms from the phase start, ascending. */
  times: Float64Array;
  /** Index into the workload of each arrival. */
  seq: Uint32Array;
}

/** The cells in the order they run: the Poisson loads, then the burst loads. */
export function cellsOf(loads: readonly number[], burstLoads: readonly number[]): Cell[] {
  return [
    ...loads.map((l): Cell => ({ name: `poisson ${l}%`, pattern: 'poisson', loadPct: l })),
    ...burstLoads.map((l): Cell => ({ name: `burst ${l}%`, pattern: 'burst', loadPct: l })),
  ];
}

/** Arrivals per ms at time t (ms from the phase start), and when that rate next changes. */
function rateAt(cell: Cell, burst: BurstShape, meanPerMs: number, t: number): { rate: number; until: number } {
  if (cell.pattern === 'poisson') return { rate: meanPerMs, until: Infinity };
  const period = burst.periodMs;
  const on = burst.duty * period;
  const start = Math.floor(t / period) * period;
  const inPeriod = t - start;
  if (inPeriod < on) return { rate: meanPerMs * burst.factor, until: start + on };
  const offRate = burst.duty >= 1 ? 0 : (meanPerMs * Math.max(0, 1 - burst.factor * burst.duty)) / (1 - burst.duty);
  return { rate: offRate, until: start + period };
}

/** A Poisson process with the cell's piecewise-constant rate over [0, totalMs): exact (inverts the integrated rate). */
export function schedule(cell: Cell, burst: BurstShape, capacityPerS: number, totalMs: number, r: () => number, nSeqs: number): Schedule {
  const meanPerMs = (capacityPerS * cell.loadPct) / 100 / 1000;
  const times: number[] = [];
  let t = 0;
  let need = -Math.log(1 - r()); // Exp(1) of integrated rate until the next arrival
  while (t < totalMs) {
    const { rate, until } = rateAt(cell, burst, meanPerMs, t);
    const end = Math.min(until, totalMs);
    const room = rate * (end - t);
    if (rate > 0 && room >= need) {
      t += need / rate;
      times.push(t);
      need = -Math.log(1 - r());
    } else {
      need -= room;
      t = end;
    }
  }
  const start = Math.floor(r() * nSeqs);
  return { times: Float64Array.from(times), seq: Uint32Array.from(times, (_, i) => (start + i) % nSeqs) };
}

/** The plan line's description of the burst cells. */
export function describeBurst(burst: BurstShape): string {
  const between = burst.factor * burst.duty < 1 - 1e-9 ? ', the rest at the rate that keeps the mean' : ', silence in between';
  return `burst = on/off: ${burst.factor}x the mean rate for ${fmt(100 * burst.duty, 0)}% of every ${burst.periodMs} ms${between}`;
}
