// The request path's cell metrics (src/shared/telemetry/metric-cells.ts) export exactly
// what prom-client's own Counter and Histogram export for the same
// observations, in its text format and through AggregatorRegistry's merge of
// several threads. Fresh random observations each run, seed printed.
import { AggregatorRegistry, Counter, Histogram, Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { CellCounter, CellHistogram } from '../dist/src/shared/telemetry/metric-cells.js';
import { mulberry32 } from '../dist/models/generator/rng.js';

const seed = Number(process.env.SLABSERVE_TEST_SEED ?? Math.floor(Math.random() * 2 ** 31));
console.log(`metric-cells: seed ${seed}`);
const BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1];
const LABELS = [
  { model: 'tiny-embed', route: '/embed', status: '200' },
  { model: 'tiny-embed', route: '/embed', status: '422' },
  { model: 'unknown', route: 'ws:embed', status: 'error' },
];

/** The same random observations into a prom-client pair and a cell pair, each in its own registry. */
function fill(r: () => number) {
  const ours = new Registry();
  const theirs = new Registry();
  const h = new CellHistogram({ name: 'x_seconds', help: 'h', labelNames: ['model', 'route', 'status'], buckets: BUCKETS, registers: [ours] });
  const c = new CellCounter({ name: 'x_total', help: 'c', labelNames: ['model', 'route', 'status'], registers: [ours] });
  const ph = new Histogram({ name: 'x_seconds', help: 'h', labelNames: ['model', 'route', 'status'], buckets: BUCKETS, registers: [theirs] });
  const pc = new Counter({ name: 'x_total', help: 'c', labelNames: ['model', 'route', 'status'], registers: [theirs] });
  const cells = LABELS.map((l) => ({ h: h.cell(l), c: c.cell(l) }));
  for (let i = 0; i < 2000; i++) {
    const k = Math.floor(r() * LABELS.length);
    const v = r() < 0.05 ? BUCKETS[Math.floor(r() * BUCKETS.length)]! : r() ** 3 * 2; // bounds exactly, and past the last
    const n = 1 + Math.floor(r() * 4);
    if (r() < 0.5) cells[k]!.h.observe(v);
    else h.observe(LABELS[k]!, v);
    cells[k]!.c.inc(n);
    ph.observe(LABELS[k]!, v);
    pc.inc(LABELS[k]!, n);
  }
  return { ours, theirs };
}

/** Text lines, sorted (the order of label sets within a metric is not part of the format's meaning). */
const lines = (text: string) => text.split('\n').filter(Boolean).sort();

describe('cell metrics', () => {
  it("export the same text as prom-client's Counter and Histogram for the same observations", async () => {
    const { ours, theirs } = fill(mulberry32(seed));
    expect(lines(await ours.metrics())).toEqual(lines(await theirs.metrics()));
  });

  it('merge across threads (AggregatorRegistry) as prom-client metrics do', async () => {
    const r = mulberry32(seed ^ 0x5eed);
    const a = fill(r);
    const b = fill(r);
    const mergedOurs = AggregatorRegistry.aggregate([await a.ours.getMetricsAsJSON(), await b.ours.getMetricsAsJSON()]);
    const mergedTheirs = AggregatorRegistry.aggregate([await a.theirs.getMetricsAsJSON(), await b.theirs.getMetricsAsJSON()]);
    expect(lines(await mergedOurs.metrics())).toEqual(lines(await mergedTheirs.metrics()));
  });

  it('refuse a label the metric does not have', () => {
    const c = new CellCounter({ name: 'y_total', help: 'c', labelNames: ['reason'], registers: [] });
    expect(() => c.inc({ reason: 'validation', extra: 'x' })).toThrow(/unknown label extra/);
  });
});
