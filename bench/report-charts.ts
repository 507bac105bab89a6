/**
 * The benchmark report's plots (bench/report.ts): Vega-Lite specs built from
 * results.json (bench/suite-results.ts) and rendered headless to SVG by Vega
 * (no canvas; text widths are estimated).
 *
 * Every builder returns null when its data is absent (e.g. a quick run without
 * curves), so the report leaves the plot out and says so.
 */
import * as vega from 'vega';
import * as vl from 'vega-lite';
import type { TopLevelSpec } from 'vega-lite';
import type { CaseName, Comparison, Curve, PhaseResult, SuiteResults } from './suite-results.js';
import { ALL_CASES, OPT_IN_CASES } from './suite/options.js';
import { median } from './suite/phases.js';

export const CHART_WIDTH = 640;
export const CHART_HEIGHT = 360;

/** Shared look: readable font sizes, no label truncation for our long configuration names. */
const CONFIG = {
  font: 'Helvetica, Arial, sans-serif',
  title: { fontSize: 15, anchor: 'start' as const, subtitleFontSize: 12, subtitleColor: '#555' },
  axis: { labelFontSize: 11, titleFontSize: 12, labelLimit: 360 },
  legend: { labelFontSize: 11, titleFontSize: 12, labelLimit: 480, titleLimit: 480, symbolStrokeWidth: 2, orient: 'bottom' as const, direction: 'vertical' as const },
  header: { labelFontSize: 12, titleFontSize: 12 },
};

export interface Chart {
  /** File name inside the report folder. */
  file: string;
  /** Alt text / caption for the Markdown. */
  title: string;
  spec: TopLevelSpec;
}

export async function renderSvg(spec: TopLevelSpec): Promise<string> {
  const compiled = vl.compile(spec).spec;
  const view = new vega.View(vega.parse(compiled), { renderer: 'none', logLevel: 1 /* vega Error */ });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}

// ---------------------------------------------------------------- helpers shared with the Markdown

export const CASE_TITLES: Record<CaseName, string> = {
  batching: 'Batching gain',
  bucketing: 'Bucketing gain',
  efficiency: 'Efficiency against raw onnxruntime',
  curve: 'Latency against throughput',
  scheduling: 'Batch window against the latency target, in-process',
  defaults: 'Engine defaults: batches in flight and intra-op threads',
  peer: 'Against transformers.js',
  instances: 'Model instances',
  models: 'Model sizes',
  floor: 'The request path against the floor',
  cache: 'The result cache',
  grpc: 'gRPC beside HTTP and WebSocket',
  tracing: 'What tracing costs',
  outputs: 'What the outputs beyond the pooled row cost',
  idle: 'A server doing nothing',
  'model-load': 'Loading a model while serving',
  'long-inputs': 'Long inputs chunked beside short requests',
};

export const CASE_ORDER: CaseName[] = [...ALL_CASES, ...OPT_IN_CASES];

/** Significant-ish digits: 1234.5 -> "1235", 56.78 -> "56.8", 3.456 -> "3.46", 0.0123 -> "0.012"; integers as they are. */
export function fmtNum(v: number | null | undefined): string {
  if (v == null || !Number.isFinite(v)) return '–';
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  if (a >= 100) return v.toFixed(0);
  if (a >= 10) return v.toFixed(1);
  if (a >= 1) return v.toFixed(2);
  if (a === 0) return '0';
  return v.toPrecision(2);
}

export function fmtPct(share: number | null | undefined, digits = 1): string {
  if (share == null || !Number.isFinite(share)) return '–';
  return `${(100 * share).toFixed(digits)}%`;
}

export function fmtRatio(r: number | null | undefined): string {
  if (r == null || !Number.isFinite(r)) return '–';
  return `${r.toFixed(2)}x`;
}

export const METRIC_UNITS: Record<Comparison['metric'], string> = {
  rps: 'req/s',
  inputsPerS: 'inputs/s',
  tokensPerS: 'tokens/s',
  p50: 'ms P50',
  p99: 'ms P99',
  paddingEfficiency: 'padding efficiency',
  cpuUsPerRequest: 'us CPU/request',
};

/** A comparison side's value with its unit, as the tables and the plots print it. */
export function fmtMetric(metric: Comparison['metric'], v: number): string {
  if (metric === 'paddingEfficiency') return `${fmtPct(v)} padding efficiency`;
  return `${fmtNum(v)} ${METRIC_UNITS[metric]}`;
}

/** The phases of one configuration over all its rounds share this key (everything but the round and the numbers). */
export function configKey(p: PhaseResult): string {
  return [
    p.case,
    p.model,
    p.workload,
    p.target,
    p.transport,
    p.loop,
    p.concurrency ?? '',
    p.loadFraction ?? p.offeredRps ?? '',
    p.arrivals ?? '',
    (p.serverArgs ?? []).join(' '),
  ].join('|');
}

/** Phases grouped by configuration, in the order their first round ran. */
export function groupConfigs(phases: PhaseResult[]): PhaseResult[][] {
  const groups = new Map<string, PhaseResult[]>();
  for (const p of phases) {
    const k = configKey(p);
    let g = groups.get(k);
    if (!g) groups.set(k, (g = []));
    g.push(p);
  }
  return [...groups.values()];
}

/** An item's values of those `fields` that take more than one value over `items`: the rest can be left out of a label. */
function varyingLabel<T>(items: T[], fields: (keyof T)[]): (x: T) => string[] {
  const vary = fields.filter((f) => new Set(items.map((x) => String(x[f]))).size > 1);
  return (x) => vary.map((f) => String(x[f]));
}

export function safeName(s: string): string {
  return s.replace(/[^A-Za-z0-9._-]+/g, '_');
}

// ---------------------------------------------------------------- 1. latency against throughput

export interface CurveGroup {
  model: string;
  transport: 'http' | 'ws';
  curves: Curve[];
}

export function curveGroups(results: SuiteResults): CurveGroup[] {
  const groups: CurveGroup[] = [];
  for (const c of results.curves ?? []) {
    if (c.points.length === 0) continue;
    let g = groups.find((x) => x.model === c.model && x.transport === c.transport);
    if (!g) groups.push((g = { model: c.model, transport: c.transport, curves: [] }));
    g.curves.push(c);
  }
  return groups;
}

export function latencyThroughputFile(model: string, transport: string): string {
  return `latency-throughput-${safeName(model)}-${safeName(transport)}.svg`;
}

/** The legend name of a curve (and of its burst points, when it has both kinds of arrivals). */
export function curveSeries(c: Curve, all: Curve[], arrivals: 'poisson' | 'bursts'): string {
  const workloads = new Set(all.map((x) => x.workload));
  let name = workloads.size > 1 ? `${c.label} (${c.workload})` : c.label;
  const kinds = new Set(c.points.map((p) => p.arrivals));
  if (kinds.size > 1 && arrivals === 'bursts') name += ' [bursts]';
  return name;
}

function latencyThroughputChart(g: CurveGroup): Chart {
  const rows: { series: string; stat: string; achievedRps: number; latencyMs: number; loadFraction: number }[] = [];
  const rules: { series: string; slo: number; text: string }[] = [];
  for (const c of g.curves) {
    for (const p of c.points) {
      const series = curveSeries(c, g.curves, p.arrivals);
      for (const [stat, v] of [['P50', p.p50], ['P99', p.p99]] as const) {
        if (Number.isFinite(v) && v > 0) rows.push({ series, stat, achievedRps: p.achievedRps, latencyMs: v, loadFraction: p.loadFraction });
      }
    }
    if (c.sloP99Ms != null) {
      rules.push({ series: curveSeries(c, g.curves, 'poisson'), slo: c.sloP99Ms, text: `P99 target ${fmtNum(c.sloP99Ms)} ms (${c.label})` });
    }
  }
  const lat = [...rows.map((r) => r.latencyMs), ...rules.map((r) => r.slo)].filter((v) => v > 0);
  const wide = lat.length > 0 && Math.max(...lat) / Math.min(...lat) > 10;
  const yScale = wide ? { type: 'log' as const } : { type: 'linear' as const, zero: true };
  const transport = g.transport === 'ws' ? 'WebSocket' : 'HTTP';
  const color = {
    field: 'series',
    type: 'nominal' as const,
    title: 'server configuration',
    scale: { domain: [...new Set([...rows.map((r) => r.series), ...rules.map((r) => r.series)])] },
  };
  const x = { field: 'achievedRps', type: 'quantitative' as const, title: 'achieved throughput (requests/s)', scale: { zero: true } };
  const y = { field: 'latencyMs', type: 'quantitative' as const, title: `latency (ms${wide ? ', log scale' : ''})`, scale: yScale };
  const layers: NonNullable<Extract<TopLevelSpec, { layer: unknown }>['layer']> = [
    // lines and points as two layers: with `point` on the line mark, vega-lite draws
    // the dash legend's samples with a transparent stroke
    {
      data: { values: rows },
      mark: { type: 'line', strokeWidth: 2 },
      encoding: {
        x,
        y,
        color,
        strokeDash: {
          field: 'stat',
          type: 'nominal',
          title: 'percentile',
          scale: { domain: ['P50', 'P99'], range: [[1, 0], [6, 4]] },
          legend: { symbolType: 'stroke', symbolStrokeColor: '#444', symbolStrokeWidth: 2, symbolSize: 400 },
        },
        detail: { field: 'stat', type: 'nominal' },
        order: { field: 'loadFraction', type: 'quantitative' },
      },
    },
    {
      data: { values: rows },
      mark: { type: 'point', filled: true, size: 45, opacity: 1 },
      encoding: { x, y, color },
    },
  ];
  if (rules.length > 0) {
    layers.push(
      {
        data: { values: rules },
        mark: { type: 'rule', strokeDash: [2, 3], strokeWidth: 1.5, opacity: 0.8 },
        encoding: { y: { field: 'slo', type: 'quantitative' }, color },
      },
      {
        data: { values: rules },
        mark: { type: 'text', align: 'left', baseline: 'bottom', dy: -2, fontSize: 11 },
        encoding: { y: { field: 'slo', type: 'quantitative' }, x: { value: 4 }, text: { field: 'text' }, color },
      },
    );
  }
  return {
    file: latencyThroughputFile(g.model, g.transport),
    title: `Latency against throughput, ${g.model} over ${transport}`,
    spec: {
      title: {
        text: `Latency against throughput: ${g.model} over ${transport}`,
        subtitle: 'open loop; solid P50, dashed P99' + (rules.length ? "; dotted rule: a curve's P99 target" : ''),
      },
      width: CHART_WIDTH,
      height: CHART_HEIGHT,
      config: CONFIG,
      layer: layers,
    },
  };
}

// ---------------------------------------------------------------- 2. batch-size distribution

function sizeBucketLabels(les: number[]): Map<number, string> {
  const labels = new Map<number, string>();
  let prev = 0;
  for (const le of les) {
    if (!Number.isFinite(le)) labels.set(le, `> ${prev}`);
    else {
      const lo = Math.floor(prev) + 1;
      const hi = Math.floor(le);
      labels.set(le, lo >= hi ? `${hi}` : `${lo}–${hi}`);
    }
    prev = le;
  }
  return labels;
}

export interface BatchSizeSeries {
  label: string;
  /** Summed over the configuration's rounds. */
  sizes: { le: number; count: number }[];
  meanBatch: number;
}

function sumSizes(phases: PhaseResult[]): { le: number; count: number }[] {
  const by = new Map<number, number>();
  for (const p of phases) {
    for (const b of p.server?.batchSizes ?? []) {
      // JSON has no Infinity: a +Inf bucket comes back as null
      const le = b.le == null ? Infinity : Number(b.le);
      by.set(le, (by.get(le) ?? 0) + b.count);
    }
  }
  return [...by.entries()].sort((a, b) => a[0] - b[0]).map(([le, count]) => ({ le, count }));
}

function nearestPoint(c: Curve, fraction: number) {
  let best: Curve['points'][number] | undefined;
  for (const p of c.points) {
    if (p.arrivals !== 'poisson' && c.points.some((q) => q.arrivals === 'poisson')) continue;
    if (Math.abs(p.loadFraction - fraction) > 0.2) continue;
    if (!best || Math.abs(p.loadFraction - fraction) < Math.abs(best.loadFraction - fraction)) best = p;
  }
  return best;
}

/** The batched phases of the batching case, and each curve near 50% and 100% load. */
export function batchSizeSeries(results: SuiteResults): BatchSizeSeries[] {
  const out: BatchSizeSeries[] = [];
  const batching = results.phases.filter((p) => p.case === 'batching' && p.server && p.server.batchSizes.length > 0);
  const groups = groupConfigs(batching);
  const label = varyingLabel(
    groups.map((g) => g[0]),
    ['model', 'workload', 'transport'],
  );
  for (const g of groups) {
    const sizes = sumSizes(g);
    // "batched": some batch held more than one input
    if (!sizes.some((s) => s.le > 1 && s.count > 0)) continue;
    const p = g[0];
    // the batching case's phases are closed loops, each with its callers
    out.push({ label: [`batching: ${p.target}`, ...label(p), `${p.concurrency} callers`].join(' · '), sizes, meanBatch: median(g.map((x) => x.server!.meanBatch)) });
  }
  const byId = new Map(results.phases.map((p) => [p.id, p]));
  const curves = (results.curves ?? []).filter((c) => c.points.length > 0);
  const curveLabel = varyingLabel(curves, ['model', 'workload', 'transport']);
  for (const c of curves) {
    const seen = new Set<string>();
    for (const f of [0.5, 1]) {
      const pt = nearestPoint(c, f);
      if (!pt || seen.has(pt.phaseId)) continue;
      seen.add(pt.phaseId);
      const ph = byId.get(pt.phaseId);
      if (!ph?.server || ph.server.batchSizes.length === 0) continue;
      const parts = [`curve: ${c.label}`, ...curveLabel(c), `${fmtPct(pt.loadFraction, 0)} load`];
      out.push({ label: parts.join(' · '), sizes: sumSizes([ph]), meanBatch: ph.server.meanBatch });
    }
  }
  return out;
}

function batchSizesChart(results: SuiteResults): Chart | null {
  const series = batchSizeSeries(results).filter((s) => s.sizes.some((x) => x.count > 0));
  if (series.length === 0) return null;
  const les = [...new Set(series.flatMap((s) => s.sizes.map((x) => x.le)))].sort((a, b) => a - b);
  // drop empty buckets at the top end (a +Inf bucket nobody reached)
  while (les.length > 1 && series.every((s) => !s.sizes.some((x) => x.le === les[les.length - 1] && x.count > 0))) les.pop();
  const labels = sizeBucketLabels(les);
  const rows: { config: string; bucket: string; share: number; text: string }[] = [];
  for (const s of series) {
    const total = s.sizes.reduce((a, x) => a + x.count, 0);
    const config = `${s.label} (mean batch ${fmtNum(s.meanBatch)})`;
    for (const le of les) {
      const count = s.sizes.find((x) => x.le === le)?.count ?? 0;
      const share = total > 0 ? count / total : 0;
      rows.push({ config, bucket: labels.get(le)!, share, text: share >= 0.005 ? fmtPct(share, 0) : '' });
    }
  }
  const order = les.map((le) => labels.get(le)!);
  const rowHeight = 70;
  return {
    file: 'batch-sizes.svg',
    title: 'Batch-size distribution',
    spec: {
      title: { text: 'Batch sizes: share of batches per size', subtitle: "from the server's slabserve_batch_size histogram over each measured window" },
      data: { values: rows },
      config: { ...CONFIG, view: { stroke: '#ddd' } },
      facet: {
        row: {
          field: 'config',
          type: 'nominal',
          sort: series.map((s) => `${s.label} (mean batch ${fmtNum(s.meanBatch)})`),
          title: null,
          header: { labelAngle: 0, labelOrient: 'top', labelAnchor: 'start', labelLimit: CHART_WIDTH, labelFontWeight: 'bold' },
        },
      },
      spec: {
        width: CHART_WIDTH,
        height: rowHeight,
        layer: [
          {
            mark: { type: 'bar', color: '#4c78a8' },
            encoding: {
              x: { field: 'bucket', type: 'ordinal', sort: order, title: 'batch size (inputs per batch)', axis: { labelAngle: 0 } },
              y: { field: 'share', type: 'quantitative', title: 'share of batches', axis: { format: '%', tickCount: 2 }, scale: { domain: [0, 1] } },
            },
          },
          {
            mark: { type: 'text', baseline: 'bottom', dy: -2, fontSize: 10 },
            encoding: {
              x: { field: 'bucket', type: 'ordinal', sort: order },
              y: { field: 'share', type: 'quantitative' },
              text: { field: 'text' },
            },
          },
        ],
      },
    },
  };
}

// ---------------------------------------------------------------- 3. padding efficiency

export interface PaddingRow {
  case: CaseName;
  model: string;
  workload: string;
  transport: string;
  target: string;
  efficiency: number;
}

/** Median padding efficiency per configuration, bucketing first; curve points left out (the curve tables have mean batch). */
export function paddingRows(results: SuiteResults): PaddingRow[] {
  const phases = results.phases.filter((p) => p.case !== 'curve' && p.server && Number.isFinite(p.server.paddingEfficiency));
  const rows = groupConfigs(phases).map((g) => ({
    case: g[0].case,
    model: g[0].model,
    workload: g[0].workload,
    transport: g[0].transport,
    target: g[0].target,
    efficiency: median(g.map((p) => p.server!.paddingEfficiency)),
  }));
  return rows.sort((a, b) => CASE_ORDER.indexOf(a.case) - CASE_ORDER.indexOf(b.case));
}

function paddingChart(results: SuiteResults): Chart | null {
  const rows = paddingRows(results);
  if (rows.length === 0) return null;
  const label = varyingLabel(rows, ['model', 'transport']);
  const data = rows.map((r) => {
    return { ...r, group: [r.case, r.workload, ...label(r)].join(' · '), text: fmtPct(r.efficiency) };
  });
  const groups = [...new Set(data.map((d) => d.group))];
  const targets = [...new Set(data.map((d) => d.target))];
  // one small chart per group, each with only its own configurations (a facet with
  // independent scales over a layer draws the same but makes vega-lite warn)
  const charts = groups.map((group, i) => ({
    title: { text: group, fontSize: 12, subtitle: '' },
    width: CHART_WIDTH,
    height: { step: 22 },
    data: { values: data.filter((d) => d.group === group) },
    encoding: {
      y: { field: 'target', type: 'nominal' as const, sort: targets, title: null },
      x: {
        field: 'efficiency',
        type: 'quantitative' as const,
        // the axis title once, under the last chart
        title: i === groups.length - 1 ? 'padding efficiency (real / padded tokens)' : null,
        scale: { domain: [0, 1.1] },
        axis: { format: '%', values: [0, 0.25, 0.5, 0.75, 1] },
      },
    },
    layer: [
      { mark: { type: 'bar' as const }, encoding: { color: { field: 'target', type: 'nominal' as const, scale: { domain: targets }, legend: null } } },
      { mark: { type: 'text' as const, align: 'left' as const, dx: 3, fontSize: 10 }, encoding: { text: { field: 'text' } } },
    ],
  }));
  return {
    file: 'padding-efficiency.svg',
    title: 'Padding efficiency by configuration',
    spec: {
      title: { text: 'Padding efficiency: real tokens / padded tokens', subtitle: 'median over rounds; higher is better (100% = no padding)' },
      config: CONFIG,
      vconcat: charts,
      resolve: { scale: { y: 'independent' } },
    },
  };
}

// ---------------------------------------------------------------- 4. the comparisons side by side

function throughputChart(results: SuiteResults): Chart | null {
  const comps = results.comparisons.filter((c) => Number.isFinite(c.a.value) && Number.isFinite(c.b.value) && c.b.value !== 0);
  if (comps.length === 0) return null;
  const questions: { question: string; case: CaseName; comps: Comparison[] }[] = [];
  for (const c of comps) {
    let q = questions.find((x) => x.question === c.question && x.case === c.case);
    if (!q) questions.push((q = { question: c.question, case: c.case, comps: [] }));
    q.comps.push(c);
  }
  questions.sort((a, b) => CASE_ORDER.indexOf(a.case) - CASE_ORDER.indexOf(b.case));
  const charts = questions.map((q) => {
    // a lone comparison says where it was measured; several, only where they differ
    const where = q.comps.length === 1 ? (c: Comparison) => [c.model, c.workload, c.transport] : varyingLabel(q.comps, ['model', 'workload', 'transport']);
    const metric = varyingLabel(q.comps, ['metric']);
    const rows = q.comps.flatMap((c) => {
      const parts = [...where(c), ...metric(c).map((m) => METRIC_UNITS[m as Comparison['metric']])];
      const row = `${parts.join(' · ')}  (A/B ${fmtRatio(c.ratio)})`;
      return [
        { row, side: 'A', rel: c.a.value / c.b.value, text: `${c.a.label}: ${fmtMetric(c.metric, c.a.value)}` },
        { row, side: 'B', rel: 1, text: `${c.b.label}: ${fmtMetric(c.metric, c.b.value)}` },
      ];
    });
    const maxRel = Math.max(1, ...rows.map((r) => r.rel));
    const spec = {
      title: { text: q.question, subtitle: CASE_TITLES[q.case] },
      width: CHART_WIDTH,
      height: { step: 40 },
      data: { values: rows },
      encoding: {
        y: { field: 'row', type: 'nominal' as const, sort: [...new Set(rows.map((r) => r.row))], title: null },
        yOffset: { field: 'side', type: 'nominal' as const, sort: ['A', 'B'] },
        x: {
          field: 'rel',
          type: 'quantitative' as const,
          title: 'relative to B (B = 1)',
          // room on the right for the value labels
          scale: { domain: [0, maxRel * 1.7], nice: false },
          axis: { tickCount: 6 },
        },
      },
      layer: [
        {
          mark: { type: 'bar' as const },
          encoding: {
            color: {
              field: 'side',
              type: 'nominal' as const,
              title: 'side',
              scale: { domain: ['A', 'B'], range: ['#4c78a8', '#bab0ac'] },
              legend: { labelExpr: "datum.label === 'A' ? 'A (measured)' : 'B (baseline, = 1)'" },
            },
          },
        },
        { mark: { type: 'text' as const, align: 'left' as const, dx: 3, fontSize: 10 }, encoding: { text: { field: 'text' } } },
      ],
    };
    return spec;
  });
  return {
    file: 'throughput.svg',
    title: 'Each comparison, A against B',
    spec: {
      config: CONFIG,
      vconcat: charts,
      resolve: { scale: { x: 'independent' } },
    },
  };
}

// ---------------------------------------------------------------- all of them

export interface ChartSet {
  latencyThroughput: Chart[];
  batchSizes: Chart | null;
  padding: Chart | null;
  throughput: Chart | null;
}

export function buildCharts(results: SuiteResults): ChartSet {
  return {
    latencyThroughput: curveGroups(results).map(latencyThroughputChart),
    batchSizes: batchSizesChart(results),
    padding: paddingChart(results),
    throughput: throughputChart(results),
  };
}

export function chartList(set: ChartSet): Chart[] {
  return [...set.latencyThroughput, set.batchSizes, set.padding, set.throughput].filter((c): c is Chart => c != null);
}
