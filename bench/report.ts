/**
 * The benchmark report: turns `npm run bench`'s results.json
 * (bench/suite-results.ts) into report.md and SVG plots in the same folder.
 *
 *   node dist/bench/report.js bench/results/<date>-<host>     # re-render from <dir>/results.json
 *
 * The suite and the command line call renderReport() and print summaryTable().
 * Plots: bench/report-charts.ts.
 */
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import {
  CASE_ORDER,
  CASE_TITLES,
  buildCharts,
  chartList,
  curveGroups,
  fmtMetric,
  fmtNum,
  fmtPct,
  fmtRatio,
  groupConfigs,
  latencyThroughputFile,
  renderSvg,
  type Chart,
  type ChartSet,
} from './report-charts.js';
import { RESULTS_VERSION, type CaseName, type Comparison, type Curve, type PhaseResult, type SuiteResults } from './suite-results.js';
import { OPT_IN_CASES } from './suite/options.js';
import { schedulingMarkdown } from './report-scheduling.js';
import { gatewayUs, median } from './suite/phases.js';

// ---------------------------------------------------------------- Markdown helpers

function cell(s: string | number): string {
  return String(s).replace(/\|/g, '\\|').replace(/\r?\n/g, ' ');
}

export function table(header: string[], rows: (string | number)[][], align?: ('l' | 'r')[]): string {
  const sep = header.map((_, i) => ((align?.[i] ?? 'l') === 'r' ? '---:' : '---'));
  return [header, sep, ...rows].map((r, i) => `| ${(i === 1 ? r : r.map(cell)).join(' | ')} |`).join('\n');
}

function code(s: string): string {
  return '`' + s.replace(/`/g, "'") + '`';
}

function transportName(t: PhaseResult['transport']): string {
  return t === 'ws' ? 'WebSocket' : t === 'http' ? 'HTTP' : t === 'grpc' ? 'gRPC' : 'in-process';
}

// ---------------------------------------------------------------- the headline comparisons

/** One comparison as a sentence, for its case's section (the headline table has them all). */
export function comparisonLine(c: Comparison): string {
  const where = [c.model, c.workload, transportName(c.transport)].join(' · ');
  return (
    `- ${c.question} **${fmtRatio(c.ratio)}** (${where}): ${c.a.label} ${fmtMetric(c.metric, c.a.value)} against ${c.b.label} ${fmtMetric(c.metric, c.b.value)}; ` +
    `by round ${c.roundRatios.map(fmtRatio).join(', ')}.${c.note ? ` ${c.note}` : ''}`
  );
}

/**
 * The headline comparisons as a Markdown table, in case order: question, model,
 * workload, transport, A and B (value, unit, what was measured), the ratio A/B
 * (median over rounds) and each round's ratio; notes, if any, as a list below.
 */
export function summaryTable(results: SuiteResults): string {
  const comps = [...results.comparisons].sort((a, b) => CASE_ORDER.indexOf(a.case) - CASE_ORDER.indexOf(b.case));
  if (comps.length === 0) return '_No comparisons in this run._';
  const header = ['question', 'model', 'workload', 'transport', 'A', 'B', 'A/B', 'A/B by round'];
  const rows = comps.map((c) => [
    c.question,
    c.model,
    c.workload,
    c.transport,
    `${fmtMetric(c.metric, c.a.value)} (${c.a.label})`,
    `${fmtMetric(c.metric, c.b.value)} (${c.b.label})`,
    fmtRatio(c.ratio),
    c.roundRatios.map(fmtRatio).join(', '),
  ]);
  const lines = [table(header, rows, ['l', 'l', 'l', 'l', 'r', 'r', 'r', 'r'])];
  const notes = comps.filter((c) => c.note);
  if (notes.length) {
    lines.push('', ...notes.map((c) => `- ${c.question} (${c.model}, ${c.workload}, ${c.transport}): ${c.note}`));
  }
  return lines.join('\n');
}

// ---------------------------------------------------------------- sections

function machineParagraph(r: SuiteResults): string {
  const m = r.machine;
  const started = r.startedAt.replace('T', ' ').replace(/\.\d+Z$/, 'Z');
  return [
    `Run on **${m.host}**: ${m.cpu}, ${m.cores} cores, ${m.memoryGiB.toFixed(1)} GiB memory, ${m.os}; Node ${m.node}, onnxruntime ${m.onnxruntime}, slabserve ${m.slabserve}.`,
    `Load average (1 min) ${m.loadAverageStart.toFixed(2)} at the start, ${m.loadAverageEnd.toFixed(2)} at the end.`,
    `Command ${code(r.command)}, ${r.mode} mode, started ${started}, took ${formatDuration(r.durationS)}.`,
    'Absolute numbers vary between machines, and with the load of other work on a shared machine;',
    'the side-by-side ratios hold, since each ratio comes from phases of both sides run alternately within this one run.',
  ].join(' ');
}

function formatDuration(s: number): string {
  if (!Number.isFinite(s)) return '–';
  const m = Math.floor(s / 60);
  const sec = Math.round(s - 60 * m);
  return m > 0 ? `${m} min ${sec} s` : `${sec} s`;
}

const CASE_INTROS: Partial<Record<CaseName, string>> = {
  batching: 'Dynamic batching on against the same server with `--max-batch-size 1`, same clients, same workload.',
  bucketing:
    'Length buckets against one FIFO queue padded to the longest input in the batch (`--pad-to longest`), on each workload: throughput, and padding efficiency (real tokens / padded tokens).',
  efficiency:
    "The server's throughput against onnxruntime's `session.run` called directly in one thread on batches built before timing (server / best raw batch size).",
  curve: '',
  scheduling:
    'Fixed batch windows against the latency target (`--slo-p99-ms`) on in-process engines (createEngine, engine.runTokens: no tokenization, no HTTP) under open-loop Poisson arrivals and bursts, each load a share of the capacity the first configuration answers in a closed loop.',
  defaults:
    'In-process engines (64 callers of `engine.embed(text)`, batching on) with 1 and 2 batches in flight at 0 (the engine\'s choice), 1 and 2 intra-op threads, beside raw onnxruntime at b = 32 with the same thread counts, in the same alternating rounds; each engine against the default.',
  peer: 'The same model behind a plain `node:http` server on the transformers.js pipeline (bench/peer-transformers.ts), which runs every request on its own, without batching across requests.',
  instances:
    'The same server with its default model instances (on CPU, one per core for a narrow model) against `--model-instances 1`, same clients, same workload: req/s and server CPU per request.',
  models: 'The same comparisons on models of different sizes.',
  floor:
    "slabserve's gateway thread against the floor server (bench/floor-server.ts: one uWebSockets.js thread that reads the body, tokenizes with the same tokenizer and serialises a row the same way; no batching, no model), CPU per answered request by thread, under the same closed-loop load; the median of the rounds.",
};

/** One row per configuration of closed loops (the curve's open-loop points have their own tables): the median round by req/s, every round's req/s, errors and rejections over all rounds. */
function phaseTable(phases: PhaseResult[]): string {
  const groups = groupConfigs(phases);
  const rows = groups.map((g) => {
    const byRps = [...g].sort((a, b) => a.rps - b.rps);
    const p = byRps[(byRps.length - 1) >> 1];
    return [
      p.target,
      p.generator ? `${p.transport} (${p.generator})` : p.transport,
      String(p.concurrency ?? '–'),
      fmtNum(p.rps),
      g.length > 1 ? g.map((x) => fmtNum(x.rps)).join(', ') : '',
      fmtNum(p.inputsPerS),
      fmtNum(p.tokensPerS),
      fmtNum(p.latencyMs.p50),
      fmtNum(p.latencyMs.p99),
      p.server ? fmtNum(p.server.meanBatch) : '–',
      p.server ? fmtPct(p.server.paddingEfficiency) : '–',
      p.cpuMsPerRequest != null ? fmtNum(p.cpuMsPerRequest * 1000) : '–',
      p.clientCpuMsPerRequest != null ? fmtNum(p.clientCpuMsPerRequest * 1000) : '–',
      String(g.reduce((a, x) => a + x.errors, 0)),
      String(g.reduce((a, x) => a + x.rejected, 0)),
    ];
  });
  const header = [
    'target',
    'transport',
    'callers',
    'req/s',
    'req/s by round',
    'inputs/s',
    'tokens/s',
    'P50 ms',
    'P99 ms',
    'mean batch',
    'padding eff.',
    'server CPU µs/req',
    'load gen. CPU µs/req',
    'errors',
    'rejected',
  ];
  const lines = [table(header, rows, ['l', 'l', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r'])];
  const flags = new Map<string, string>();
  for (const g of groups) if (g[0].serverArgs?.length && !flags.has(g[0].target)) flags.set(g[0].target, g[0].serverArgs.join(' '));
  const extras: string[] = [];
  if (flags.size) extras.push(`Server flags: ${[...flags].map(([t, a]) => `${t}: ${code(a)}`).join('; ')}.`);
  for (const g of groups) {
    const bad = g.find((x) => x.errors > 0 && x.firstError);
    if (bad) extras.push(`First error of ${bad.target} (${bad.id}): ${code(bad.firstError!)}.`);
  }
  if (extras.length) lines.push('', extras.join(' '));
  return lines.join('\n');
}

/** The floor case's CPU per request by thread: one row per (transport, input, clients), each side's median round. */
function floorTable(phases: PhaseResult[]): string {
  const head = [
    'transport',
    'input',
    'clients',
    'slabserve req/s',
    'floor req/s',
    'gateway us/req',
    'floor us/req',
    'gateway / floor',
    'inference us/req',
    'onnxruntime us/req',
    'main us/req',
    'other us/req (slabserve / floor)',
    'P50 ms (slabserve / floor)',
  ];
  const f = (v: number | undefined) => (v === undefined || Number.isNaN(v) ? '-' : String(Math.round(v)));
  const keys = [...new Set(phases.map((p) => `${p.transport}|${p.workload}|${p.concurrency}`))];
  const rows = keys.map((key) => {
    const [slab, floor] = ['slabserve', 'floor'].map((target) => {
      const ps = phases.filter((p) => p.target === target && `${p.transport}|${p.workload}|${p.concurrency}` === key);
      const cpu = (thread: string) => median(ps.map((p) => p.threadCpuUsPerRequest?.[thread] ?? NaN));
      return { rps: median(ps.map((p) => p.rps)), p50: median(ps.map((p) => p.latencyMs.p50)), gateway: median(ps.map(gatewayUs)), cpu };
    }) as [Side, Side];
    const p = phases.find((x) => `${x.transport}|${x.workload}|${x.concurrency}` === key)!;
    const form = p.workload.endsWith(' ids') ? 'ids' : 'text';
    return [
      p.transport,
      form,
      String(p.concurrency),
      f(slab.rps),
      f(floor.rps),
      f(slab.gateway),
      f(floor.gateway),
      `${(slab.gateway / floor.gateway).toFixed(2)}x`,
      f(slab.cpu('inference')),
      f(slab.cpu('onnxruntime')),
      f(slab.cpu('main')),
      `${f(slab.cpu('other'))} / ${f(floor.cpu('other'))}`,
      `${slab.p50.toFixed(2)} / ${floor.p50.toFixed(2)}`,
    ];
  });
  return table(head, rows, head.map((_, i) => (i < 3 ? 'l' : 'r')));
}
type Side = { rps: number; p50: number; gateway: number; cpu(thread: string): number };

/** Phase tables, one per model and workload. */
function phaseTables(phases: PhaseResult[]): string {
  const parts: string[] = [];
  const keys = [...new Set(phases.map((p) => `${p.model}\u0000${p.workload}`))];
  for (const k of keys) {
    const [model, workload] = k.split('\u0000');
    parts.push(`**${model} · ${workload}** (each row: the median round by req/s; errors and rejected: all rounds)`, '');
    parts.push(phaseTable(phases.filter((p) => p.model === model && p.workload === workload)), '');
  }
  return parts.join('\n').trimEnd();
}

function image(c: Chart | null | undefined): string {
  return c ? `![${c.title}](${c.file})` : '';
}

function curveSection(r: SuiteResults, charts: ChartSet): string {
  const out: string[] = [];
  out.push(
    'Open-loop arrivals at fractions of the measured capacity; latency from each request\'s scheduled arrival (coordinated omission corrected). ' +
      'Rejected: share of offered requests refused with 429/503.',
    '',
  );
  for (const g of curveGroups(r)) {
    for (const c of g.curves) out.push(curveBlock(c), '');
    const chart = charts.latencyThroughput.find((x) => x.file === latencyThroughputFile(g.model, g.transport));
    if (chart) out.push(image(chart), '');
  }
  return out.join('\n').trimEnd();
}

function curveBlock(c: Curve): string {
  const head = `#### ${c.label} (${c.model} · ${c.workload} · ${transportName(c.transport)})`;
  const info = [`Capacity ${fmtNum(c.capacityRps)} req/s (closed loop, the default configuration, wrk where installed). The points are sent by the Node generator (wrk has no open loop), which spends several times wrk's CPU per request on the same machine: with few cores the knee shows below 100%.`];
  if (c.serverArgs.length) info.push(`Server flags: ${code(c.serverArgs.join(' '))}.`);
  const slo = c.sloP99Ms;
  const points = [...c.points].sort((a, b) => a.loadFraction - b.loadFraction || a.arrivals.localeCompare(b.arrivals));
  if (slo != null) {
    const under = points.filter((p) => Number.isFinite(p.p99) && p.p99 <= slo).length;
    const over = points.filter((p) => p.p99 > slo).map((p) => `${fmtPct(p.loadFraction, 0)}${p.arrivals === 'bursts' ? ' bursts' : ''}`);
    info.push(
      `P99 target ${fmtNum(slo)} ms: P99 stayed under it at ${under} of ${points.length} points` +
        (over.length ? `; **over it at ${over.join(', ')} load**.` : '.'),
    );
  }
  const header = ['load', 'arrivals', 'offered req/s', 'achieved req/s', 'P50 ms', 'P99 ms', 'rejected', 'errors', 'mean batch'];
  if (slo != null) header.push(`P99 ≤ ${fmtNum(slo)} ms`);
  const rows = points.map((p) => {
    const row = [
      fmtPct(p.loadFraction, 0),
      p.arrivals,
      fmtNum(p.offeredRps),
      fmtNum(p.achievedRps),
      fmtNum(p.p50),
      fmtNum(p.p99),
      fmtPct(p.rejectedShare),
      String(p.errors),
      p.meanBatch != null ? fmtNum(p.meanBatch) : '–',
    ];
    if (slo != null) row.push(!Number.isFinite(p.p99) ? '–' : p.p99 <= slo ? 'yes' : `**NO** (+${fmtNum(p.p99 - slo)} ms)`);
    return row;
  });
  return [head, '', info.join(' '), '', table(header, rows, ['r', 'l', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'l'])].join('\n');
}

function workloadsSection(r: SuiteResults): string {
  if (r.workloads.length === 0) return '_No workloads recorded._';
  const rows = r.workloads.map((w) => [
    w.name,
    w.description,
    String(w.requests),
    String(w.inputsPerRequest),
    fmtNum(w.tokens.min),
    fmtNum(w.tokens.p50),
    fmtNum(w.tokens.mean),
    fmtNum(w.tokens.p90),
    fmtNum(w.tokens.p99),
    fmtNum(w.tokens.max),
    Object.entries(w.bucketShares)
      .sort((a, b) => Number(a[0]) - Number(b[0]))
      .map(([b, s]) => `${b}: ${fmtPct(s, 0)}`)
      .join(', '),
  ]);
  return [
    'Tokens per input, `[CLS]`/`[SEP]` included, by the model\'s tokenizer; bucket shares: the share of inputs in each default length bucket.',
    '',
    table(
      ['workload', 'description', 'requests', 'inputs/request', 'tokens min', 'p50', 'mean', 'p90', 'p99', 'max', 'length buckets'],
      rows,
      ['l', 'l', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'r', 'l'],
    ),
  ].join('\n');
}

function settingsSection(r: SuiteResults): string {
  const s = r.settings;
  return [
    `- seed ${s.seed}; warm-up ${s.warmupS} s, then ${s.durationS} s measured per closed-loop phase and ${s.curvePointS} s per curve point`,
    `- ${s.rounds} rounds per comparison, sides alternating`,
    `- curve load fractions: ${s.loadFractions.length ? s.loadFractions.map((f) => fmtPct(f, 0)).join(', ') : '–'} of the measured capacity`,
    `- models: ${s.models.join(', ') || '–'}; device: ${s.device}`,
  ].join('\n');
}

function modelsSection(r: SuiteResults): string {
  const rows = (r.models ?? []).map((m) => `| ${m.name} | ${m.layers} | ${m.hidden} | ${m.heads} | ${m.parametersM.toFixed(1)} M | ${m.maxLength} |`);
  return ['| model | layers | hidden | heads | weights | max tokens |', '| --- | ---: | ---: | ---: | ---: | ---: |', ...rows].join('\n');
}

function gpuSection(r: SuiteResults): string {
  if (!r.gpu) {
    return 'No GPU run is included in this report. bench/gpu/README.md says how to run one (bench/gpu/run.sh) and pass its folder with `--gpu-results`.';
  }
  return [`Card: ${r.gpu.card}. From ${code(r.gpu.folder)} (bench/gpu/run.sh), included as written:`, '', r.gpu.summaryMarkdown.trim()].join('\n');
}

/** The report's Markdown, given the charts that will be written beside it. */
export function reportMarkdown(r: SuiteResults, charts: ChartSet): string {
  const date = r.startedAt.slice(0, 10);
  const out: string[] = [];
  out.push(`# slabserve benchmark: ${date}, ${r.machine.host}`, '', machineParagraph(r), '');
  out.push('## Headline', '', summaryTable(r), '');
  if (charts.throughput) out.push(image(charts.throughput), '');

  const figures = r.notes ?? [];
  const present = new Set<CaseName>([...r.phases.map((p) => p.case), ...r.comparisons.map((c) => c.case), ...figures.map((n) => n.case)]);
  const hasCurves = (r.curves ?? []).some((c) => c.points.length > 0);
  if (hasCurves) present.add('curve');
  if (r.scheduling) present.add('scheduling');
  for (const k of CASE_ORDER) {
    if (!present.has(k)) continue;
    out.push(`## ${CASE_TITLES[k]}`, '');
    if (k === 'curve') {
      out.push(hasCurves ? curveSection(r, charts) : '_No curve points recorded._', '');
      if (hasCurves && charts.batchSizes) {
        out.push(`Batch sizes near 50% and 100% load: in the batch-size plot ${present.has('batching') ? 'under Batching gain' : 'below'}.`, '');
      }
      continue;
    }
    if (CASE_INTROS[k]) out.push(CASE_INTROS[k], '');
    const comps = r.comparisons.filter((c) => c.case === k);
    if (comps.length) out.push(comps.map(comparisonLine).join('\n'), '');
    const lines = figures.filter((n) => n.case === k).map((n) => `- ${n.line}`);
    if (lines.length) out.push(lines.join('\n'), '');
    const phases = r.phases.filter((p) => p.case === k);
    if (phases.length) out.push(phaseTables(phases), '');
    if (k === 'floor' && phases.length) out.push(floorTable(phases), '');
    if (k === 'scheduling' && r.scheduling) out.push(schedulingMarkdown(r.scheduling), '');
    if (k === 'batching' && charts.batchSizes) out.push(image(charts.batchSizes), '');
    if (k === 'bucketing' && charts.padding) out.push(image(charts.padding), '');
  }
  // plots whose case section is absent still get shown
  if (!present.has('batching') && charts.batchSizes) out.push('## Batch sizes', '', image(charts.batchSizes), '');
  if (!present.has('bucketing') && charts.padding) out.push('## Padding efficiency', '', image(charts.padding), '');

  const absent = CASE_ORDER.filter((k) => !present.has(k) && !(OPT_IN_CASES as readonly CaseName[]).includes(k)).map((k) => CASE_TITLES[k].toLowerCase());
  const notes: string[] = [];
  if (absent.length) notes.push(`Not measured in this run${r.mode === 'quick' ? ' (quick mode)' : ''}: ${absent.join('; ')}.`);
  if (!hasCurves) notes.push('No latency-throughput curves, so no latency-throughput plot.');
  if (!charts.batchSizes) notes.push('No batch-size histograms from a batched server, so no batch-size plot.');
  if (!charts.padding) notes.push('No padding efficiency recorded, so no padding-efficiency plot.');
  if (!charts.throughput) notes.push('No comparisons, so no comparison plot.');
  if (notes.length) out.push('## Not in this run', '', notes.map((n) => `- ${n}`).join('\n'), '');

  if (r.models?.length) out.push('## Models', '', modelsSection(r), '');
  out.push('## Workloads', '', workloadsSection(r), '');
  out.push('## GPU', '', gpuSection(r), '');
  out.push('## Settings', '', settingsSection(r), '');
  out.push(`Raw numbers: results.json (format version ${r.version}). Re-render: ${code('node dist/bench/report.js <this folder>')}.`, '');
  return out.join('\n');
}

// ---------------------------------------------------------------- files

const OWN_SVG = /^(latency-throughput-.*|batch-sizes|padding-efficiency|throughput)\.svg$/;

/**
 * Writes report.md and the SVG plots into `dir` (created if missing); plots
 * this renderer wrote there before and no longer draws are removed. Returns the
 * Markdown and the paths of the files written (report.md last).
 */
export async function renderReport(results: SuiteResults, dir: string): Promise<{ markdown: string; files: string[] }> {
  await mkdir(dir, { recursive: true });
  const charts = buildCharts(results);
  const list = chartList(charts);
  const files: string[] = [];
  for (const c of list) {
    const svg = await renderSvg(c.spec);
    const path = join(dir, c.file);
    await writeFile(path, svg);
    files.push(path);
  }
  const keep = new Set(list.map((c) => c.file));
  for (const f of await readdir(dir)) {
    if (OWN_SVG.test(f) && !keep.has(f)) await rm(join(dir, f), { force: true });
  }
  const markdown = reportMarkdown(results, charts);
  const mdPath = join(dir, 'report.md');
  await writeFile(mdPath, markdown);
  files.push(mdPath);
  return { markdown, files };
}

export async function readResults(dir: string): Promise<SuiteResults> {
  const results = JSON.parse(await readFile(join(dir, 'results.json'), 'utf8')) as SuiteResults;
  if (results.version !== RESULTS_VERSION) {
    throw new Error(`${join(dir, 'results.json')}: results version ${String(results.version)}, this renderer reads version ${RESULTS_VERSION}`);
  }
  return results;
}

// ---------------------------------------------------------------- CLI

async function main(argv: string[]): Promise<number> {
  if (argv.length !== 1 || argv[0] === '--help' || argv[0] === '-h') {
    console.error('usage: node dist/bench/report.js <dir>   (re-renders <dir>/report.md and its plots from <dir>/results.json)');
    return argv.length === 1 ? 0 : 2;
  }
  const dir = resolve(argv[0]);
  const results = await readResults(dir);
  const { files } = await renderReport(results, dir);
  console.log(summaryTable(results));
  console.log('');
  for (const f of files) console.log(`wrote ${f}`);
  return 0;
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  main(process.argv.slice(2)).then(
    (code) => {
      process.exitCode = code;
    },
    (err: unknown) => {
      console.error(err instanceof Error ? err.message : err);
      process.exitCode = 1;
    },
  );
}
