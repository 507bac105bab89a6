/**
 * `npm run bench`: the benchmark suite. It answers, side by side in one run on
 * this machine, what users choosing a serving system ask:
 *
 *   batching    what dynamic batching buys: the same server with and without
 *               it (--max-batch-size 1), same load, over HTTP and WebSocket,
 *               and what it costs one lone client in latency; beside it the
 *               in-process engine with and without it (how much of it HTTP
 *               keeps, and the gain with no transport)
 *   bucketing   length buckets against one FIFO queue padded to the longest
 *               (--buckets 512 --pad-to longest) on the mixed-length workload
 *   efficiency  server throughput against onnxruntime called directly at its
 *               best batch size on the same token lengths (the ceiling)
 *   curve       latency against throughput: open-loop Poisson arrivals from
 *               10% to 120% of capacity, for fixed windows and --slo-p99-ms
 *   peer        the same model behind a small @huggingface/transformers
 *               pipeline server, one request at a time per call
 *   floor       the gateway's CPU per request against a server doing only
 *               its unavoidable work (bench/floor-server.ts)
 *   models      the comparisons above for each model size (tiny-embed,
 *               minilm-l6; bert-base with bench/gpu on a GPU)
 *
 * Each case is one module in bench/suite/ (models.ts runs them model by
 * model); bench/suite/context.ts is what they share, options.ts the command
 * line (--help).
 *
 * A/B sides alternate round by round (A B A B ...), both servers up the whole
 * time, so slow drift on a shared machine lands on both. Everything goes to
 * bench/results/<date>-<host>/: results.json (every phase, HDR histograms
 * included), report.md and the SVG plots (bench/report.ts).
 *
 * Servers run as child processes exactly as users start them
 * (`node dist/src/cli.js serve ...`); the load generator (bench/load.ts), the
 * in-process engines and the raw onnxruntime session run in this process,
 * never two of them at the same time.
 */
import { performance } from 'node:perf_hooks';
import { SuiteContext } from './suite/context.js';
import { runFloor } from './suite/floor.js';
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
  const floor = await runFloor(ctx); // last, on the first model
  progress.stop();
  await writeOutput(suiteResults(ctx, start, floor), options.out, start.startedAt);
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    process.stderr.write(`bench failed: ${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  },
);
