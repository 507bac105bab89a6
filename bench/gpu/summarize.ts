/**
 * summary.md and summary.json from what bench/gpu/run.sh leaves in its detail
 * folder: cases.tsv, env.txt, card.csv, device-check.json, samples.csv,
 * raw-M.json (raw-ceiling.ts), batching-M/results.json (the suite's batching
 * case) and batching-M.log. Every input is optional: what is missing is said,
 * not guessed.
 *
 *   node dist/bench/gpu/summarize.js --dir OUT/detail --out OUT/summary.md [--device cuda] [--failed "why"]
 */
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fail, parseOptions } from '../args.js';
import { groupConfigs } from '../report-charts.js';
import { comparisonLine, table } from '../report.js';
import { median } from '../suite/phases.js';
import type { Comparison, MachineInfo, PhaseResult, SuiteResults } from '../suite-results.js';
import { fmt } from '../table.js';

const o = parseOptions('node dist/bench/gpu/summarize.js --dir DETAIL --out summary.md [options]', {
  dir: { type: 'string', value: 'DIR', help: "run.sh's detail folder (required)" },
  out: { type: 'string', value: 'PATH', help: 'summary.md to write, summary.json beside it (required)' },
  device: { type: 'string', value: 'D', help: 'the device the cases ran on' },
  failed: { type: 'string', value: 'WHY', help: 'why the run stopped early' },
});
if (!o.dir || !o.out) fail('--dir and --out are required');
const dir = o.dir;

const read = (f: string) => (existsSync(join(dir, f)) ? readFileSync(join(dir, f), 'utf8') : '');
function json<T>(f: string): T | null {
  try {
    return JSON.parse(read(f)) as T;
  } catch {
    return null;
  }
}
/** A tab- or comma-separated file's lines after its header, split. */
const records = (f: string, sep: string) => read(f).trim().split('\n').slice(1).filter(Boolean).map((l) => l.split(sep));
const finiteMedian = (xs: number[]) => median(xs.filter(Number.isFinite));
const maxOf = (xs: number[]) => (xs.length ? Math.max(...xs) : NaN);

// ---------------------------------------------------------------- the machine and the cases

const env = Object.fromEntries([...read('env.txt').matchAll(/^([^:\n]+): (.*)$/gm)].map((m) => [m[1]!, m[2]!]));
const card = records('card.csv', ',')[0]?.map((s) => s.trim()) ?? null; // name, memory.total, driver
interface RawCeiling {
  model: string;
  layers: number | null;
  hidden: number;
  device: string;
  machine?: MachineInfo;
  sessionCreateMs: number;
  durationS?: number;
  gpuMemMiB?: number | null;
  check?: { firstRunMs: number; secondRunMs: number; gpuMemMiB: number | null };
  points?: { T: number; B: number; skipped?: string; seqPerSec: number; msPerBatchP50: number; tokensPerSec: number }[];
}
const check = json<RawCeiling>('device-check.json');
const device = o.device ?? check?.device ?? 'unknown';
const onGpu = device.startsWith('cuda');

const cases = records('cases.tsv', '\t').map(([name, kind, model, start, end, rc, status]) => ({ name: name!, kind, model, start: Number(start), end: Number(end), rc: rc!, status: status! }));
const samples = records('samples.csv', ',')
  .map(([t, source, used, total, util, power]) => ({ t: Number(t), source, used: Number(used), total: Number(total), util: util ? Number(util) : NaN, power: power ? Number(power) : NaN }))
  .filter((s) => Number.isFinite(s.t) && Number.isFinite(s.used));

/** Memory before a case and its peak while it ran, mean utilization, peak power (from samples.csv). */
function memStats(a: number, b: number) {
  const w = samples.filter((s) => s.t >= a && s.t <= b);
  if (w.length === 0) return null;
  const utils = w.map((s) => s.util).filter(Number.isFinite);
  return { before: samples.filter((s) => s.t < a).at(-1)?.used ?? NaN, peak: maxOf(w.map((s) => s.used)), util: utils.reduce((x, y) => x + y, 0) / utils.length, power: maxOf(w.map((s) => s.power).filter(Number.isFinite)) };
}

const out: string[] = [];
out.push(`# ${onGpu ? `slabserve GPU bench: ${card?.[0] ?? 'CUDA device'}` : 'slabserve GPU bench, run on the CPU'}${o.failed ? ' (FAILED)' : ''}`, '');
const when = cases[0] ? new Date(cases[0].start * 1000).toISOString().replace(/\.\d+Z$/, 'Z') : new Date().toISOString();
const host = check?.machine;
out.push(
  `${when}; device **${device}**${card ? ` (${card[0]}, ${card[1]}, driver ${card[2]})` : ''}; host ${host ? `${host.cpu} x${host.cores}, ${host.memoryGiB} GiB` : '?'}; ${env.node ?? 'node ?'}; ` +
    `onnxruntime-node ${host?.onnxruntime ?? env['meta onnxruntime-node'] ?? '?'}; bundle ${env.bundle ?? '?'} ` +
    `(git ${(env['meta git'] ?? '?').replace(/ (\d+)$/, ' + $1 modified files')}, build ${env['meta build'] ?? '?'}, made ${env['meta created'] ?? '?'}).`,
  '',
);
if (!onGpu) out.push('**Not a GPU run**: the same cases on the CPU (with `--dry-run`: short phases, for checking the plumbing; the numbers mean little).', '');
if (o.failed) out.push(`**FAILED**: ${o.failed}`, '');

if (cases.length) {
  const source = samples[0]?.source === 'host' ? 'host' : 'GPU';
  const rows = cases.map((c) => {
    const m = c.end > c.start ? memStats(c.start, c.end) : null;
    return [c.name, c.status + (c.rc !== '' && c.status !== 'ok' ? ` (exit ${c.rc})` : ''), fmt(c.end - c.start, 0), m ? `${fmt(m.before, 0)} → ${fmt(m.peak, 0)}` : '-', fmt(m?.util, 0), fmt(m?.power, 0)];
  });
  out.push('## Cases', '', table(['case', 'status', 'seconds', `${source} memory MiB: before → peak`, 'mean GPU util %', 'peak power W'], rows, ['l', 'l', 'r', 'r', 'r', 'r']), '');
  if (samples.length) out.push(`${samples.length} samples (${samples[0]!.source}) over ${fmt(samples.at(-1)!.t - samples[0]!.t, 0)} s; peak ${fmt(maxOf(samples.map((s) => s.used)), 0)} MiB of ${fmt(samples[0]!.total, 0)} MiB.`, '');
  else out.push('(no memory samples)', '');
}
if (check?.check) {
  const mem = check.check.gpuMemMiB !== null ? `; one session held ${check.check.gpuMemMiB} MiB of GPU memory` : '';
  out.push(`Device check (${check.model}): session opened in ${fmt(check.sessionCreateMs, 0)} ms, first run ${fmt(check.check.firstRunMs, 1)} ms, second ${fmt(check.check.secondRunMs, 2)} ms${mem}.`, '');
}

// ---------------------------------------------------------------- raw ceiling

const files = existsSync(dir) ? readdirSync(dir) : [];
const raws = files.filter((f) => /^raw-.*\.json$/.test(f)).flatMap((f) => json<RawCeiling>(f) ?? []);
/** The raw ceiling the engine is held against: T=32 (two thirds of the short workload), B=32 (the engine's default maxBatchSize). */
const ceilingOf = (model: string) => raws.find((r) => r.model === model)?.points?.find((p) => p.T === 32 && p.B === 32 && !p.skipped);
if (raws.length) {
  out.push(`## Raw onnxruntime on ${device} (raw-ceiling.ts)`, '');
  out.push("One session on the model as the server prepares it, the runner's options, closed loop of `session.run` on B sequences of T tokens, every token real; CPU tensors in and out (as the engine passes them). Cell: sequences/s (ms per batch, P50).", '');
  for (const r of raws) {
    const points = r.points ?? [];
    const Bs = [...new Set(points.map((p) => p.B))].sort((a, b) => a - b);
    const Ts = [...new Set(points.map((p) => p.T))].sort((a, b) => a - b);
    const mem = r.gpuMemMiB != null ? `; this process held ${r.gpuMemMiB} MiB of GPU memory at the end` : '';
    out.push(`**${r.model}** (${r.layers} layers x ${r.hidden}; session ${fmt(r.sessionCreateMs, 0)} ms; ${r.durationS} s per point${mem})`, '');
    const cellOf = (T: number, B: number) => {
      const p = points.find((x) => x.T === T && x.B === B);
      return !p ? '' : p.skipped ? 'skipped' : `${fmt(p.seqPerSec, 0)} (${fmt(p.msPerBatchP50, p.msPerBatchP50 < 10 ? 2 : 1)})`;
    };
    out.push(table(['T \\ B', ...Bs.map(String)], Ts.map((T) => [String(T), ...Bs.map((B) => cellOf(T, B))]), ['l', ...Bs.map(() => 'r' as const)]), '');
    const best = points.filter((p) => !p.skipped).sort((a, b) => b.tokensPerSec - a.tokensPerSec)[0];
    if (best) out.push(`Most tokens/s: ${best.tokensPerSec} at T=${best.T}, B=${best.B} (${fmt(best.seqPerSec, 0)} seq/s).`, '');
  }
}

// ---------------------------------------------------------------- batching: one suite run per model

/** One row per configuration measured (target, transport, workload, callers): the median of its rounds. */
function rowsOf(phases: PhaseResult[]) {
  return groupConfigs(phases).map((ps) => {
    const m = (f: (p: PhaseResult) => number | undefined) => finiteMedian(ps.map((p) => f(p) ?? NaN));
    const perBatch = (p: PhaseResult, x: number) => (p.server?.batches ? (x * p.windowS * 1000) / p.server.batches : NaN);
    const { target, transport, workload, concurrency, generator } = ps[0]!;
    const r = { target, transport, workload, concurrency: concurrency ?? 0, generator, rps: m((p) => p.rps), inputsPerS: m((p) => p.inputsPerS), p50Ms: m((p) => p.latencyMs.p50), p99Ms: m((p) => p.latencyMs.p99) };
    return {
      ...r,
      meanBatch: m((p) => p.server?.meanBatch),
      msPerBatch: m((p) => perBatch(p, 1)),
      ortMsPerBatch: m((p) => perBatch(p, p.server?.deviceBusy ?? NaN)),
      cpuUsPerRequest: m((p) => (p.cpuMsPerRequest ?? NaN) * 1000),
      cores: m((p) => ((p.cpuMsPerRequest ?? NaN) * p.rps) / 1000),
      clientUsPerRequest: m((p) => (p.clientCpuMsPerRequest ?? NaN) * 1000),
      failed: ps.reduce((a, p) => a + p.errors + p.rejected, 0),
    };
  });
}
type Row = ReturnType<typeof rowsOf>[number];
const shapeOf = (r: Row) => (r.transport === 'ws' ? `1 socket x ${r.concurrency} in flight` : r.workload === 'client-batch' ? `${r.concurrency} clients x 16 texts` : `${r.concurrency} client${r.concurrency === 1 ? '' : 's'}`);
const isEngine = (c: Comparison) => c.transport === 'in-process' || c.id.endsWith('/http-vs-engine');
const perModel = files
  .filter((f) => /^batching-/.test(f))
  .flatMap((f) => {
    const results = json<SuiteResults>(join(f, 'results.json'));
    if (!Array.isArray(results?.phases)) return [];
    // the suite's checks before timing, as its log has them
    const log = read(`${f}.log`);
    const checks = (re: RegExp) => [...log.matchAll(re)].map((x) => `${x[1]} ${x[2]}`);
    return [{
      model: f.slice('batching-'.length),
      settings: results.settings,
      rows: rowsOf(results.phases),
      comparisons: results.comparisons,
      raw: checks(/^\S+: (.+?) vectors equal raw onnxruntime within (\S+)$/gm),
      ws: checks(/^\S+: (.+?) \/ws f32 rows equal its POST \/embed vectors within (\S+)$/gm),
    }];
  });

if (perModel.length) {
  const st = perModel[0]!.settings;
  const how = `${st.rounds} round(s) of ${st.durationS} s after ${st.warmupS} s of warm-up, sides alternating round by round, median round shown`;
  out.push('## Engine in process (bench/suite.js --cases batching)', '');
  out.push(
    `64 in-process callers of \`engine.embed(text)\` (tokenizing included) on the suite's short workload (one text of 8–32 tokens per request); ${how}. ` +
      "`vs ceiling`: seq/s over raw-ceiling.ts at T=32, B=32 on the same device (the engine's largest batch in the workload's main bucket). " +
      "`ms/batch`: the window over its batches (the time from one batch to the next); `ORT ms/batch`: `session.run`'s mean time per batch (above `ms/batch` where batches overlap, several in flight). `host cores`: the bench process (callers and engine threads).",
    '',
  );
  const engineRows = perModel.flatMap(({ model, rows }) => {
    const ceiling = ceilingOf(model);
    return rows.filter((r) => r.transport === 'in-process').map((r) => [model, r.target, fmt(r.rps, 0), fmt(r.p50Ms, 2), fmt(r.p99Ms, 2), fmt(r.meanBatch, 1), fmt(r.msPerBatch, 2), fmt(r.ortMsPerBatch, 2), fmt(r.cores, 2), ceiling ? `${fmt(r.rps / ceiling.seqPerSec, 2)}x` : '']);
  });
  out.push(table(['model', 'config', 'seq/s', 'P50 ms', 'P99 ms', 'mean batch', 'ms/batch', 'ORT ms/batch', 'host cores', 'vs ceiling'], engineRows, ['l', 'l', ...Array<'r'>(8).fill('r')]), '');
  for (const { model, comparisons } of perModel) for (const c of comparisons.filter(isEngine)) out.push(`- ${model}: ${comparisonLine(c).slice(2)}`);
  out.push('', '## HTTP and WebSocket (bench/suite.js --cases batching)', '');
  const gens = [...new Set(perModel.flatMap((m) => m.rows.map((r) => r.generator)).filter(Boolean))];
  out.push(`\`slabserve serve\` in child processes on the same device, with its defaults (batched) and with \`--max-batch-size 1\`, driven over loopback (load from ${gens.join(', ') || '?'}); the server tokenizes. ${how}.`, '');
  const httpRows = perModel.flatMap(({ model, rows }) =>
    rows.filter((r) => r.transport !== 'in-process').map((r) => [model, r.transport === 'ws' ? 'WebSocket' : 'HTTP', shapeOf(r), r.target, fmt(r.rps, 0), fmt(r.inputsPerS, 0), fmt(r.p50Ms, 2), fmt(r.p99Ms, 2), fmt(r.meanBatch, 1), fmt(r.cores, 2), fmt(r.cpuUsPerRequest, 0), fmt(r.clientUsPerRequest, 0)]),
  );
  out.push(table(['model', 'transport', 'load', 'config', 'req/s', 'inputs/s', 'P50 ms', 'P99 ms', 'mean batch', 'server cores', 'server CPU us/req', 'client CPU us/req'], httpRows, ['l', 'l', 'l', 'l', ...Array<'r'>(8).fill('r')]), '');
  for (const { model, comparisons, raw, ws } of perModel) {
    for (const c of comparisons.filter((x) => !isEngine(x))) out.push(`- ${model}: ${comparisonLine(c).slice(2)}`);
    if (raw.length) out.push(`- ${model} checks before timing: vectors equal raw onnxruntime's (a CPU session) within: ${raw.join(', ')}` + (ws.length ? `; /ws f32 rows equal POST /embed within: ${ws.join(', ')}` : ''));
    else out.push(`- ${model}: no check line in the case's log`);
  }
  const failed = perModel.flatMap((m) => m.rows.filter((r) => r.failed > 0).map((r) => `${m.model} ${r.target} ${r.transport} ${shapeOf(r)}: ${r.failed}`));
  if (failed.length) out.push(`- requests refused or failed: ${failed.join('; ')}`);
  out.push('');
}

const missing = cases.filter((c) => c.status !== 'ok').map((c) => `${c.name} (${c.status})`);
if (missing.length) out.push(`Cases without results: ${missing.join(', ')}; see their logs in results.tar.gz.`, '');
out.push("Files: results.tar.gz holds detail/ (every case's log and JSON, cases.tsv, samples.csv, env.txt, card.csv, ldd-provider.txt, device-check.*).", '');

writeFileSync(o.out, out.join('\n'));
const batching = Object.fromEntries(perModel.map(({ model, ...rest }) => [model, rest]));
writeFileSync(o.out.replace(/\.md$/, '') + '.json', JSON.stringify({ device, card, env, cases, raws, batching }, null, 2) + '\n');
