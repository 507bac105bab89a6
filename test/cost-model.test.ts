import { describe, expect, it } from 'vitest';
import { ArrivalRate, CostModel, Utilization } from '../src/gpu-worker/cost-model.js';

describe('CostModel', () => {
  it('fits fixed + perRow x rows from observed batches, and follows a change', () => {
    const m = new CostModel([16, 32], [32, 32]);
    for (let i = 0; i < 40; i++) for (const rows of [1, 8, 32]) m.observe(0, rows, 0.5 + 0.1 * rows);
    expect(m.predict(0, 16)).toBeCloseTo(0.5 + 1.6, 6);
    expect(m.coefficients()[0]).toMatchObject({ fixedMs: expect.closeTo(0.5, 6), perRowMs: expect.closeTo(0.1, 6) });
    // One bucket's fit alone (what the loop publishes after a batch): the observed one, the other untouched.
    expect(m.coefficient(0)).toEqual(m.coefficients()[0]);
    expect(m.coefficient(1)).toEqual({ bucket: 32, fixedMs: 0, perRowMs: 0, samples: 0 });
    // The device slows down: recent batches dominate.
    for (let i = 0; i < 200; i++) for (const rows of [1, 8, 32]) m.observe(0, rows, 1 + 0.2 * rows);
    expect(m.predict(0, 16)).toBeCloseTo(1 + 3.2, 1);
  });

  it('a bucket without data borrows the nearest fitted one, scaled by length', () => {
    const m = new CostModel([16, 32], [32, 32]);
    m.observe(0, 1, 1);
    m.observe(0, 32, 4.1);
    expect(m.predict(1, 10)).toBeGreaterThan(m.predict(0, 10));
    expect(new CostModel([16], [32]).predict(0, 4)).toBe(0);
  });
});

describe('ArrivalRate', () => {
  it('measures the rate, lowers it during a pause, and recovers within a few arrivals after one', () => {
    const r = new ArrivalRate();
    let t = 0;
    for (let i = 0; i < 50; i++) r.arrive((t += 2));
    expect(r.perMs(t)).toBeCloseTo(0.5, 2);
    expect(r.perMs(t + 100)).toBeCloseTo(0.01, 3); // silence: the current gap says so
    t += 5000; // a 5 s pause, then the same traffic again
    for (let i = 0; i < 15; i++) r.arrive((t += 2));
    expect(r.perMs(t)).toBeGreaterThan(0.5 * 0.7);
  });
});

describe('Utilization', () => {
  it('is the recent share of busy time', () => {
    const u = new Utilization();
    let t = 0;
    for (let i = 0; i < 500; i++) {
      u.busy(t, t + 6);
      t += 10; // busy 60% of the time
    }
    expect(u.at(t)).toBeGreaterThan(0.5);
    expect(u.at(t)).toBeLessThan(0.7);
    expect(u.at(t + 5000)).toBeLessThan(0.05); // idle for 5 s
  });
});
