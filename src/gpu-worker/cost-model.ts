/**
 * What the scheduler and admission control know about the device, learnt
 * online from the batches just run:
 *
 *  - CostModel: per model and bucket, the batch run time as a line in the
 *    batch size, t = fixed + perRow x rows (ms), fitted by exponentially
 *    weighted least squares so it follows the device as it warms, throttles or
 *    is shared. Seeded at warm-up with a run at one row and one at capacity.
 *  - ArrivalRate: per model and bucket, requests per ms, an exponentially
 *    weighted mean of the gaps between arrivals that decays while none come.
 */

/** Forgetting factor per observation: the last ~50 batches of a bucket dominate its fit. */
const DECAY = 0.98;

interface Fit {
  s0: number;
  sx: number;
  sy: number;
  sxx: number;
  sxy: number;
  fixedMs: number;
  perRowMs: number;
}

export interface CostCoefficients {
  bucket: number;
  fixedMs: number;
  perRowMs: number;
  /** Weight of the evidence (decayed count of batches). */
  samples: number;
}

export class CostModel {
  private readonly fits: Fit[];
  readonly buckets: readonly number[];
  readonly capacities: readonly number[];

  constructor(buckets: readonly number[], capacities: readonly number[]) {
    this.buckets = buckets;
    this.capacities = capacities;
    this.fits = buckets.map(() => ({ s0: 0, sx: 0, sy: 0, sxx: 0, sxy: 0, fixedMs: 0, perRowMs: 0 }));
  }

  observe(bucket: number, rows: number, ms: number): void {
    const f = this.fits[bucket]!;
    f.s0 = f.s0 * DECAY + 1;
    f.sx = f.sx * DECAY + rows;
    f.sy = f.sy * DECAY + ms;
    f.sxx = f.sxx * DECAY + rows * rows;
    f.sxy = f.sxy * DECAY + rows * ms;
    const det = f.s0 * f.sxx - f.sx * f.sx;
    let perRow = det > 1e-9 * f.s0 * f.sxx ? (f.s0 * f.sxy - f.sx * f.sy) / det : f.sy / Math.max(f.sx, 1e-9);
    perRow = Math.max(0, perRow);
    const fixed = Math.max(0, (f.sy - perRow * f.sx) / f.s0);
    f.perRowMs = perRow;
    f.fixedMs = fixed;
  }

  /** Predicted ms for a batch of `rows` in `bucket`; buckets without data borrow from the nearest fitted one, scaled by length. */
  predict(bucket: number, rows: number): number {
    const f = this.fits[bucket]!;
    if (f.s0 > 0) return f.fixedMs + f.perRowMs * rows;
    let nearest = -1;
    for (let b = 0; b < this.fits.length; b++) {
      if (this.fits[b]!.s0 > 0 && (nearest < 0 || Math.abs(b - bucket) < Math.abs(nearest - bucket))) nearest = b;
    }
    if (nearest < 0) return 0;
    const g = this.fits[nearest]!;
    return g.fixedMs + g.perRowMs * rows * (this.buckets[bucket]! / this.buckets[nearest]!);
  }

  /** The fit of one bucket (observe() changes only the bucket it is given). */
  coefficient(bucket: number): CostCoefficients {
    const f = this.fits[bucket]!;
    return { bucket: this.buckets[bucket]!, fixedMs: f.fixedMs, perRowMs: f.perRowMs, samples: f.s0 };
  }

  coefficients(): CostCoefficients[] {
    return this.fits.map((_, b) => this.coefficient(b));
  }
}

/** Mean gap weight of the newest arrival. */
const RATE_ALPHA = 0.1;

export class ArrivalRate {
  private last = -Infinity;
  private meanGapMs = Infinity;

  arrive(atMs: number): void {
    if (this.last !== -Infinity) {
      let gap = Math.max(atMs - this.last, 0.001);
      // A pause is not a rate: perMs() already lowers the rate while one lasts. Capping its weight
      // lets the mean recover within a few arrivals once traffic resumes, not seventy.
      if (this.meanGapMs !== Infinity) gap = Math.min(gap, 4 * this.meanGapMs);
      this.meanGapMs = this.meanGapMs === Infinity ? gap : this.meanGapMs * (1 - RATE_ALPHA) + gap * RATE_ALPHA;
    }
    this.last = Math.max(this.last, atMs);
  }

  /** Arrivals per ms now: the mean rate, lowered while the current gap is already longer than the mean. */
  perMs(nowMs: number): number {
    if (this.meanGapMs === Infinity) return 0;
    return 1 / Math.max(this.meanGapMs, nowMs - this.last);
  }
}

/** Time constant of the utilization average, ms. */
const UTILIZATION_WINDOW_MS = 1000;

/** Share of recent time the device was busy: an exponentially weighted average over about a second. */
export class Utilization {
  private value = 0;
  private last = -Infinity;

  /** Records a busy period [start, end) (batches are reported as they finish, in order). */
  busy(startMs: number, endMs: number): void {
    this.decayTo(startMs);
    const span = Math.max(0, endMs - Math.max(startMs, this.last));
    const w = 1 - Math.exp(-span / UTILIZATION_WINDOW_MS);
    this.value = this.value * (1 - w) + w;
    this.last = Math.max(this.last, endMs);
  }

  at(nowMs: number): number {
    if (this.last === -Infinity) return 0;
    const idle = Math.max(0, nowMs - this.last);
    return this.value * Math.exp(-idle / UTILIZATION_WINDOW_MS);
  }

  private decayTo(t: number): void {
    if (this.last === -Infinity) {
      this.last = t;
      return;
    }
    const idle = Math.max(0, t - this.last);
    this.value *= Math.exp(-idle / UTILIZATION_WINDOW_MS);
    this.last = Math.max(this.last, t);
  }
}
