/**
 * The benchmark report renderer (bench/report.ts): a realistic synthetic
 * results.json (every case, two curves with a P99 target, batch-size
 * histograms, a GPU section) rendered into a temporary folder, then checked
 * for the numbers it must show, the SLO verdicts, and the plots. Also a run
 * without curves or GPU, and the CLI re-rendering from results.json.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { renderReport, summaryTable } from '../dist/bench/report.js';
import type { Comparison, Curve, PhaseResult, ServerSide, SuiteResults } from '../dist/bench/suite-results.js';

const here = dirname(fileURLToPath(import.meta.url));
const reportJs = resolve(here, '..', 'dist', 'bench', 'report.js');

// ---------------------------------------------------------------- synthetic results

const LES = [1, 2, 4, 8, 16, 32, 64, Infinity];

function sizes(counts: number[]): ServerSide['batchSizes'] {
  return LES.map((le, i) => ({ le, count: counts[i] ?? 0 }));
}

function server(meanBatch: number, paddingEfficiency: number, counts: number[]): ServerSide {
  const batches = counts.reduce((a, b) => a + b, 0);
  return { batches, meanBatch, paddingEfficiency, batchSizes: sizes(counts), deviceBusy: 0.9 };
}

let seq = 0;
function phase(p: Partial<PhaseResult> & Pick<PhaseResult, 'case' | 'target' | 'rps'>): PhaseResult {
  const rps = p.rps;
  const inputsPerRequest = p.workload === 'client-batch' ? 16 : 1;
  return {
    id: p.id ?? `${p.case}/${p.target}/${seq++}`,
    model: 'tiny-embed',
    workload: 'short',
    transport: 'http',
    loop: 'closed',
    concurrency: 64,
    round: 1,
    windowS: 2,
    requests: Math.round(rps * 2),
    inputs: Math.round(rps * 2 * inputsPerRequest),
    tokens: Math.round(rps * 2 * inputsPerRequest * 20),
    rejected: 0,
    errors: 0,
    inputsPerS: rps * inputsPerRequest,
    tokensPerS: rps * inputsPerRequest * 20,
    latencyMs: { p50: 64000 / rps / 1.3, p90: 64000 / rps, p99: (64000 / rps) * 1.6, p999: (64000 / rps) * 2, max: (64000 / rps) * 3, mean: 64000 / rps },
    ...p,
  };
}

function comparison(c: Omit<Comparison, 'id' | 'ratio'>): Comparison {
  const sorted = [...c.roundRatios].sort((a, b) => a - b);
  return { id: `${c.case}/${c.model}/${c.workload}/${c.transport}/${c.metric}`, ratio: sorted[sorted.length >> 1], ...c };
}

const FRACTIONS = [0.25, 0.5, 0.75, 1, 1.25];

function curve(label: string, serverArgs: string[], capacity: number, p99s: number[], sloP99Ms?: number): { curve: Curve; phases: PhaseResult[] } {
  const phases: PhaseResult[] = [];
  const points = FRACTIONS.map((f, i) => {
    const offered = capacity * f;
    const achieved = Math.min(offered, capacity * 0.97);
    const rejectedShare = f > 1 ? 0.08 : 0;
    const meanBatch = 2 + 20 * f;
    const id = `curve/tiny-embed/short/http/${label}/${Math.round(f * 100)}`;
    const big = Math.round(1000 * f);
    phases.push(
      phase({
        id,
        case: 'curve',
        target: 'slabserve',
        serverArgs,
        loop: 'open',
        concurrency: undefined,
        offeredRps: offered,
        loadFraction: f,
        arrivals: 'poisson',
        rps: achieved,
        latencyMs: { p50: p99s[i] / 3, p90: p99s[i] / 1.5, p99: p99s[i], p999: p99s[i] * 1.5, max: p99s[i] * 2, mean: p99s[i] / 2.5 },
        server: server(meanBatch, 0.8, [1000 - big, 200, 300, 400, big, big >> 1, 0, 0]),
      }),
    );
    return {
      loadFraction: f,
      arrivals: 'poisson' as const,
      offeredRps: offered,
      achievedRps: achieved,
      p50: p99s[i] / 3,
      p99: p99s[i],
      rejectedShare,
      errors: 0,
      meanBatch,
      phaseId: id,
    };
  });
  return {
    curve: {
      id: `curve/${label}`,
      model: 'tiny-embed',
      workload: 'short',
      transport: 'http',
      label,
      serverArgs,
      capacityRps: capacity,
      sloP99Ms,
      points,
    },
    phases,
  };
}

// The fixed-window curve: P99 above its 50 ms target at 125% load (61.5 ms), under at every other point.
const fixed = curve('fixed window 5 ms', ['--max-batch-delay-ms', '5'], 2000, [6.2, 7.9, 12.4, 31.7, 61.5], 50);
// The SLO-driven curve: target 25 ms, over at 100% (27.25 ms) and 125% (140 ms).
const slo = curve('--slo-p99-ms 25', ['--slo-p99-ms', '25'], 2000, [4.1, 5.3, 9.8, 27.25, 140], 25);

function fullResults(): SuiteResults {
  const phases: PhaseResult[] = [];
  // batching: three rounds, alternating
  const batchedRps = [2410, 2380, 2450];
  const unbatchedRps = [612, 598, 605];
  for (let r = 0; r < 3; r++) {
    phases.push(
      phase({
        id: `batching/tiny-embed/short/http-64/batched/r${r + 1}`,
        case: 'batching',
        target: 'slabserve batched',
        serverArgs: ['--max-batch-size', '32'],
        round: r + 1,
        rps: batchedRps[r],
        server: server(21.4, 0.71, [3, 2, 5, 9, 40, 80, 0, 0]),
        generator: 'wrk',
        cpuMsPerRequest: [0.41, 0.43, 0.4][r]!,
        clientCpuMsPerRequest: [0.031, 0.029, 0.03][r]!,
      }),
      phase({
        id: `batching/tiny-embed/short/http-64/unbatched/r${r + 1}`,
        case: 'batching',
        target: 'slabserve max-batch-size 1',
        serverArgs: ['--max-batch-size', '1'],
        round: r + 1,
        rps: unbatchedRps[r],
        errors: r === 1 ? 2 : 0,
        firstError: r === 1 ? 'ECONNRESET' : undefined,
        server: server(1, 0.62, [1200, 0, 0, 0, 0, 0, 0, 0]),
      }),
    );
  }
  // bucketing on two workloads
  for (const [workload, bucketsEff, longestEff, bRps, lRps] of [
    ['short', 0.74, 0.66, 2440, 2300],
    ['mixed', 0.83, 0.41, 900, 520],
  ] as const) {
    phases.push(
      phase({ case: 'bucketing', workload, target: 'slabserve length buckets', rps: bRps, server: server(20, bucketsEff, [0, 0, 2, 5, 30, 60, 0, 0]) }),
      phase({ case: 'bucketing', workload, target: 'slabserve FIFO pad-to longest', serverArgs: ['--pad-to', 'longest'], rps: lRps, server: server(20, longestEff, [0, 0, 2, 5, 30, 60, 0, 0]) }),
    );
  }
  // efficiency: raw onnxruntime in-process
  phases.push(
    phase({ case: 'efficiency', target: 'raw onnxruntime b=32', transport: 'in-process', concurrency: 1, rps: 3100 }),
    phase({ case: 'efficiency', target: 'raw onnxruntime b=8', transport: 'in-process', concurrency: 1, rps: 2200 }),
    phase({ case: 'efficiency', target: 'slabserve batched', rps: 2420, server: server(21, 0.71, [0, 0, 1, 2, 10, 40, 0, 0]) }),
  );
  phases.push(...fixed.phases, ...slo.phases);
  // peer
  phases.push(
    phase({ case: 'peer', target: 'slabserve batched', rps: 2400, server: server(21, 0.71, [0, 0, 1, 2, 10, 40, 0, 0]) }),
    phase({ case: 'peer', target: 'transformers.js', rps: 310 }),
  );
  // instances
  phases.push(
    phase({ case: 'instances', target: 'slabserve instances auto', rps: 3100, server: server(13, 0.7, [0, 0, 5, 30, 10, 0, 0, 0]) }),
    phase({ case: 'instances', target: 'slabserve model-instances 1', rps: 2500, server: server(13, 0.7, [0, 0, 5, 30, 10, 0, 0, 0]) }),
  );
  // models
  phases.push(
    phase({ case: 'models', model: 'minilm-l6', target: 'slabserve batched', rps: 180, server: server(24, 0.7, [0, 0, 0, 1, 5, 20, 0, 0]) }),
    phase({ case: 'models', model: 'minilm-l6', target: 'slabserve max-batch-size 1', rps: 95, server: server(1, 0.6, [500, 0, 0, 0, 0, 0, 0, 0]) }),
  );
  // the floor: CPU per request by thread, pre-tokenized inputs
  const floorPhase = (target: string, rps: number, p50: number, threadCpuUsPerRequest: Record<string, number>) =>
    phase({ case: 'floor', workload: 'short ids', target, rps, latencyMs: { p50, p90: p50, p99: p50, p999: p50, max: p50, mean: p50 }, threadCpuUsPerRequest });
  phases.push(floorPhase('slabserve', 2100, 30.2, { 'gateway-0': 96, inference: 455, main: 3, other: 9 }), floorPhase('floor', 9000, 6.5, { main: 60, other: 1 }));

  const comparisons: Comparison[] = [
    comparison({
      case: 'batching',
      question: 'What does dynamic batching buy?',
      model: 'tiny-embed',
      workload: 'short',
      transport: 'http',
      metric: 'rps',
      a: { label: 'slabserve batched', value: 2410 },
      b: { label: 'slabserve max-batch-size 1', value: 605 },
      roundRatios: [3.938, 3.98, 4.05],
    }),
    comparison({
      case: 'bucketing',
      question: 'What do length buckets buy over one padded FIFO?',
      model: 'tiny-embed',
      workload: 'mixed',
      transport: 'http',
      metric: 'rps',
      a: { label: 'length buckets', value: 900 },
      b: { label: 'FIFO pad-to longest', value: 520 },
      roundRatios: [1.7308, 1.69, 1.77],
    }),
    comparison({
      case: 'bucketing',
      question: 'How much padding do length buckets save?',
      model: 'tiny-embed',
      workload: 'mixed',
      transport: 'http',
      metric: 'paddingEfficiency',
      a: { label: 'length buckets', value: 0.83 },
      b: { label: 'FIFO pad-to longest', value: 0.41 },
      roundRatios: [2.0244, 2.01, 2.05],
    }),
    comparison({
      case: 'efficiency',
      question: 'How close is the server to raw onnxruntime?',
      model: 'tiny-embed',
      workload: 'short',
      transport: 'http',
      metric: 'inputsPerS',
      a: { label: 'slabserve batched', value: 2420 },
      b: { label: 'raw onnxruntime b=32', value: 3100 },
      roundRatios: [0.7806, 0.77, 0.79],
    }),
    comparison({
      case: 'peer',
      question: 'How does it compare with transformers.js?',
      model: 'tiny-embed',
      workload: 'short',
      transport: 'http',
      metric: 'rps',
      a: { label: 'slabserve batched', value: 2400 },
      b: { label: 'transformers.js', value: 310 },
      roundRatios: [7.7419, 7.6, 7.9],
      note: 'transformers.js truncates long inputs; none in this workload.',
    }),
    comparison({
      case: 'instances',
      question: 'What do model instances buy?',
      model: 'tiny-embed',
      workload: 'short',
      transport: 'http',
      metric: 'rps',
      a: { label: 'instances auto', value: 3100 },
      b: { label: 'model-instances 1', value: 2500 },
      roundRatios: [1.24, 1.2, 1.3],
    }),
    comparison({
      case: 'models',
      question: 'Does batching pay on a bigger model?',
      model: 'minilm-l6',
      workload: 'short',
      transport: 'http',
      metric: 'rps',
      a: { label: 'slabserve batched', value: 180 },
      b: { label: 'slabserve max-batch-size 1', value: 95 },
      roundRatios: [1.8947, 1.85, 1.93],
    }),
  ];

  return {
    version: 1,
    startedAt: '2026-03-14T09:26:53.589Z',
    finishedAt: '2026-03-14T09:41:10.000Z',
    durationS: 857,
    command: 'npm run bench',
    mode: 'full',
    machine: {
      host: 'bench-box',
      cpu: 'AMD EPYC 7B13',
      cores: 2,
      memoryGiB: 7.8,
      os: 'Linux 6.8.0 x64',
      node: 'v20.19.2',
      onnxruntime: '1.29.0',
      slabserve: '0.1.0',
      loadAverageStart: 0.42,
      loadAverageEnd: 1.87,
    },
    settings: {
      seed: 42,
      warmupS: 0.5,
      durationS: 2,
      curvePointS: 3,
      rounds: 3,
      loadFractions: FRACTIONS,
      models: ['tiny-embed', 'minilm-l6'],
      device: 'cpu',
    },
    models: [
      { name: 'tiny-embed', layers: 2, hidden: 128, heads: 2, parametersM: 4.4, maxLength: 512 },
      { name: 'minilm-l6', layers: 6, hidden: 384, heads: 12, parametersM: 22.7, maxLength: 512 },
    ],
    workloads: [
      {
        name: 'short',
        description: 'short English-looking texts',
        requests: 4096,
        inputsPerRequest: 1,
        tokens: { min: 8, p50: 20, mean: 20.1, p90: 29, p99: 32, max: 32 },
        bucketShares: { '8': 0.01, '16': 0.33, '32': 0.66 },
      },
      {
        name: 'mixed',
        description: 'short texts with a long tail up to 512 tokens',
        requests: 2048,
        inputsPerRequest: 1,
        tokens: { min: 8, p50: 24, mean: 61.7, p90: 180, p99: 455, max: 512 },
        bucketShares: { '16': 0.3, '32': 0.35, '64': 0.1, '128': 0.1, '256': 0.1, '512': 0.05 },
      },
    ],
    phases,
    comparisons,
    curves: [fixed.curve, slo.curve],
    gpu: {
      card: 'NVIDIA H200, 143771 MiB, driver 570.124.06',
      summaryMarkdown: '| model | batch | inputs/s |\n|---|---:|---:|\n| minilm-l6 | 64 | 41230 |\n',
      folder: 'bench/gpu/results/2026-03-13-h200',
    },
  };
}

/** Quick mode: no curves, no GPU, only the batching case. */
function quickResults(): SuiteResults {
  const full = fullResults();
  return {
    ...full,
    mode: 'quick',
    command: 'npm run bench -- --quick',
    phases: full.phases.filter((p) => p.case === 'batching'),
    comparisons: full.comparisons.filter((c) => c.case === 'batching'),
    curves: [],
    gpu: undefined,
  };
}

// ---------------------------------------------------------------- checks

function svgText(svg: string): string {
  // the words of every <text> element, entities decoded: what a reader sees
  return [...svg.matchAll(/<text[^>]*>([^<]*)<\/text>/g)]
    .map((m) => m[1].replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&quot;/g, '"').replace(/&#39;/g, "'").replace(/&amp;/g, '&'))
    .join('\n');
}

function expectSvg(path: string): string {
  expect(existsSync(path), path).toBe(true);
  const svg = readFileSync(path, 'utf8');
  expect(svg.startsWith('<svg')).toBe(true);
  expect(svg.trimEnd().endsWith('</svg>')).toBe(true);
  // balanced groups: well-formed enough for a browser
  expect((svg.match(/<g[\s>]/g) ?? []).length).toBe((svg.match(/<\/g>/g) ?? []).length);
  return svgText(svg);
}

/** Table rows of the Markdown whose first cell is `first`. */
function rowsStartingWith(md: string, first: string): string[][] {
  return md
    .split('\n')
    .filter((l) => l.startsWith('| '))
    .map((l) => l.slice(2, -2).split(' | '))
    .filter((cells) => cells[0] === first);
}

describe('bench report', () => {
  let dir: string;
  let md: string;
  let files: string[];

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'slabserve-report-'));
    ({ markdown: md, files } = await renderReport(fullResults(), dir));
  }, 60_000);

  afterAll(() => {
    // BENCH_REPORT_KEEP=1: leave the rendered report for a look
    if (process.env.BENCH_REPORT_KEEP) console.log(`report kept in ${dir}`);
    else if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('writes report.md and every plot, and returns their paths', () => {
    const written = readdirSync(dir).sort();
    expect(written).toEqual(
      ['batch-sizes.svg', 'latency-throughput-tiny-embed-http.svg', 'padding-efficiency.svg', 'report.md', 'throughput.svg'].sort(),
    );
    expect(files.map((f) => f.slice(dir.length + 1)).sort()).toEqual(written);
    expect(readFileSync(join(dir, 'report.md'), 'utf8')).toBe(md);
    for (const f of written.filter((x) => x.endsWith('.svg'))) expect(md).toContain(`](${f})`);
  });

  it('opens with the date, host, machine and the note on ratios', () => {
    expect(md.split('\n')[0]).toBe('# slabserve benchmark: 2026-03-14, bench-box');
    expect(md).toContain('AMD EPYC 7B13, 2 cores, 7.8 GiB memory');
    expect(md).toContain('onnxruntime 1.29.0');
    expect(md).toContain('0.42 at the start, 1.87 at the end');
    expect(md).toContain('`npm run bench`, full mode');
    expect(md).toContain('took 14 min 17 s');
    expect(md).toMatch(/ratios hold/);
  });

  it('headline table: A, B, the median ratio and every round', () => {
    const table = summaryTable(fullResults());
    expect(md).toContain(table);
    const [batching] = rowsStartingWith(table, 'What does dynamic batching buy?');
    expect(batching).toEqual([
      'What does dynamic batching buy?',
      'tiny-embed',
      'short',
      'http',
      '2410 req/s (slabserve batched)',
      '605 req/s (slabserve max-batch-size 1)',
      '3.98x',
      '3.94x, 3.98x, 4.05x',
    ]);
    const [padding] = rowsStartingWith(table, 'How much padding do length buckets save?');
    expect(padding.slice(4, 7)).toEqual(['83.0% padding efficiency (length buckets)', '41.0% padding efficiency (FIFO pad-to longest)', '2.02x']);
    const [efficiency] = rowsStartingWith(table, 'How close is the server to raw onnxruntime?');
    expect(efficiency[6]).toBe('0.78x');
    expect(table).toContain('transformers.js truncates long inputs');
    // headline rows in case order: batching first, models last
    const questions = table.split('\n').filter((l) => l.startsWith('| ') && !l.startsWith('| question') && !l.startsWith('| ---'));
    expect(questions[0]).toContain('dynamic batching');
    expect(questions[questions.length - 1]).toContain('bigger model');

  });

  it('a section per case, with phase rows (median round, every round)', () => {
    for (const h of ['## Batching gain', '## Bucketing gain', '## Efficiency against raw onnxruntime', '## Latency against throughput', '## Against transformers.js', '## Model sizes']) {
      expect(md).toContain(h);
    }
    expect(md.indexOf('## Batching gain')).toBeLessThan(md.indexOf('## Bucketing gain'));
    const batched = rowsStartingWith(md, 'slabserve batched').find((r) => r[4] === '2410, 2380, 2450');
    expect(batched).toBeDefined();
    expect(batched!.slice(0, 4)).toEqual(['slabserve batched', 'http (wrk)', '64', '2410']);
    expect(batched![9]).toBe('21.4'); // mean batch
    expect(batched![10]).toBe('71.0%'); // padding efficiency
    expect(batched!.slice(11, 13)).toEqual(['410', '31']); // the median round's (round 1, 2410 req/s) server and load generator CPU, µs per request
    const unbatched = rowsStartingWith(md, 'slabserve max-batch-size 1').find((r) => r[4] === '612, 598, 605');
    expect(unbatched![3]).toBe('605');
    expect(unbatched!.slice(1, 2).concat(unbatched!.slice(11, 14))).toEqual(['http', '–', '–', '2']); // no generator or CPU recorded; errors over all rounds
    expect(md).toContain('`ECONNRESET`');
    expect(md).toContain('`--pad-to longest`');
    const fifo = rowsStartingWith(md, 'slabserve FIFO pad-to longest').map((r) => r[10]);
    expect(fifo).toEqual(['66.0%', '41.0%']);
    expect(rowsStartingWith(md, 'raw onnxruntime b=32')[0].slice(1, 4)).toEqual(['in-process', '1', '3100']);
    expect(rowsStartingWith(md, 'transformers.js')[0][3]).toBe('310');
    expect(md).toContain('**minilm-l6 · short**');
  });

  it('a table per curve with every point, and the P99 verdict against the target', () => {
    const section = md.slice(md.indexOf('## Latency against throughput'), md.indexOf('## Against transformers.js'));
    expect(section).toContain('#### fixed window 5 ms (tiny-embed · short · HTTP)');
    expect(section).toContain('#### --slo-p99-ms 25 (tiny-embed · short · HTTP)');
    const fixedPart = section.slice(section.indexOf('#### fixed window'), section.indexOf('#### --slo-p99-ms'));
    const sloPart = section.slice(section.indexOf('#### --slo-p99-ms'));
    expect(fixedPart).toContain('P99 stayed under it at 4 of 5 points; **over it at 125% load**');
    expect(sloPart).toContain('P99 stayed under it at 3 of 5 points; **over it at 100%, 125% load**');
    const rows = (part: string) => rowsStartingWith(part, '25%').concat(['50%', '75%', '100%', '125%'].flatMap((l) => rowsStartingWith(part, l)));
    const fixedRows = rows(fixedPart);
    expect(fixedRows.map((r) => r[0])).toEqual(['25%', '50%', '75%', '100%', '125%']);
    // load, arrivals, offered, achieved, P50, P99, rejected, errors, mean batch, verdict
    expect(fixedRows[4]).toEqual(['125%', 'poisson', '2500', '1940', '20.5', '61.5', '8.0%', '0', '27', '**NO** (+11.5 ms)']);
    expect(fixedRows[3][9]).toBe('yes');
    const sloRows = rows(sloPart);
    expect(sloRows.map((r) => r[9])).toEqual(['yes', 'yes', 'yes', '**NO** (+2.25 ms)', '**NO** (+115 ms)']);
    expect(sloRows[0].slice(2, 6)).toEqual(['500', '500', '1.37', '4.10']);
  });

  it('models table: layers, width and weights of each model', () => {
    expect(rowsStartingWith(md, 'minilm-l6').find((r) => r[1] === '6')).toEqual(['minilm-l6', '6', '384', '12', '22.7 M', '512']);
  });

  it('the floor: CPU per request by thread, slabserve beside the floor server', () => {
    expect(md).toContain('## The request path against the floor');
    const [row] = rowsStartingWith(md, 'http').filter((r) => r[1] === 'ids' && r[2] === '64');
    expect(row).toEqual(['http', 'ids', '64', '2100', '9000', '96', '60', '1.60x', '455', '-', '3', '9 / 1', '30.20 / 6.50']);
  });

  it('workloads table, GPU section, settings', () => {
    const [short] = rowsStartingWith(md, 'short');
    expect(short).toEqual(['short', 'short English-looking texts', '4096', '1', '8', '20', '20.1', '29', '32', '32', '8: 1%, 16: 33%, 32: 66%']);
    const [mixed] = rowsStartingWith(md, 'mixed');
    expect(mixed[10]).toBe('16: 30%, 32: 35%, 64: 10%, 128: 10%, 256: 10%, 512: 5%');
    expect(md).toContain('Card: NVIDIA H200, 143771 MiB, driver 570.124.06');
    expect(md).toContain('| minilm-l6 | 64 | 41230 |');
    expect(md).not.toContain('No GPU run is included');
    expect(md).toContain('seed 42');
    expect(md).toContain('curve load fractions: 25%, 50%, 75%, 100%, 125%');
    // the fixture predates the scheduling and defaults cases: those are the only ones it lacks
    expect(md).toContain('Not measured in this run: batch window against the latency target, in-process; engine defaults: batches in flight and intra-op threads.');
  });

  it('latency-throughput plot: axes, both curves, P50/P99, the targets', () => {
    const text = expectSvg(join(dir, 'latency-throughput-tiny-embed-http.svg'));
    expect(text).toContain('achieved throughput (requests/s)');
    expect(text).toContain('latency (ms, log scale)');
    expect(text).toContain('fixed window 5 ms');
    expect(text).toContain('--slo-p99-ms 25');
    expect(text).toContain('P50');
    expect(text).toContain('P99');
    expect(text).toContain('P99 target 50 ms (fixed window 5 ms)');
    expect(text).toContain('P99 target 25 ms (--slo-p99-ms 25)');
    const svg = readFileSync(join(dir, 'latency-throughput-tiny-embed-http.svg'), 'utf8');
    expect(svg).toContain('stroke-dasharray'); // P99 dashed
  });

  it('batch-size plot: batched phases and each curve near 50% and 100% load', () => {
    const text = expectSvg(join(dir, 'batch-sizes.svg'));
    expect(text).toContain('batch size (inputs per batch)');
    expect(text).toContain('share of batches');
    expect(text).toContain('batching: slabserve batched · 64 callers (mean batch 21.4)');
    expect(text).not.toContain('max-batch-size 1'); // all batches of one: not a batched phase
    for (const label of ['fixed window 5 ms', '--slo-p99-ms 25']) {
      expect(text).toContain(`curve: ${label} · 50% load`);
      expect(text).toContain(`curve: ${label} · 100% load`);
      expect(text).not.toContain(`curve: ${label} · 25% load`);
    }
    // the batched phase: 3 rounds of [3, 2, 5, 9, 40, 80] -> 80/139 = 58% of batches of 17-32
    expect(text).toContain('17–32');
    expect(text).toContain('58%');
  });

  it('padding-efficiency plot: buckets against FIFO on each workload, with values', () => {
    const text = expectSvg(join(dir, 'padding-efficiency.svg'));
    expect(text).toContain('padding efficiency (real / padded tokens)');
    expect(text).toContain('slabserve length buckets');
    expect(text).toContain('slabserve FIFO pad-to longest');
    expect(text).toContain('bucketing · short');
    expect(text).toContain('bucketing · mixed');
    for (const v of ['74.0%', '66.0%', '83.0%', '41.0%']) expect(text).toContain(v);
  });

  it('comparison plot: each question, A and B with values, the ratio', () => {
    const text = expectSvg(join(dir, 'throughput.svg'));
    expect(text).toContain('relative to B (B = 1)');
    for (const c of fullResults().comparisons) expect(text).toContain(c.question);
    expect(text).toContain('slabserve batched: 2410 req/s');
    expect(text).toContain('slabserve max-batch-size 1: 605 req/s');
    expect(text).toContain('(A/B 3.98x)');
    expect(text).toContain('(A/B 0.78x)');
    expect(text).toContain('transformers.js: 310 req/s');
  });
});

describe('bench report without curves or GPU', () => {
  let dir: string;
  afterAll(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('leaves those plots out and says so', async () => {
    dir = mkdtempSync(join(tmpdir(), 'slabserve-report-quick-'));
    // a stale plot from an earlier render of a full run is removed
    writeFileSync(join(dir, 'latency-throughput-tiny-embed-http.svg'), '<svg></svg>');
    writeFileSync(join(dir, 'notes.svg'), '<svg></svg>');
    const { markdown } = await renderReport(quickResults(), dir);
    expect(readdirSync(dir).sort()).toEqual(['batch-sizes.svg', 'notes.svg', 'padding-efficiency.svg', 'report.md', 'throughput.svg']);
    expect(markdown).not.toContain('latency-throughput-');
    expect(markdown).not.toContain('## Latency against throughput');
    expect(markdown).toContain('## Not in this run');
    expect(markdown).toContain('Not measured in this run (quick mode): bucketing gain; efficiency against raw onnxruntime; latency against throughput;');
    expect(markdown).toContain('No latency-throughput curves, so no latency-throughput plot.');
    expect(markdown).toContain('No GPU run is included in this report');
    expect(markdown).toContain('bench/gpu/README.md');
    expect(markdown).toContain('`npm run bench -- --quick`, quick mode');
    const text = svgText(readFileSync(join(dir, 'batch-sizes.svg'), 'utf8'));
    expect(text).not.toContain('curve:');
  }, 60_000);

  it('with no server metrics and no comparisons, writes report.md alone', async () => {
    const d = mkdtempSync(join(tmpdir(), 'slabserve-report-bare-'));
    try {
      const bare: SuiteResults = {
        ...quickResults(),
        phases: quickResults().phases.map((p) => ({ ...p, server: undefined })),
        comparisons: [],
      };
      const { markdown, files } = await renderReport(bare, d);
      expect(files).toEqual([join(d, 'report.md')]);
      expect(markdown).toContain('_No comparisons in this run._');
      expect(markdown).toContain('no batch-size plot');
      expect(markdown).toContain('no padding-efficiency plot');
      expect(markdown).not.toContain('.svg)');
    } finally {
      rmSync(d, { recursive: true, force: true });
    }
  }, 60_000);
});

describe('bench report CLI', () => {
  it('re-renders report.md and the plots from <dir>/results.json', () => {
    const dir = mkdtempSync(join(tmpdir(), 'slabserve-report-cli-'));
    try {
      writeFileSync(join(dir, 'results.json'), JSON.stringify(fullResults(), null, 2));
      const res = spawnSync(process.execPath, [reportJs, dir], { encoding: 'utf8', timeout: 60_000 });
      expect(res.stderr).toBe('');
      expect(res.status).toBe(0);
      expect(res.stdout).toContain('What does dynamic batching buy?');
      expect(res.stdout).toContain(`wrote ${join(dir, 'report.md')}`);
      const md = readFileSync(join(dir, 'report.md'), 'utf8');
      expect(md.split('\n')[0]).toBe('# slabserve benchmark: 2026-03-14, bench-box');
      expect(md).toContain('| 3.98x | 3.94x, 3.98x, 4.05x |');
      // through JSON the +Inf bucket bound became null; the plots still render
      const text = expectSvg(join(dir, 'batch-sizes.svg'));
      expect(text).toContain('curve: fixed window 5 ms · 100% load');
      expectSvg(join(dir, 'latency-throughput-tiny-embed-http.svg'));
      expectSvg(join(dir, 'throughput.svg'));
      expectSvg(join(dir, 'padding-efficiency.svg'));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);

  it('importing the module does not run the CLI; a wrong folder fails with a message', () => {
    const dir = mkdtempSync(join(tmpdir(), 'slabserve-report-cli-'));
    try {
      // a script that imports the module, run with an argument the CLI would choke on
      const script = join(dir, 'import.mjs');
      writeFileSync(script, `await import(${JSON.stringify(pathToFileURL(reportJs).href)}); console.log('imported');\n`);
      const imported = spawnSync(process.execPath, [script, join(dir, 'missing')], { encoding: 'utf8', timeout: 60_000 });
      expect(imported.stderr).toBe('');
      expect(imported.stdout).toBe('imported\n');
      expect(imported.status).toBe(0);

      const res = spawnSync(process.execPath, [reportJs, join(dir, 'missing')], { encoding: 'utf8', timeout: 60_000 });
      expect(res.status).toBe(1);
      expect(res.stderr).toContain('results.json');
      const usage = spawnSync(process.execPath, [reportJs], { encoding: 'utf8', timeout: 60_000 });
      expect(usage.status).toBe(2);
      expect(usage.stderr).toContain('usage: node dist/bench/report.js <dir>');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
