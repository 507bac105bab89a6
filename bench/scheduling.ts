/**
 * Scheduling benchmark (issue #5): what the batch window and the latency target
 * (--slo-p99-ms) do to latency, batch fill, shedding and timeouts under
 * open-loop load, on the in-process engine (createEngine, runTokens: no
 * tokenization, no HTTP).
 *
 *   npx tsc -p tsconfig.json && node dist/models/generate.js --missing
 *   node dist/bench/scheduling.js                 # full run: about 5-6 min on 2 cores
 *   node dist/bench/scheduling.js --quick         # about 1 min: 1 round, loads 60 and 120%, bursts at 60%
 *   node dist/bench/scheduling.js --json bench/results/scheduling.json
 *   node dist/bench/scheduling.js --help
 *
 * What runs:
 *   workload   a fixed-seed list of token sequences, 8..512 tokens with [CLS]/[SEP]: 80% "queries"
 *              (log-normal, median 16 tokens) and 20% "passages" (log-normal, median 160, clipped to 512)
 *   capacity   first, a short closed-loop run (--capacity-concurrency callers) on the first
 *              configuration's engine: requests/s it answers when never idle. Offered loads are
 *              percentages of it (--capacity RPS skips the measurement).
 *   phases     open loop: arrival times are drawn in advance (seeded), the same for every
 *              configuration within a round, and each request is sent at its time whatever
 *              happened to earlier ones. Patterns: `poisson` (exponential gaps at the mean rate)
 *              and `burst` (on/off: --burst-factor x the mean rate for --burst-duty of every
 *              --burst-period-ms, the rest of the period at the rate that keeps the mean; with
 *              5 x 20% that is silence). Latency runs from the *scheduled* arrival to the answer
 *              (coordinated omission corrected: if the generator falls behind, the lag counts),
 *              and each request's deadline (--deadline-ms) also runs from its scheduled arrival.
 *              Only requests scheduled inside the measured window count; the engine's counters
 *              (batches, rows, tokens) are read at both ends of that window.
 *   configs    one engine per configuration, all opened before any timing and kept open; every
 *              (pattern, load) cell runs each configuration once per round, in the order
 *              A B C ... then C B A ... in the next round, so drift on a shared box hits all alike.
 *
 * Configurations (--configs, comma separated):
 *   fixed:D[:I[:N]]   maxBatchDelayMs D, maxInflightBatches I (default 1), no latency target
 *   slo:T[:I[:N]]     sloP99Ms T, maxInflightBatches I (default 1)
 *   (N: maxBatchTokens, default the engine's 16384)
 * With maxInflightBatches 1 (the default: onnxruntime-node runs a session synchronously) the
 * scheduler is only asked when the device is idle, so a batch closes at once and maxBatchDelayMs
 * never applies (docs/architecture.md): one `fixed:5:1` row stands for every fixed window there.
 * The fixed windows act only with 2 batches in flight, hence the fixed:D:2 rows.
 *
 * The parts, in the order they run (bench/scheduling/):
 *   options.ts, configs.ts   the option table (--help is written from it) and --configs
 *   setup.ts, workload.ts    the machine, the engines, the workload and its length buckets
 *   capacity.ts              the capacity probe
 *   rounds.ts                the phase order, the arrival schedules of each round (arrivals.ts: Poisson, bursts)
 *   open-loop-phase.ts       one phase: send on schedule, tally, drain (results.ts: what it records)
 *   aggregate.ts             the rounds of each (configuration, cell) merged
 *   report.ts, json.ts       the tables and the reading; the --json file
 *   clock.ts, format.ts      sleeping without spinning, µs for the histograms; percentages for the tables
 */
import { performance } from 'node:perf_hooks';
import { aggregateRounds } from './scheduling/aggregate.js';
import { measureCapacity, type Capacity } from './scheduling/capacity.js';
import { writeJson } from './scheduling/json.js';
import { schedulingSettings } from './scheduling/options.js';
import { printReport, printTotals } from './scheduling/report.js';
import { printPlan, runRounds, type PhaseRecords } from './scheduling/rounds.js';
import { machineInfo as describeMachine } from './machine.js';
import { closeEngines, openBench, printHeader, type Bench } from './scheduling/setup.js';

/** The capacity probe, then every phase; the engines are closed whatever happens. */
async function measure(bench: Bench): Promise<{ capacity: Capacity; records: PhaseRecords }> {
  try {
    const capacity = await measureCapacity(bench);
    printPlan(bench.settings);
    return { capacity, records: await runRounds(bench, capacity.perS) };
  } finally {
    await closeEngines(bench.engines);
  }
}

async function main(): Promise<void> {
  const started = performance.now();
  const settings = schedulingSettings();
  const machine = describeMachine();
  printHeader(settings, machine);
  const bench = await openBench(settings, machine);
  const { capacity, records } = await measure(bench);
  const aggregates = aggregateRounds(bench, records);
  printReport(bench, capacity, aggregates);
  printTotals(bench, records.phases, started);
  if (settings.json) writeJson(settings.json, bench, capacity, aggregates, records.phases);
}

await main();
