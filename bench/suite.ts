/**
 * `npm run bench`: the benchmark suite. Its cases (bench/README.md says what
 * each answers) are one module each in bench/suite/ (models.ts runs them
 * model by model, then the floor and the opt-in cases); context.ts is what
 * they share, options.ts the command line. Everything goes to bench/results/<date>-<host>/:
 * results.json, report.md and the plots (bench/report.ts).
 */
import { performance } from 'node:perf_hooks';
import { SuiteContext } from './suite/context.js';
import { runCache } from './suite/cache.js';
import { runFloor } from './suite/floor.js';
import { runGrpc } from './suite/grpc.js';
import { runIdle } from './suite/idle.js';
import { runLongInputs } from './suite/long-inputs.js';
import { runModelLoad } from './suite/model-load.js';
import { runOutputs } from './suite/outputs.js';
import { runTracing } from './suite/tracing.js';
import { runModelCases } from './suite/models.js';
import { parseSuiteOptions } from './suite/options.js';
import { machineInfo } from './machine.js';
import { suiteResults, writeOutput } from './suite/output.js';
import { planSeconds } from './suite/plan.js';
import { Progress } from './suite/progress.js';
import { loadModels } from './suite/setup.js';

async function main(): Promise<void> {
  const options = parseSuiteOptions();
  const start = { startedAt: new Date(), t0: performance.now(), machine: machineInfo() };
  const models = await loadModels(options); // and their workloads, before any timing
  const plan = planSeconds(options, models.length);
  const progress = new Progress(options.progress, plan);
  progress.log(`slabserve bench (${options.quick ? 'quick' : 'full'}): ${[...options.cases].join(', ')} on ${options.models.join(', ')}; about ${Math.round(plan)} s planned`);
  const ctx = new SuiteContext(options, models, progress);
  await runModelCases(ctx);
  await runFloor(ctx); // on the first model
  for (const run of [runCache, runGrpc, runTracing, runOutputs, runIdle, runModelLoad, runLongInputs]) await run(ctx); // each when named
  progress.stop();
  await writeOutput(suiteResults(ctx, start), options.out, start.startedAt);
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    process.stderr.write(`bench failed: ${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  },
);
