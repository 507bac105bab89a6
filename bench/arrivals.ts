/**
 * Open-loop arrival times, drawn before a phase starts from a seeded
 * generator: Poisson at a mean rate, or bursts (the Poisson rate steps up
 * `factor` times for `duty` of every period and down in between so the mean
 * stays the same; factor x duty = 1 leaves silence in between). Exact: each
 * gap inverts the integrated piecewise-constant rate, so a gap may cross a
 * burst's edge. With no bursts it draws exactly -ln(1 - r()) / rate per gap.
 * The suite's HTTP curves (bench/load.ts) and its in-process scheduling case
 * (bench/suite/scheduling/) both draw from here.
 */

export interface Bursts {
  /** Rate multiplier during a burst. */
  factor: number;
  /** Share of each period spent bursting (factor x duty at most 1). */
  duty: number;
  periodMs: number;
}

/** Arrivals per ms at time t, and when that rate next changes. */
function rateAt(meanPerMs: number, t: number, b?: Bursts): { rate: number; until: number } {
  if (!b) return { rate: meanPerMs, until: Infinity };
  const start = Math.floor(t / b.periodMs) * b.periodMs;
  const on = b.duty * b.periodMs;
  if (t - start < on) return { rate: meanPerMs * b.factor, until: start + on };
  return { rate: b.duty >= 1 ? 0 : (meanPerMs * Math.max(0, 1 - b.factor * b.duty)) / (1 - b.duty), until: start + b.periodMs };
}

/** Scheduled send times (ms from the start, ascending) over [0, totalMs). */
export function arrivalTimes(ratePerS: number, totalMs: number, r: () => number, bursts?: Bursts): number[] {
  if (bursts && (bursts.duty > 1 || bursts.factor * bursts.duty > 1 + 1e-9)) {
    throw new Error(`bursts: factor x duty must be at most 1, or the bursts alone exceed the mean (got ${bursts.factor} x ${bursts.duty})`);
  }
  const meanPerMs = ratePerS / 1000;
  const times: number[] = [];
  let t = 0;
  let need = -Math.log(1 - r()); // Exp(1) of integrated rate until the next arrival
  while (t < totalMs) {
    const { rate, until } = rateAt(meanPerMs, t, bursts);
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
  return times;
}
