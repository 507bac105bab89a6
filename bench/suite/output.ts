/**
 * What the run leaves: the machine it ran on, results.json (the format is
 * bench/suite-results.ts), report.md and the SVG plots (bench/report.ts), and
 * the headline table on stdout.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { hostname, loadavg } from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fail } from '../args.js';
import { renderReport, summaryTable } from '../report.js';
import { RESULTS_VERSION, type GpuSection, type MachineInfo, type SuiteResults } from '../suite-results.js';
import { summarizeWorkload } from '../workloads.js';
import type { SuiteContext } from './context.js';
import { REPO_ROOT } from './paths.js';
import { round } from './phases.js';
import { modelInfo } from './setup.js';

function readGpuResults(dir: string): GpuSection {
  const summary = join(dir, 'summary.md');
  if (!existsSync(summary)) fail(`--gpu-results ${dir}: no summary.md there (bench/gpu/run.sh writes one)`);
  // bench/gpu/summarize.ts writes summary.json beside it: card = [name, memory, driver]
  let card = 'unknown';
  try {
    const j = JSON.parse(readFileSync(join(dir, 'summary.json'), 'utf8')) as { card?: string[] | null; device?: string };
    card = j.card ? j.card.join(', ') : (j.device ?? card);
  } catch {
    /* keep unknown */
  }
  return { card, summaryMarkdown: readFileSync(summary, 'utf8'), folder: dir };
}

/** How the run started: its start, `performance.now()` then, and the machine. */
export interface RunStart {
  startedAt: Date;
  t0: number;
  machine: MachineInfo;
}

/** results.json's content, now that every case has run. */
export function suiteResults(ctx: SuiteContext, start: RunStart): SuiteResults {
  const o = ctx.options;
  const first = ctx.models[0]!;
  start.machine.loadAverageEnd = round(loadavg()[0]!, 2);
  return {
    version: RESULTS_VERSION,
    startedAt: start.startedAt.toISOString(),
    finishedAt: new Date().toISOString(),
    durationS: round((performance.now() - start.t0) / 1000, 1),
    command: `npm run bench${process.argv.length > 2 ? ' -- ' + process.argv.slice(2).join(' ') : ''}`,
    mode: o.quick ? 'quick' : 'full',
    machine: start.machine,
    settings: { seed: o.seed, warmupS: o.warmupMs / 1000, durationS: o.durationMs / 1000, curvePointS: o.curvePointMs / 1000, rounds: o.rounds, loadFractions: o.loadFractions, models: o.models, device: o.device },
    // the first model's tokenization (every model here shares the bert-base-uncased vocabulary)
    workloads: [...first.workloads.values()].map((w) => summarizeWorkload(w, first.spec.maxLength)),
    models: ctx.models.map((m) => modelInfo(m)),
    phases: ctx.phases,
    comparisons: ctx.comparisons,
    curves: ctx.curves,
    ...(o.gpuResults ? { gpu: readGpuResults(resolve(o.gpuResults)) } : {}),
    ...(ctx.scheduling ? { scheduling: ctx.scheduling } : {}),
    ...(ctx.notes.length ? { notes: ctx.notes } : {}),
  };
}

/** Writes results.json, the report and the plots into --out (default bench/results/<date>-<host>/), then prints the headline table. */
export async function writeOutput(results: SuiteResults, out: string | undefined, startedAt: Date): Promise<void> {
  const day = startedAt.toISOString().slice(0, 10);
  const dir = resolve(out ?? join(REPO_ROOT, 'bench', 'results', `${day}-${hostname()}`));
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'results.json'), JSON.stringify(results, null, 1));
  const { files } = await renderReport(results, dir);
  process.stdout.write('\n' + summaryTable(results) + '\n\n');
  process.stdout.write(`${results.phases.length} phases in ${results.durationS} s; results, report and ${files.filter((f) => f.endsWith('.svg')).length} plots in ${dir}\n`);
}
