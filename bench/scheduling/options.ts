/**
 * The scheduling bench's command line: one option table (bench/args.ts
 * writes --help from it), and the settings the bench runs with, in the units
 * it uses (ms), with the checks that span several options.
 */
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { fail, parseOptions, type OptionSpec } from '../args.js';
import { cellsOf, type BurstShape, type Cell } from './arrivals.js';
import { CONFIG_FORMS, parseConfigs, type Config } from './configs.js';

const USAGE = 'node dist/bench/scheduling.js [options]';

const OPTIONS = {
  model: { type: 'string', value: 'NAME', default: 'tiny-embed', help: 'model folder under --models-dir' },
  'models-dir': { type: 'string', value: 'DIR', help: 'the folder of model folders (default <repo>/models)' },
  device: { type: 'string', value: 'D', default: 'cpu', help: 'engine device' },
  'intra-op-threads': { type: 'int', min: 0, default: 0, help: "onnxruntime intra-op threads per engine, 0 for onnxruntime's choice" },
  configs: {
    type: 'strings',
    default: ['fixed:5:1', 'fixed:0:2', 'fixed:5:2', 'fixed:20:2', 'slo:25', 'slo:50'],
    help: `${CONFIG_FORMS}, comma separated; the first is the reference for the ratio columns and runs the capacity probe`,
  },
  loads: { type: 'numbers', min: 1, default: [30, 60, 90, 120], quick: [60, 120], help: 'Poisson offered loads, % of capacity' },
  'burst-loads': { type: 'numbers', min: 1, default: [30, 60], quick: [60], help: 'on/off burst loads, % of capacity as a mean ("" for none)' },
  'burst-factor': { type: 'number', min: 1, value: 'X', default: 5, help: 'rate during a burst / mean rate' },
  'burst-duty': { type: 'number', min: 0.01, value: 'F', default: 0.2, help: 'share of each period in a burst' },
  'burst-period-ms': { type: 'number', min: 1, value: 'MS', default: 1000, help: 'burst period' },
  'deadline-ms': { type: 'number', min: 1, value: 'MS', default: 1000, help: "each request's deadline from its scheduled arrival" },
  'warmup-s': { type: 'number', min: 0, value: 'S', default: 1, quick: 0.5, help: 'warm-up seconds of each phase, not measured' },
  'duration-s': { type: 'number', min: 0.1, value: 'S', default: 3, quick: 2, help: 'measured seconds of each phase' },
  rounds: { type: 'int', min: 1, default: 2, quick: 1, help: 'rounds, alternating configuration order' },
  capacity: { type: 'number', min: 1, value: 'RPS', help: 'skip the capacity probe and use this many requests/s as 100%' },
  'capacity-s': { type: 'number', min: 0.1, value: 'S', default: 3, quick: 2, help: 'measured seconds of the capacity probe' },
  'capacity-concurrency': { type: 'int', min: 1, default: 128, help: 'closed-loop callers of the capacity probe' },
  requests: { type: 'int', min: 64, default: 8192, help: 'workload size: sequences generated from the seed' },
  seed: { type: 'int', min: 0, default: 1234, help: 'workload and arrival seed' },
  quick: { type: 'boolean', help: 'the shorter defaults marked quick above (~1 min)' },
  json: { type: 'string', value: 'PATH', help: "also write every phase's raw numbers as JSON" },
} as const satisfies Record<string, OptionSpec>;

export interface Settings {
  model: string;
  modelsDir: string;
  device: string;
  intraOpThreads: number;
  /** The first is the reference: it runs the capacity probe, the ratio columns divide by its rows. */
  configs: Config[];
  loads: number[];
  burstLoads: number[];
  /** The Poisson cells, then the burst cells. */
  cells: Cell[];
  burst: BurstShape;
  deadlineMs: number;
  warmupMs: number;
  durationMs: number;
  rounds: number;
  /** --capacity: requests/s taken as 100% without a probe (null: probe). */
  capacityGiven: number | null;
  capacityMs: number;
  capacityConcurrency: number;
  requests: number;
  seed: number;
  quick: boolean;
  json: string | undefined;
}

/** The burst alone may not carry more than the mean: factor x duty <= 1. */
function checkBurst(burst: BurstShape): void {
  if (burst.duty > 1 || burst.factor * burst.duty > 1 + 1e-9) {
    fail(`--burst-factor x --burst-duty must be at most 1 (the burst alone would exceed the mean), got ${burst.factor} x ${burst.duty}`);
  }
}

/** The settings from `argv` (default: this process's arguments); --help prints the table and exits, a bad value exits 2. */
export function schedulingSettings(argv = process.argv.slice(2)): Settings {
  const o = parseOptions(USAGE, OPTIONS, argv);
  const burst: BurstShape = { factor: o['burst-factor'], duty: o['burst-duty'], periodMs: o['burst-period-ms'] };
  checkBurst(burst);
  const configs = parseConfigs(o.configs);
  const cells = cellsOf(o.loads, o['burst-loads']);
  if (cells.length === 0) fail('nothing to run: --loads and --burst-loads are both empty');
  const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..'); // dist/bench/scheduling/options.js -> the repo root
  return {
    model: o.model,
    modelsDir: resolve(o['models-dir'] ?? join(repoRoot, 'models')),
    device: o.device,
    intraOpThreads: o['intra-op-threads'],
    configs,
    loads: o.loads,
    burstLoads: o['burst-loads'],
    cells,
    burst,
    deadlineMs: o['deadline-ms'],
    warmupMs: o['warmup-s'] * 1000,
    durationMs: o['duration-s'] * 1000,
    rounds: o.rounds,
    capacityGiven: o.capacity ?? null,
    capacityMs: o['capacity-s'] * 1000,
    capacityConcurrency: o['capacity-concurrency'],
    requests: o.requests,
    seed: o.seed,
    quick: o.quick,
    json: o.json,
  };
}
