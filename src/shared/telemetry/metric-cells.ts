/**
 * Counters and histograms for the request path: a label set is bound once
 * (`cell(labels)`), and each observation is then a bucket search and two
 * additions. prom-client's own `labels(...).observe()` converts, validates
 * and hashes the labels on every call (a visible share of a gateway
 * thread's CPU under load). These register in a prom-client Registry
 * like any metric and export the same JSON (`get()`), so the registry's text
 * format and AggregatorRegistry's merge across threads treat them alike.
 */
import type { Registry } from 'prom-client';

type Labels = Record<string, string>;

interface MetricValue {
  labels: Record<string, string | number>;
  value: number;
  metricName?: string;
}

/** What prom-client's registries read of a metric. */
interface Exported {
  name: string;
  help: string;
  type: 'counter' | 'histogram';
  values: MetricValue[];
  aggregator: 'sum';
}

export class CounterCell {
  value = 0;
  readonly labels: Labels;
  constructor(labels: Labels) {
    this.labels = labels;
  }

  inc(by = 1): void {
    this.value += by;
  }
}

export class HistogramCell {
  readonly labels: Labels;
  /** Observations per bucket (not cumulative); the last is +Inf's own. */
  readonly counts: Float64Array;
  sum = 0;
  count = 0;
  private readonly bounds: readonly number[];

  constructor(labels: Labels, bounds: readonly number[]) {
    this.labels = labels;
    this.bounds = bounds;
    this.counts = new Float64Array(bounds.length + 1);
  }

  observe(v: number): void {
    const b = this.bounds;
    let i = 0;
    while (i < b.length && v > b[i]!) i++;
    this.counts[i]! += 1;
    this.sum += v;
    this.count += 1;
  }
}

/** A label set's cell, made on first use. */
abstract class CellMetric<C extends { labels: Labels }> {
  readonly name: string;
  readonly help: string;
  readonly aggregator = 'sum' as const;
  protected readonly cells = new Map<string, C>();
  private readonly labelNames: readonly string[];

  constructor(opts: { name: string; help: string; labelNames: readonly string[]; registers: Registry[] }) {
    this.name = opts.name;
    this.help = opts.help;
    this.labelNames = opts.labelNames;
    for (const r of opts.registers) r.registerMetric(this as never);
  }

  /** The cell of `labels` (exactly the metric's label names): bind it once, then observe through it. */
  cell(labels: Labels): C {
    const key = this.labelNames.map((n) => labels[n] ?? '').join('\u0000');
    let c = this.cells.get(key);
    if (!c) {
      for (const k of Object.keys(labels)) if (!this.labelNames.includes(k)) throw new Error(`${this.name}: unknown label ${k}`);
      c = this.make({ ...labels });
      this.cells.set(key, c);
    }
    return c;
  }

  protected abstract make(labels: Labels): C;

  reset(): void {
    this.cells.clear();
  }
}

export class CellCounter extends CellMetric<CounterCell> {
  readonly type = 'counter' as const;

  protected make(labels: Labels): CounterCell {
    return new CounterCell(labels);
  }

  /** Adds to the cell of `labels` (for the rare paths: binds it on the way). */
  inc(labels: Labels, by = 1): void {
    this.cell(labels).inc(by);
  }

  async get(): Promise<Exported> {
    const values = [...this.cells.values()].map((c) => ({ labels: c.labels, value: c.value }));
    return { name: this.name, help: this.help, type: this.type, values, aggregator: this.aggregator };
  }
}

export class CellHistogram extends CellMetric<HistogramCell> {
  readonly type = 'histogram' as const;
  private readonly buckets: readonly number[];

  constructor(opts: { name: string; help: string; labelNames: readonly string[]; buckets: readonly number[]; registers: Registry[] }) {
    super(opts);
    this.buckets = [...opts.buckets].sort((a, b) => a - b);
  }

  protected make(labels: Labels): HistogramCell {
    return new HistogramCell(labels, this.buckets);
  }

  /** Observes into the cell of `labels` (for the rare paths: binds it on the way). */
  observe(labels: Labels, v: number): void {
    this.cell(labels).observe(v);
  }

  /** As prom-client exports a histogram: cumulative buckets with `le` (first, as it puts it), then +Inf, _sum and _count per label set. */
  async get(): Promise<Exported> {
    const values: MetricValue[] = [];
    const bucket = `${this.name}_bucket`;
    for (const c of this.cells.values()) {
      let acc = 0;
      this.buckets.forEach((le, i) => {
        acc += c.counts[i]!;
        values.push({ labels: { le, ...c.labels }, value: acc, metricName: bucket });
      });
      values.push({ labels: { le: '+Inf', ...c.labels }, value: c.count, metricName: bucket });
      values.push({ labels: { ...c.labels }, value: c.sum, metricName: `${this.name}_sum` });
      values.push({ labels: { ...c.labels }, value: c.count, metricName: `${this.name}_count` });
    }
    return { name: this.name, help: this.help, type: this.type, values, aggregator: this.aggregator };
  }
}
