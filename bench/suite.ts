/**
 * `npm run bench`: the benchmark suite. It answers, side by side in one run on
 * this machine, what users choosing a serving system ask:
 *
 *   batching    what dynamic batching buys: the same server with and without
 *               it (--max-batch-size 1), same load, over HTTP and WebSocket,
 *               and what it costs one lone client in latency
 *   bucketing   length buckets against one FIFO queue padded to the longest
 *               (--buckets 512 --pad-to longest) on the mixed-length workload
 *   efficiency  server throughput against onnxruntime called directly at its
 *               best batch size on the same token lengths (the ceiling)
 *   curve       latency against throughput: open-loop Poisson arrivals from
 *               10% to 120% of capacity, for fixed windows and --slo-p99-ms
 *   peer        the same model behind a small @huggingface/transformers
 *               pipeline server, one request at a time per call
 *   models      the comparisons above for each model size (tiny-embed,
 *               minilm-l6; bert-base with bench/gpu on a GPU)
 *
 * A/B sides alternate round by round (A B A B ...), both servers up the whole
 * time, so slow drift on a shared machine lands on both. Everything goes to
 * bench/results/<date>-<host>/: results.json (every phase, HDR histograms
 * included), report.md and the SVG plots (bench/report.ts).
 *
 * Servers run as child processes exactly as users start them
 * (`node dist/src/cli.js serve ...`); the load generator (bench/load.ts) and the
 * raw onnxruntime session run in this process, never at the same time.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { cpus, hostname, loadavg, release, totalmem } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import cliProgress from 'cli-progress';
import hdr, { type Histogram } from 'hdr-histogram-js';
import { prepareModel, type PreparedModel } from '../src/gpu-worker/graph.js';
import { defaultBuckets } from '../src/gpu-worker/scheduler.js';
import { mulberry32 } from '../src/modelgen/rng.js';
import { loadModelSpec, type ModelSpec } from '../src/shared/model-config.js';
import { VERSION } from '../src/version.js';
import { procCpuMs, startChildServer, startServerProcess, type ServerCounters, type ServerProcess } from './server-process.js';
import { newHistogram, runLoad, type Arrivals, type LoadOutcome, type LoadTarget } from './load.js';
import { openRawSession, rawBatches, runRawLoop } from './raw-ort.js';
import { renderReport, summaryTable } from './report.js';
import {
  RESULTS_VERSION,
  type CaseName,
  type Comparison,
  type Curve,
  type GpuSection,
  type LatencySummary,
  type ModelInfo,
  type PhaseResult,
  type ServerSide,
  type SuiteResults,
} from './suite-results.js';
import { makeWorkload, summarizeWorkload, type Workload, type WorkloadName } from './workloads.js';
import { fail, num, numList } from './args.js';
import { floorRows, runFloorCase, type FloorPhase, type FloorRow } from './floor.js';

const here = dirname(fileURLToPath(import.meta.url));
const repoRoot = resolve(here, '..', '..'); // dist/bench/suite.js -> the repository
const CLI = join(repoRoot, 'dist', 'src', 'cli.js');
const PEER = join(repoRoot, 'dist', 'bench', 'peer-transformers.js');
const ALL_CASES: CaseName[] = ['batching', 'bucketing', 'efficiency', 'curve', 'peer', 'floor', 'models'];

const HELP = `usage: npm run bench [-- options]        (node dist/bench/suite.js [options])

  --quick                 under 2 minutes: one round, short windows, tiny-embed only, 4 load points
  --cases LIST            ${ALL_CASES.join(',')} (default: all)
  --models LIST           default tiny-embed,minilm-l6 (quick: tiny-embed); the first gets every case,
                          the others batching, efficiency and peer
  --rounds N              A/B alternations (default 3, quick 1)
  --duration-s S          measured seconds per closed-loop phase (default 3, quick 1.5)
  --warmup-s S            warm-up seconds before each phase (default 0.5, quick 0.3)
  --curve-point-s S       measured seconds per curve point (default 2.5, quick 1.5)
  --loads LIST            curve points as % of capacity (default 10,25,50,75,90,100,120; quick 25,75,100,120)
  --slo-p99-ms MS         the latency target of the --slo-p99-ms curve (default 50)
  --seed N                workload and arrival seed (default 1)
  --device D              server device (default cpu)
  --models-dir DIR        where tiny-embed & co. are (default: the repository's models/)
  --bench-models-dir DIR  where bigger models are generated once (default: ~/.cache/slabserve/bench-models)
  --gpu-results DIR       include a bench/gpu/run.sh output folder in the report
  --out DIR               default bench/results/<date>-<host>
  --no-progress           plain lines instead of progress bars
`;

const { values: args } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    cases: { type: 'string' },
    models: { type: 'string' },
    rounds: { type: 'string' },
    'duration-s': { type: 'string' },
    'warmup-s': { type: 'string' },
    'curve-point-s': { type: 'string' },
    loads: { type: 'string' },
    'slo-p99-ms': { type: 'string', default: '50' },
    seed: { type: 'string', default: '1' },
    device: { type: 'string', default: 'cpu' },
    'models-dir': { type: 'string' },
    'bench-models-dir': { type: 'string' },
    'gpu-results': { type: 'string' },
    out: { type: 'string' },
    'no-progress': { type: 'boolean', default: false },
    help: { type: 'boolean', default: false },
  },
});
if (args.help) {
  process.stdout.write(HELP);
  process.exit(0);
}

const QUICK = args.quick!;
const CASES = new Set((args.cases ?? ALL_CASES.join(',')).split(',').map((s) => s.trim()) as CaseName[]);
for (const c of CASES) if (!ALL_CASES.includes(c)) fail(`unknown case "${c}" (cases: ${ALL_CASES.join(', ')})`);
const MODELS = (args.models ?? (QUICK ? 'tiny-embed' : 'tiny-embed,minilm-l6')).split(',').map((s) => s.trim());
const ROUNDS = num('rounds', args.rounds ?? (QUICK ? '1' : '3'), 1, true);
const DURATION_MS = num('duration-s', args['duration-s'] ?? (QUICK ? '1.5' : '3'), 0.1) * 1000;
const WARMUP_MS = num('warmup-s', args['warmup-s'] ?? (QUICK ? '0.3' : '0.5'), 0) * 1000;
const POINT_MS = num('curve-point-s', args['curve-point-s'] ?? (QUICK ? '1.5' : '2.5'), 0.1) * 1000;
const LOADS = numList('loads', args.loads ?? (QUICK ? '25,75,100,120' : '10,25,50,75,90,100,120'), 1).map((pct) => pct / 100);
const SLO_MS = num('slo-p99-ms', args['slo-p99-ms']!, 1);
const SEED = num('seed', args.seed!, 0, true);
const DEVICE = args.device!;
const MODELS_DIR = resolve(args['models-dir'] ?? join(repoRoot, 'models'));
const BENCH_MODELS_DIR = resolve(args['bench-models-dir'] ?? join(process.env.HOME ?? '/tmp', '.cache', 'slabserve', 'bench-models'));
const PROGRESS = !args['no-progress'] && process.stderr.isTTY === true;

/** Workload sizes: distinct requests generated per workload. */
const WORKLOAD_REQUESTS: Record<WorkloadName, number> = { short: 4096, mixed: 2048, 'client-batch': 256 };
/** Closed-loop callers for the throughput phases (enough to fill batches of 32 twice over). */
const CLIENTS = 64;
const PEER_CLIENTS = 16;
const CLIENT_BATCH_CLIENTS = 8;
const RAW_BATCH_SIZES = [1, 8, 32];
const BURSTS = { factor: 4, duty: 0.1, periodMs: 500 };

// ---------------------------------------------------------------- progress

/** Two bars on a terminal (the whole run, the current phase), plain lines elsewhere. */
class Progress {
  private readonly multi?: cliProgress.MultiBar;
  private readonly total?: cliProgress.SingleBar;
  private readonly phase?: cliProgress.SingleBar;
  private doneS = 0;

  constructor(private readonly plannedS: number) {
    if (!PROGRESS) return;
    this.multi = new cliProgress.MultiBar(
      { format: ' {bar} {percentage}% | {label} | {info}', barsize: 30, hideCursor: true, clearOnComplete: false, stream: process.stderr },
      cliProgress.Presets.shades_classic,
    );
    this.total = this.multi.create(Math.round(plannedS), 0, { label: 'suite'.padEnd(44), info: `~${Math.round(plannedS)} s planned` });
    this.phase = this.multi.create(1, 0, { label: ''.padEnd(44), info: '' });
  }

  start(label: string, seconds: number): void {
    this.phase?.setTotal(Math.max(1, Math.round(seconds * 10)));
    this.phase?.update(0, { label: label.slice(0, 44).padEnd(44), info: '' });
  }

  tick(fraction: number, info: string): void {
    this.phase?.update(Math.round(fraction * (this.phase.getTotal() ?? 1)), { info });
  }

  finish(label: string, seconds: number, line: string): void {
    this.doneS += seconds;
    this.total?.update(Math.min(Math.round(this.doneS), Math.round(this.plannedS)), { info: `${Math.round(this.doneS)} of ~${Math.round(this.plannedS)} s` });
    if (this.multi) this.multi.log(`${label}: ${line}\n`);
    else process.stderr.write(`${label}: ${line}\n`);
  }

  log(line: string): void {
    if (this.multi) this.multi.log(line + '\n');
    else process.stderr.write(line + '\n');
  }

  stop(): void {
    this.multi?.stop();
  }
}

// ---------------------------------------------------------------- helpers

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
const round = (x: number, digits = 3) => Math.round(x * 10 ** digits) / 10 ** digits;

function latencySummary(h: Histogram): LatencySummary {
  const ms = (v: number) => round(v / 1000, 3);
  if (h.totalCount === 0) return { p50: NaN, p90: NaN, p99: NaN, p999: NaN, max: NaN, mean: NaN };
  return {
    p50: ms(h.getValueAtPercentile(50)),
    p90: ms(h.getValueAtPercentile(90)),
    p99: ms(h.getValueAtPercentile(99)),
    p999: ms(h.getValueAtPercentile(99.9)),
    max: ms(h.maxValue),
    mean: ms(h.mean),
  };
}

function serverSide(before: ServerCounters, after: ServerCounters, windowMs: number): ServerSide {
  const batches = after.batches - before.batches;
  const rows = after.rows - before.rows;
  const les = [...after.batchSizeLe.keys()].sort((a, b) => a - b);
  let prev = 0;
  const batchSizes = les.map((le) => {
    const cum = (after.batchSizeLe.get(le) ?? 0) - (before.batchSizeLe.get(le) ?? 0);
    const count = cum - prev;
    prev = cum;
    return { le, count };
  });
  return {
    batches,
    meanBatch: batches > 0 ? round(rows / batches, 2) : 0,
    paddingEfficiency: round((after.realTokens - before.realTokens) / Math.max(1, after.paddedTokens - before.paddedTokens), 4),
    batchSizes,
    deviceBusy: round(((after.runSeconds - before.runSeconds) * 1000) / windowMs, 3),
  };
}

type PhaseMeta = Pick<PhaseResult, 'case' | 'model' | 'workload' | 'target' | 'transport' | 'loop' | 'round'> &
  Partial<Pick<PhaseResult, 'serverArgs' | 'concurrency' | 'offeredRps' | 'loadFraction' | 'arrivals'>>;

function phaseId(m: PhaseMeta): string {
  const shape = m.loop === 'closed' ? `${m.transport}-${m.concurrency ?? 0}` : `${m.transport}-${Math.round((m.loadFraction ?? 0) * 100)}pct-${m.arrivals}`;
  return `${m.case}/${m.model}/${m.workload}/${shape}/${m.target.replace(/\s+/g, '-')}/r${m.round}`;
}

function phaseFromLoad(m: PhaseMeta, o: LoadOutcome): PhaseResult {
  const s = o.windowMs / 1000;
  const p: PhaseResult = {
    id: phaseId(m),
    ...m,
    windowS: round(s, 3),
    requests: o.requests,
    inputs: o.inputs,
    tokens: o.tokens,
    rejected: o.rejected,
    errors: o.errors,
    ...(o.firstError ? { firstError: o.firstError } : {}),
    rps: round(o.requests / s, 1),
    inputsPerS: round(o.inputs / s, 1),
    tokensPerS: round(o.tokens / s, 0),
    latencyMs: latencySummary(o.histogram),
    histogram: hdr.encodeIntoCompressedBase64(o.histogram),
  };
  if (o.before && o.after) p.server = serverSide(o.before, o.after, o.countersMs);
  if (o.serverCpuMs !== null && o.requests > 0) p.cpuMsPerRequest = round(o.serverCpuMs / o.requests, 4);
  if (o.requests > 0) p.clientCpuMsPerRequest = round(o.clientCpuMs / o.requests, 4);
  o.histogram.destroy();
  return p;
}

function describe(p: PhaseResult): string {
  const lat = `P50 ${p.latencyMs.p50.toFixed(1)} ms, P99 ${p.latencyMs.p99.toFixed(1)} ms`;
  const batch = p.server ? `, batch ${p.server.meanBatch.toFixed(1)}, padding eff. ${(p.server.paddingEfficiency * 100).toFixed(0)}%` : '';
  const bad = p.rejected || p.errors ? `, rejected ${p.rejected}, errors ${p.errors}${p.firstError ? ` (${p.firstError.slice(0, 80)})` : ''}` : '';
  return `${p.rps.toFixed(0)} req/s, ${p.inputsPerS.toFixed(0)} inputs/s, ${lat}${batch}${bad}`;
}

// ---------------------------------------------------------------- targets

interface Target extends LoadTarget {
  label: string;
  serverArgs?: string[];
  stop(): Promise<unknown>;
}

function slabserveArgs(modelsDir: string, model: string, extra: string[]): string[] {
  return ['--host', '127.0.0.1', '--port', '0', '--models-dir', modelsDir, '--model', model, '--device', DEVICE, ...extra];
}

async function startSlabserve(label: string, modelsDir: string, model: string, extra: string[]): Promise<Target & { server: ServerProcess }> {
  const server = await startServerProcess({ cliPath: CLI, args: slabserveArgs(modelsDir, model, extra), startTimeoutMs: 180_000 });
  return {
    label,
    serverArgs: extra,
    server,
    origin: server.origin,
    cpuMs: () => server.cpuMs(),
    counters: (m) => server.counters(m),
    stop: () => server.stop(),
  };
}

/** The transformers.js peer (bench/peer-transformers.ts) as a child process; ready when it prints its address on stdout. */
async function startPeer(modelDir: string): Promise<Target> {
  const child = await startChildServer({
    args: [PEER, '--model-dir', modelDir, '--port', '0', '--host', '127.0.0.1'],
    stream: 'stdout',
    ready: (line) => /listening on (http:\/\/\S+)/.exec(line)?.[1]!.replace(/\/$/, '') ?? null,
    startTimeoutMs: 120_000,
    what: 'transformers.js peer',
  });
  return { label: 'transformers.js', origin: child.origin, cpuMs: () => procCpuMs(child.pid), stop: () => child.stop() };
}

// ---------------------------------------------------------------- correctness before timing

async function postEmbed(origin: string, texts: string[]): Promise<number[][]> {
  const res = await fetch(`${origin}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: texts }) });
  if (res.status !== 200) throw new Error(`POST ${origin}/embed: ${res.status} ${await res.text()}`);
  return (await res.json()) as number[][];
}

/** Largest difference between a server's vectors and raw onnxruntime's for a few inputs of the workload, each run alone. */
async function checkAgainstRaw(origin: string, w: Workload, prepared: PreparedModel, n = 6): Promise<number> {
  const session = await openRawSession(prepared, 'cpu', 1);
  try {
    const picks = w.requests.slice(0, n).map((r) => r[0]!);
    const rows = await postEmbed(origin, picks.map((x) => x.text));
    let worst = 0;
    for (let i = 0; i < picks.length; i++) {
      const [batch] = rawBatches([picks[i]!], [picks[i]!.ids.length], 1, prepared, () => 0);
      const out = await session.run(batch!.feeds);
      const ref = out[prepared.outputs[0]!.name]!.data as Float32Array;
      for (let j = 0; j < rows[i]!.length; j++) worst = Math.max(worst, Math.abs(rows[i]![j]! - ref[j]!));
    }
    return worst;
  } finally {
    await session.release();
  }
}

// ---------------------------------------------------------------- the run

interface ModelSetup {
  name: string;
  dir: string;
  spec: ModelSpec;
  prepared: PreparedModel;
  workloads: Map<WorkloadName, Workload>;
}

async function ensureModel(name: string): Promise<string> {
  for (const base of [MODELS_DIR, BENCH_MODELS_DIR]) if (existsSync(join(base, name, 'model.onnx'))) return base;
  mkdirSync(BENCH_MODELS_DIR, { recursive: true });
  process.stderr.write(`generating ${name} into ${BENCH_MODELS_DIR} (once)\n`);
  execFileSync(process.execPath, [join(repoRoot, 'dist', 'models', 'generate.js'), '--missing', '--out', BENCH_MODELS_DIR, name], { stdio: 'inherit' });
  return BENCH_MODELS_DIR;
}

function machineInfo(): SuiteResults['machine'] {
  let ortVersion = 'unknown';
  try {
    ortVersion = (JSON.parse(readFileSync(join(repoRoot, 'node_modules', 'onnxruntime-node', 'package.json'), 'utf8')) as { version: string }).version;
  } catch {
    /* reported as unknown */
  }
  let os = `Linux ${release()}`;
  try {
    const pretty = /PRETTY_NAME="([^"]+)"/.exec(readFileSync('/etc/os-release', 'utf8'));
    if (pretty) os = `${pretty[1]} (kernel ${release()})`;
  } catch {
    /* keep the kernel */
  }
  return {
    host: hostname(),
    cpu: cpus()[0]?.model.trim() ?? 'unknown',
    cores: cpus().length,
    memoryGiB: round(totalmem() / 2 ** 30, 1),
    os,
    node: process.version,
    onnxruntime: ortVersion,
    slabserve: VERSION,
    loadAverageStart: round(loadavg()[0]!, 2),
    loadAverageEnd: 0,
  };
}

function readGpuResults(dir: string): GpuSection {
  const summary = join(dir, 'summary.md');
  if (!existsSync(summary)) fail(`--gpu-results ${dir}: no summary.md there (bench/gpu/run.sh writes one)`);
  // bench/gpu/summarize.mjs writes summary.json beside it: card = [name, memory, driver]
  let card = 'unknown';
  try {
    const j = JSON.parse(readFileSync(join(dir, 'summary.json'), 'utf8')) as { card?: string[] | null; device?: string };
    card = j.card ? j.card.join(', ') : (j.device ?? card);
  } catch {
    /* keep unknown */
  }
  return { card, summaryMarkdown: readFileSync(summary, 'utf8'), folder: dir };
}

async function main(): Promise<void> {
  const startedAt = new Date();
  const t0 = performance.now();
  const phases: PhaseResult[] = [];
  const comparisons: Comparison[] = [];
  const curves: Curve[] = [];
  const machine = machineInfo();
  const r = mulberry32(SEED);

  // ---- models and workloads, before any timing
  const models: ModelSetup[] = [];
  for (const name of MODELS) {
    const base = await ensureModel(name);
    const dir = join(base, name);
    const spec = await loadModelSpec(dir);
    if (spec.task !== 'embed') fail(`model ${name} is a ${spec.task} model; the suite drives /embed (pick embedding models)`);
    const prepared = prepareModel(readFileSync(spec.onnxPath), spec);
    const first = models.length === 0;
    const names: WorkloadName[] = first ? ['short', 'mixed', 'client-batch'] : ['short'];
    const workloads = new Map<WorkloadName, Workload>();
    for (const wn of names) workloads.set(wn, await makeWorkload(wn, spec, SEED, WORKLOAD_REQUESTS[wn]));
    models.push({ name, dir: base, spec, prepared, workloads });
  }

  const plan = planSeconds(models.length);
  const progress = new Progress(plan);
  progress.log(`slabserve bench (${QUICK ? 'quick' : 'full'}): ${[...CASES].join(', ')} on ${MODELS.join(', ')}; about ${Math.round(plan)} s planned`);

  /** One load phase against a target, recorded. */
  const load = async (meta: PhaseMeta, target: Target, w: Workload, arrivals: Arrivals, durationMs = DURATION_MS): Promise<PhaseResult> => {
    const label = `${meta.case} ${meta.model} ${target.label} ${meta.transport} ${arrivals.kind === 'closed' ? `${arrivals.concurrency} clients` : `${Math.round((meta.loadFraction ?? 0) * 100)}%`}`;
    const totalS = (WARMUP_MS + durationMs) / 1000;
    progress.start(label, totalS);
    const o = await runLoad(
      {
        target,
        model: meta.model,
        transport: meta.transport as 'http' | 'ws',
        workload: w,
        arrivals,
        warmupMs: WARMUP_MS,
        durationMs,
        onProgress: (p) => progress.tick(p.elapsedMs / p.totalMs, `${p.answered} answered, ${p.rejected} rejected, ${p.errors} errors`),
      },
      r,
    );
    const p = phaseFromLoad({ ...meta, ...(target.serverArgs ? { serverArgs: target.serverArgs } : {}) }, o);
    phases.push(p);
    progress.finish(label, totalS, describe(p));
    return p;
  };

  /** Runs `sides` alternately for ROUNDS rounds; returns each side's phases. */
  const ab = async (run: (side: number, roundNo: number) => Promise<PhaseResult>, sides: number): Promise<PhaseResult[][]> => {
    const out: PhaseResult[][] = Array.from({ length: sides }, () => []);
    for (let k = 1; k <= ROUNDS; k++) for (let s = 0; s < sides; s++) out[s]!.push(await run(s, k));
    return out;
  };

  const compare = (
    c: Omit<Comparison, 'a' | 'b' | 'ratio' | 'roundRatios'>,
    a: { label: string; phases: PhaseResult[] },
    b: { label: string; phases: PhaseResult[] },
    pick: (p: PhaseResult) => number,
  ) => {
    const av = median(a.phases.map(pick));
    const bv = median(b.phases.map(pick));
    const roundRatios = a.phases.map((p, i) => round(pick(p) / pick(b.phases[i] ?? b.phases[0]!), 3));
    comparisons.push({ ...c, a: { label: a.label, value: round(av, 3) }, b: { label: b.label, value: round(bv, 3) }, ratio: round(median(roundRatios), 3), roundRatios });
  };

  const capacities = new Map<string, number>();

  for (const [mi, m] of models.entries()) {
    const first = mi === 0;
    const short = m.workloads.get('short')!;
    const meta = (c: CaseName, workload: string, target: string, transport: PhaseResult['transport'], k: number, concurrency?: number): PhaseMeta => ({
      case: c,
      model: m.name,
      workload,
      target,
      transport,
      loop: 'closed',
      round: k,
      ...(concurrency !== undefined ? { concurrency } : {}),
    });

    // ---- batching (and the batched server's numbers for efficiency, curve capacity and the peer)
    let batchedHttp: PhaseResult[] = [];
    if (CASES.has('batching') || CASES.has('efficiency') || CASES.has('curve') || (CASES.has('models') && !first)) {
      const batched = await startSlabserve('batched', m.dir, m.name, []);
      const unbatched = CASES.has('batching') || !first ? await startSlabserve('max-batch-size 1', m.dir, m.name, ['--max-batch-size', '1']) : undefined;
      try {
        const diff = await checkAgainstRaw(batched.origin, short, m.prepared);
        progress.log(`${m.name}: server vectors equal raw onnxruntime within ${diff.toExponential(1)}`);
        if (diff > 1e-4) throw new Error(`${m.name}: the server's vectors differ from raw onnxruntime by ${diff}: not benchmarking a wrong answer`);
        const sides = unbatched ? [batched, unbatched] : [batched];
        const c: CaseName = first ? 'batching' : 'models';
        const http = await ab((s, k) => load(meta(c, 'short', sides[s]!.label, 'http', k, CLIENTS), sides[s]!, short, { kind: 'closed', concurrency: CLIENTS }), sides.length);
        batchedHttp = http[0]!;
        // noise from other work on a shared machine only ever lowers throughput: the best round is the capacity
        capacities.set(m.name, Math.max(...batchedHttp.map((p) => p.rps)));
        if (unbatched) {
          compare(
            { id: `batching/${m.name}/http`, case: c, question: 'What does dynamic batching buy?', model: m.name, workload: 'short', transport: 'http', metric: 'rps', note: `${CLIENTS} keep-alive clients, closed loop` },
            { label: 'batched', phases: http[0]! },
            { label: 'max-batch-size 1', phases: http[1]! },
            (p) => p.rps,
          );
        }
        if (first && unbatched && CASES.has('batching')) {
          const ws = await ab((s, k) => load(meta(c, 'short', sides[s]!.label, 'ws', k, CLIENTS), sides[s]!, short, { kind: 'closed', concurrency: CLIENTS }), 2);
          compare(
            { id: `batching/${m.name}/ws`, case: c, question: 'What does dynamic batching buy over WebSocket?', model: m.name, workload: 'short', transport: 'ws', metric: 'rps', note: `1 socket x ${CLIENTS} in flight` },
            { label: 'batched', phases: ws[0]! },
            { label: 'max-batch-size 1', phases: ws[1]! },
            (p) => p.rps,
          );
          const cb = m.workloads.get('client-batch')!;
          const cbp = await ab(
            (s, k) => load(meta(c, 'client-batch', sides[s]!.label, 'http', k, CLIENT_BATCH_CLIENTS), sides[s]!, cb, { kind: 'closed', concurrency: CLIENT_BATCH_CLIENTS }),
            2,
          );
          compare(
            { id: `batching/${m.name}/client-batch`, case: c, question: 'And for clients that send 16 texts per request?', model: m.name, workload: 'client-batch', transport: 'http', metric: 'inputsPerS', note: `${CLIENT_BATCH_CLIENTS} clients` },
            { label: 'batched', phases: cbp[0]! },
            { label: 'max-batch-size 1', phases: cbp[1]! },
            (p) => p.inputsPerS,
          );
          const one = await ab((s, k) => load(meta(c, 'short', sides[s]!.label, 'http', k, 1), sides[s]!, short, { kind: 'closed', concurrency: 1 }), 2);
          compare(
            { id: `batching/${m.name}/latency-1-client`, case: c, question: 'What does batching cost a lone client (P50)?', model: m.name, workload: 'short', transport: 'http', metric: 'p50', note: '1 client: below 1 means batching is faster' },
            { label: 'batched', phases: one[0]! },
            { label: 'max-batch-size 1', phases: one[1]! },
            (p) => p.latencyMs.p50,
          );
        }
      } finally {
        await batched.stop();
        await unbatched?.stop();
      }
    }

    // ---- efficiency: raw onnxruntime at its best batch size, same token lengths
    if ((CASES.has('efficiency') || (CASES.has('models') && !first)) && batchedHttp.length > 0) {
      const session = await openRawSession(m.prepared, DEVICE, 0);
      const raws: PhaseResult[] = [];
      try {
        const seqs = short.requests.map((q) => q[0]!);
        for (const size of RAW_BATCH_SIZES) {
          const label = `raw onnxruntime b=${size}`;
          const totalS = (WARMUP_MS + DURATION_MS) / 1000;
          progress.start(`efficiency ${m.name} ${label}`, totalS);
          const h = newHistogram();
          const res = await runRawLoop(session, rawBatches(seqs, defaultBuckets(m.spec.maxLength), size, m.prepared, mulberry32(SEED + size)), WARMUP_MS, DURATION_MS, h);
          const s = res.windowMs / 1000;
          const p: PhaseResult = {
            id: phaseId({ ...meta(first ? 'efficiency' : 'models', 'short', label, 'in-process', 1, size) }),
            ...meta(first ? 'efficiency' : 'models', 'short', label, 'in-process', 1, size),
            windowS: round(s, 3),
            requests: res.batches,
            inputs: res.rows,
            tokens: res.realTokens,
            rejected: 0,
            errors: 0,
            rps: round(res.batches / s, 1),
            inputsPerS: round(res.rows / s, 1),
            tokensPerS: round(res.realTokens / s, 0),
            latencyMs: latencySummary(h),
            histogram: hdr.encodeIntoCompressedBase64(h),
            cpuMsPerRequest: round(res.cpuMs / res.batches, 4),
          };
          h.destroy();
          phases.push(p);
          raws.push(p);
          progress.finish(`efficiency ${m.name} ${label}`, totalS, `${p.inputsPerS.toFixed(0)} inputs/s, ${p.latencyMs.p50.toFixed(2)} ms per batch`);
        }
      } finally {
        await session.release();
      }
      const best = raws.reduce((a, b) => (b.inputsPerS > a.inputsPerS ? b : a));
      compare(
        {
          id: `efficiency/${m.name}/http`,
          case: first ? 'efficiency' : 'models',
          question: 'How close is the server to onnxruntime alone?',
          model: m.name,
          workload: 'short',
          transport: 'http',
          metric: 'inputsPerS',
          note: `server over HTTP (${CLIENTS} clients, tokenizing) / raw onnxruntime in-process at its best batch (${best.target.replace('raw onnxruntime ', '')}), same token lengths`,
        },
        { label: 'slabserve HTTP', phases: batchedHttp },
        { label: best.target, phases: [best] },
        (p) => p.inputsPerS,
      );
    }

    // ---- bucketing: length buckets vs one FIFO queue padded to the longest, on mixed lengths
    if (first && CASES.has('bucketing')) {
      const mixed = m.workloads.get('mixed')!;
      const configs: [string, string[]][] = [
        ['length buckets', ['--pad-to', 'bucket']],
        ['FIFO padded to longest', ['--buckets', String(m.spec.maxLength), '--pad-to', 'longest']],
        ['buckets + pad to longest', ['--pad-to', 'longest']],
      ];
      const targets: Target[] = [];
      try {
        for (const [label, extra] of configs) targets.push(await startSlabserve(label, m.dir, m.name, extra));
        const res = await ab((s, k) => load(meta('bucketing', 'mixed', targets[s]!.label, 'http', k, CLIENTS), targets[s]!, mixed, { kind: 'closed', concurrency: CLIENTS }), targets.length);
        const q = { case: 'bucketing' as const, model: m.name, workload: 'mixed', transport: 'http' as const };
        compare({ ...q, id: `bucketing/${m.name}/tokens`, question: 'What do length buckets buy on mixed lengths?', metric: 'tokensPerS', note: `${CLIENTS} clients, 8-512 tokens` }, { label: configs[0]![0], phases: res[0]! }, { label: configs[1]![0], phases: res[1]! }, (p) => p.tokensPerS);
        compare({ ...q, id: `bucketing/${m.name}/padding`, question: 'Padding efficiency (real / computed tokens)', metric: 'paddingEfficiency' }, { label: configs[0]![0], phases: res[0]! }, { label: configs[1]![0], phases: res[1]! }, (p) => p.server?.paddingEfficiency ?? NaN);
        compare({ ...q, id: `bucketing/${m.name}/longest`, question: 'Buckets padded to their longest input, against to the bucket', metric: 'tokensPerS' }, { label: configs[2]![0], phases: res[2]! }, { label: configs[0]![0], phases: res[0]! }, (p) => p.tokensPerS);
      } finally {
        for (const t of targets) await t.stop();
      }
    }

    // ---- latency-throughput curves (open loop, Poisson, from the batched server's capacity)
    if (first && CASES.has('curve') && capacities.has(m.name)) {
      let capacity = capacities.get(m.name)!;
      const configs: { label: string; extra: string[]; slo?: number }[] = [
        { label: 'dispatch when idle (defaults)', extra: [] },
        ...(QUICK ? [] : [{ label: 'fixed window 10 ms, 2 in flight', extra: ['--max-batch-delay-ms', '10', '--max-inflight-batches', '2'] }]),
        { label: `--slo-p99-ms ${SLO_MS}`, extra: ['--slo-p99-ms', String(SLO_MS)], slo: SLO_MS },
      ];
      for (const [ci, cfg] of configs.entries()) {
        const target = await startSlabserve(cfg.label, m.dir, m.name, cfg.extra);
        if (ci === 0) {
          // one more closed-loop probe right before the curves, on the defaults' own server
          const probe = await load(meta('curve', 'short', `${cfg.label} capacity probe`, 'http', 1, CLIENTS), target, short, { kind: 'closed', concurrency: CLIENTS });
          capacity = Math.max(capacity, probe.rps);
        }
        const curve: Curve = { id: `curve/${m.name}/${cfg.label.replace(/\s+/g, '-')}`, model: m.name, workload: 'short', transport: 'http', label: cfg.label, serverArgs: cfg.extra, capacityRps: round(capacity, 1), ...(cfg.slo ? { sloP99Ms: cfg.slo } : {}), points: [] };
        try {
          const points: { f: number; arrivals: 'poisson' | 'bursts' }[] = LOADS.map((f) => ({ f, arrivals: 'poisson' as const }));
          if (!QUICK) points.push({ f: 0.5, arrivals: 'bursts' });
          for (const pt of points) {
            const offered = capacity * pt.f;
            const p = await load(
              { case: 'curve', model: m.name, workload: 'short', target: cfg.label, transport: 'http', loop: 'open', round: 1, offeredRps: round(offered, 1), loadFraction: pt.f, arrivals: pt.arrivals },
              target,
              short,
              { kind: 'open', ratePerS: offered, ...(pt.arrivals === 'bursts' ? { bursts: BURSTS } : {}) },
              POINT_MS,
            );
            const offeredCount = p.requests + p.rejected + p.errors;
            curve.points.push({
              loadFraction: pt.f,
              arrivals: pt.arrivals,
              offeredRps: round(offered, 1),
              achievedRps: p.rps,
              p50: p.latencyMs.p50,
              p99: p.latencyMs.p99,
              rejectedShare: offeredCount > 0 ? round(p.rejected / offeredCount, 4) : 0,
              errors: p.errors,
              ...(p.server ? { meanBatch: p.server.meanBatch } : {}),
              phaseId: p.id,
            });
          }
        } finally {
          await target.stop();
        }
        curves.push(curve);
      }
    }

    // ---- the peer: transformers.js pipelines, one request at a time per call
    if (CASES.has('peer')) {
      const peer = await startPeer(join(m.dir, m.name));
      const ours = await startSlabserve('slabserve batched', m.dir, m.name, []);
      try {
        const [pv, sv] = await Promise.all([postEmbed(peer.origin, short.requests.slice(0, 4).map((q) => q[0]!.text)), postEmbed(ours.origin, short.requests.slice(0, 4).map((q) => q[0]!.text))]);
        let diff = 0;
        pv.forEach((row, i) => row.forEach((v, j) => (diff = Math.max(diff, Math.abs(v - sv[i]![j]!)))));
        progress.log(`${m.name}: transformers.js vectors equal slabserve's within ${diff.toExponential(1)}`);
        const sides = [ours, peer];
        const shapes = first ? [PEER_CLIENTS, 1] : [PEER_CLIENTS];
        for (const clients of shapes) {
          const res = await ab((s, k) => load(meta('peer', 'short', sides[s]!.label, 'http', k, clients), sides[s]!, short, { kind: 'closed', concurrency: clients }), 2);
          compare(
            {
              id: `peer/${m.name}/${clients}`,
              case: 'peer',
              question: clients === 1 ? 'Latency of a lone client against transformers.js (P50)' : 'Throughput against transformers.js pipelines',
              model: m.name,
              workload: 'short',
              transport: 'http',
              metric: clients === 1 ? 'p50' : 'rps',
              note: `${clients} client${clients > 1 ? 's' : ''}; vectors equal within ${diff.toExponential(1)}`,
            },
            { label: 'slabserve', phases: res[0]! },
            { label: 'transformers.js', phases: res[1]! },
            (p) => (clients === 1 ? p.latencyMs.p50 : p.rps),
          );
        }
      } finally {
        await ours.stop();
        await peer.stop();
      }
    }
  }

  // ---- the floor: the gateway's CPU per request against a server doing only its unavoidable work
  let floor: FloorRow[] | undefined;
  if (CASES.has('floor')) {
    const m = models[0]!;
    progress.log(`${m.name}: the floor (bench/floor.ts), ${ROUNDS} round${ROUNDS > 1 ? 's' : ''}`);
    const floorPhases = await runFloorCase({
      cliPath: CLI,
      modelsDir: m.dir,
      model: m.name,
      rounds: ROUNDS,
      warmupMs: WARMUP_MS,
      durationMs: DURATION_MS,
      clients: [1, 64],
      transports: ['http', 'ws'],
      forms: ['text', 'ids'],
      seed: SEED,
      onPhase: (line) => progress.log(line),
    });
    floor = floorRows(floorPhases);
    for (const form of ['text', 'ids'] as const) {
      const gateway = (p: FloorPhase) => Object.entries(p.cpuUsPerRequest).reduce((a, [k, v]) => a + (k.startsWith('gateway') ? v : 0), 0);
      const pick = (side: FloorPhase['side']) => floorPhases.filter((p) => p.side === side && p.transport === 'http' && p.form === form && p.clients === 64);
      const [a, b] = [pick('slabserve'), pick('floor')];
      const roundRatios = a.map((p, i) => round(gateway(p) / (b[i]?.cpuUsPerRequest.main ?? NaN), 3));
      comparisons.push({
        id: `floor/${m.name}/${form}`,
        case: 'floor',
        question: `Gateway CPU per request against the floor (${form === 'ids' ? 'pre-tokenized' : 'texts'})`,
        model: m.name,
        workload: 'short',
        transport: 'http',
        metric: 'cpuUsPerRequest',
        a: { label: 'slabserve gateway thread', value: round(median(a.map(gateway)), 1) },
        b: { label: 'floor server', value: round(median(b.map((p) => p.cpuUsPerRequest.main ?? NaN)), 1) },
        ratio: round(median(roundRatios), 3),
        roundRatios,
        note: '64 HTTP keep-alive clients; lower is better',
      });
    }
  }
  progress.stop();

  // ---- results
  machine.loadAverageEnd = round(loadavg()[0]!, 2);
  const results: SuiteResults = {
    version: RESULTS_VERSION,
    startedAt: startedAt.toISOString(),
    finishedAt: new Date().toISOString(),
    durationS: round((performance.now() - t0) / 1000, 1),
    command: `npm run bench${process.argv.length > 2 ? ' -- ' + process.argv.slice(2).join(' ') : ''}`,
    mode: QUICK ? 'quick' : 'full',
    machine,
    settings: { seed: SEED, warmupS: WARMUP_MS / 1000, durationS: DURATION_MS / 1000, curvePointS: POINT_MS / 1000, rounds: ROUNDS, loadFractions: LOADS, models: MODELS, device: DEVICE },
    // the first model's tokenization (every model here shares the bert-base-uncased vocabulary)
    workloads: [...models[0]!.workloads.values()].map((w) => summarizeWorkload(w, models[0]!.spec.maxLength)),
    models: models.map((m) => modelInfo(m)),
    phases,
    comparisons,
    curves,
    ...(args['gpu-results'] ? { gpu: readGpuResults(resolve(args['gpu-results'])) } : {}),
    ...(floor ? { floor } : {}),
  };
  const day = startedAt.toISOString().slice(0, 10);
  const out = resolve(args.out ?? join(repoRoot, 'bench', 'results', `${day}-${hostname()}`));
  mkdirSync(out, { recursive: true });
  writeFileSync(join(out, 'results.json'), JSON.stringify(results, null, 1));
  const { files } = await renderReport(results, out);
  process.stdout.write('\n' + summaryTable(results) + '\n\n');
  process.stdout.write(`${phases.length} phases in ${results.durationS} s; results, report and ${files.filter((f) => f.endsWith('.svg')).length} plots in ${out}\n`);
}

function modelInfo(m: ModelSetup): ModelInfo {
  const config = JSON.parse(readFileSync(join(m.dir, m.name, 'config.json'), 'utf8')) as Record<string, number>;
  return {
    name: m.name,
    layers: config.num_hidden_layers ?? 0,
    hidden: config.hidden_size ?? 0,
    heads: config.num_attention_heads ?? 0,
    parametersM: round(statSync(m.spec.onnxPath).size / 4 / 1e6, 1),
    maxLength: m.spec.maxLength,
  };
}

/** Seconds the run should take, for the progress bar (server start-ups estimated). */
function planSeconds(nModels: number): number {
  const phase = (WARMUP_MS + DURATION_MS) / 1000;
  const point = (WARMUP_MS + POINT_MS) / 1000;
  let s = 0;
  if (CASES.has('batching')) s += ROUNDS * 2 * 4 * phase + 6;
  if (CASES.has('efficiency')) s += RAW_BATCH_SIZES.length * phase;
  if (CASES.has('bucketing')) s += ROUNDS * 3 * phase + 9;
  if (CASES.has('curve')) s += (QUICK ? 2 : 3) * ((LOADS.length + (QUICK ? 0 : 1)) * point + 3);
  if (CASES.has('peer')) s += ROUNDS * 2 * 2 * phase + 8;
  if (CASES.has('floor')) s += ROUNDS * 16 * phase + 6;
  s += (nModels - 1) * (ROUNDS * 2 * phase + RAW_BATCH_SIZES.length * phase + ROUNDS * 2 * phase + 40);
  return s;
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    process.stderr.write(`bench failed: ${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  },
);
