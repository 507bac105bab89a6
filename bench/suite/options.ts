/**
 * The suite's command line: one option table (bench/args.ts writes --help from
 * it and checks every value), and the settings the cases read, in the units
 * they use (milliseconds, load fractions, absolute folders).
 */
import { join, resolve } from 'node:path';
import type { GeneratorChoice } from '../load.js';
import type { CaseName, OptInCase } from '../suite-results.js';
import { REPO_ROOT } from './paths.js';
import { cellsOf, CONFIG_FORMS, parseConfigs, type Cell, type Config } from './scheduling/configs.js';
import { fail, parseOptions } from '../args.js';

export const ALL_CASES = ['batching', 'bucketing', 'efficiency', 'curve', 'scheduling', 'defaults', 'peer', 'instances', 'floor', 'models'] as const satisfies readonly CaseName[];
/** Run only when named: each starts servers of its own on the first model. */
export const OPT_IN_CASES = ['cache', 'grpc', 'tracing', 'outputs', 'idle', 'model-load', 'long-inputs'] as const satisfies readonly OptInCase[];

export const USAGE = 'npm run bench [-- options]        (node dist/bench/suite.js [options])';

export const SUITE_OPTIONS = {
  quick: { type: 'boolean', help: 'under 2 minutes: one round, short windows, tiny-embed only, 4 load points, no bursts, 2 curves (the defaults marked quick)' },
  cases: { type: 'strings', choices: [...ALL_CASES, ...OPT_IN_CASES], default: ALL_CASES, help: `the cases to run (${OPT_IN_CASES.join(', ')}: only when named)` },
  models: {
    type: 'strings',
    default: ['tiny-embed', 'minilm-l6'],
    quick: ['tiny-embed'],
    help: 'the models; the first gets every case, the others batching, efficiency and peer',
  },
  rounds: { type: 'int', min: 1, default: 3, quick: 1, help: 'A/B alternations' },
  'duration-s': { type: 'number', min: 0.1, default: 3, quick: 1.5, value: 'S', help: 'measured seconds per closed-loop phase' },
  'warmup-s': { type: 'number', min: 0, default: 0.5, quick: 0.3, value: 'S', help: 'warm-up seconds before each phase' },
  'curve-point-s': { type: 'number', min: 0.1, default: 2.5, quick: 1.5, value: 'S', help: 'measured seconds per curve point' },
  loads: { type: 'numbers', min: 1, default: [10, 25, 50, 75, 90, 100, 120], quick: [25, 75, 100, 120], help: 'curve points as % of capacity' },
  'slo-p99-ms': { type: 'number', min: 1, default: 50, value: 'MS', help: 'the latency target of the --slo-p99-ms curve' },
  'scheduling-configs': {
    type: 'strings',
    default: ['fixed:5:1', 'fixed:0:2', 'fixed:5:2', 'fixed:20:2', 'slo:25', 'slo:50'],
    help: `the scheduling case's engines, ${CONFIG_FORMS}; the first is the reference for the ratio columns and runs the capacity probe`,
  },
  'scheduling-loads': { type: 'numbers', min: 1, default: [30, 60, 90, 120], quick: [60, 120], help: 'the scheduling case\'s Poisson loads, % of capacity' },
  'scheduling-burst-loads': { type: 'numbers', min: 1, default: [30, 60], quick: [60], help: 'the scheduling case\'s burst loads, % of capacity as a mean ("" for none)' },
  'scheduling-capacity': { type: 'number', min: 1, value: 'RPS', help: 'the scheduling case: skip the capacity probe and take this many requests/s as 100%' },
  seed: { type: 'int', min: 0, default: 1, help: 'workload and arrival seed' },
  device: { type: 'string', default: 'cpu', value: 'D', help: "the servers' device, and the raw onnxruntime session's in efficiency" },
  'models-dir': { type: 'string', value: 'DIR', help: "where tiny-embed & co. are (default: the repository's models/)" },
  'bench-models-dir': { type: 'string', value: 'DIR', help: 'where bigger models are generated once (default: ~/.cache/slabserve/bench-models)' },
  'gpu-results': { type: 'string', value: 'DIR', help: 'include a bench/gpu/run.sh output folder in the report' },
  out: { type: 'string', value: 'DIR', help: 'where the results go (default: bench/results/<date>-<host>)' },
  'no-progress': { type: 'boolean', help: 'plain lines instead of progress bars' },
  'load-generator': { type: 'string', choices: ['auto', 'wrk', 'node'], default: 'auto', value: 'G', help: "HTTP closed loops' load generator: wrk (apt-get install wrk), the Node one (about 6x the CPU per request), or wrk where installed" },
} as const;

export interface SuiteOptions {
  quick: boolean;
  cases: ReadonlySet<CaseName>;
  models: string[];
  rounds: number;
  warmupMs: number;
  /** Measured ms per closed-loop phase. */
  durationMs: number;
  /** Measured ms per curve point. */
  curvePointMs: number;
  /** The curve's offered loads, as fractions of the measured capacity. */
  loadFractions: number[];
  sloP99Ms: number;
  /** The scheduling case: its engines, its (pattern, load) cells, the capacity given (null: probed). */
  scheduling: { configs: Config[]; cells: Cell[]; capacity: number | null };
  seed: number;
  device: string;
  modelsDir: string;
  benchModelsDir: string;
  /** As given; read (and checked) when the report is written. */
  gpuResults?: string;
  /** As given; the default needs the start date. */
  out?: string;
  /** Progress bars (a terminal, and not --no-progress). */
  progress: boolean;
  /** HTTP closed loops' load generator (bench/load.ts). */
  loadGenerator: GeneratorChoice;
}

/** The suite's settings from `argv` (default: this process's arguments); --help prints and exits. */
export function parseSuiteOptions(argv = process.argv.slice(2)): SuiteOptions {
  const o = parseOptions(USAGE, SUITE_OPTIONS, argv);
  const cells = cellsOf(o['scheduling-loads'], o['scheduling-burst-loads']);
  if (o.cases.includes('scheduling') && cells.length === 0) fail('nothing to run in scheduling: --scheduling-loads and --scheduling-burst-loads are both empty');
  return {
    quick: o.quick,
    cases: new Set(o.cases),
    models: o.models,
    rounds: o.rounds,
    warmupMs: o['warmup-s'] * 1000,
    durationMs: o['duration-s'] * 1000,
    curvePointMs: o['curve-point-s'] * 1000,
    loadFractions: o.loads.map((pct) => pct / 100),
    sloP99Ms: o['slo-p99-ms'],
    scheduling: { configs: parseConfigs(o['scheduling-configs']), cells, capacity: o['scheduling-capacity'] ?? null },
    seed: o.seed,
    device: o.device,
    modelsDir: resolve(o['models-dir'] ?? join(REPO_ROOT, 'models')),
    benchModelsDir: resolve(o['bench-models-dir'] ?? join(process.env.HOME ?? '/tmp', '.cache', 'slabserve', 'bench-models')),
    ...(o['gpu-results'] !== undefined ? { gpuResults: o['gpu-results'] } : {}),
    ...(o.out !== undefined ? { out: o.out } : {}),
    progress: !o['no-progress'] && process.stderr.isTTY === true,
    loadGenerator: o['load-generator'] as GeneratorChoice,
  };
}
