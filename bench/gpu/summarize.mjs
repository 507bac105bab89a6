#!/usr/bin/env node
// Turns the files run.sh leaves in its detail folder into summary.md (and summary.json).
//
//   node bench/gpu/summarize.mjs --dir OUT/detail --out OUT/summary.md [--device cuda] [--failed "why"]
//
// Reads: cases.tsv, env.txt, card.csv, device-check.json, samples.csv, raw-*.json
// (raw-ceiling.mjs), batching-*/results.json (bench/suite.js --cases batching; the format
// is bench/suite-results.ts) and batching-*.log. Every input is optional: what is missing
// is said, not guessed. Plain Node, no dependencies.
import { existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

const { values: args } = parseArgs({ options: { dir: { type: 'string' }, out: { type: 'string' }, failed: { type: 'string' }, device: { type: 'string' } } });
if (!args.dir || !args.out) {
  console.error('usage: summarize.mjs --dir DETAIL --out summary.md [--device D] [--failed MESSAGE]');
  process.exit(2);
}
const dir = args.dir;
const read = (f) => (existsSync(join(dir, f)) ? readFileSync(join(dir, f), 'utf8') : null);
const json = (f) => {
  const t = read(f);
  if (t === null) return null;
  try {
    return JSON.parse(t);
  } catch {
    return null;
  }
};
const fmt = (x, d = 0) => (x === null || x === undefined || !Number.isFinite(x) ? '–' : x.toFixed(d));
const table = (headers, rows, left = 1) => {
  const line = (cells) => `| ${cells.join(' | ')} |`;
  return [line(headers), `|${headers.map((_, i) => (i < left ? '---' : '--:')).join('|')}|`, ...rows.map(line)].join('\n');
};

// ---- environment
const env = Object.fromEntries(
  (read('env.txt') ?? '')
    .split('\n')
    .map((l) => /^([^:]+): (.*)$/.exec(l))
    .filter(Boolean)
    .map((m) => [m[1], m[2]]),
);
const cardLines = (read('card.csv') ?? '').trim().split('\n');
const card = cardLines.length > 1 ? cardLines[1].split(',').map((s) => s.trim()) : null; // name, memory.total, driver
const check = json('device-check.json');
const device = args.device ?? check?.device ?? 'unknown';
const onGpu = device.startsWith('cuda');

// ---- cases and samples
const cases = (read('cases.tsv') ?? '')
  .trim()
  .split('\n')
  .slice(1)
  .filter(Boolean)
  .map((l) => {
    const [name, kind, model, start, end, rc, status, limit] = l.split('\t');
    return { name, kind, model, start: Number(start), end: Number(end), rc, status, limit: Number(limit) };
  });
const samples = (read('samples.csv') ?? '')
  .trim()
  .split('\n')
  .slice(1)
  .filter(Boolean)
  .map((l) => {
    const [t, source, used, total, util, power] = l.split(',');
    return { t: Number(t), source, used: Number(used), total: Number(total), util: util === '' ? null : Number(util), power: power === '' ? null : Number(power) };
  })
  .filter((s) => Number.isFinite(s.t) && Number.isFinite(s.used));
const sampleSource = samples[0]?.source ?? null;
const within = (a, b) => samples.filter((s) => s.t >= a && s.t <= b);
const memStats = (a, b) => {
  const before = samples.filter((s) => s.t < a).at(-1) ?? null;
  const w = within(a, b);
  if (w.length === 0) return null;
  const utils = w.map((s) => s.util).filter((u) => u !== null && Number.isFinite(u));
  return {
    samples: w.length,
    beforeMiB: before?.used ?? null,
    peakMiB: Math.max(...w.map((s) => s.used)),
    meanUtilPct: utils.length ? utils.reduce((x, y) => x + y, 0) / utils.length : null,
    peakPowerW: w.some((s) => s.power !== null && Number.isFinite(s.power)) ? Math.max(...w.map((s) => s.power ?? 0)) : null,
  };
};

// ---- per-case results
const files = existsSync(dir) ? readdirSync(dir) : [];
const raws = files.filter((f) => /^raw-.*\.json$/.test(f)).map((f) => json(f)).filter(Boolean);
const rawOf = (model) => raws.find((r) => r.model === model) ?? null;
/** The raw ceiling the engine is held against: T=32 (two thirds of the short workload), B=32 (the engine's default maxBatchSize). */
const ceilingOf = (model) => rawOf(model)?.points.find((p) => p.T === 32 && p.B === 32 && !p.skipped) ?? null;

const out = [];
const title = (onGpu ? `slabserve GPU bench: ${card?.[0] ?? 'CUDA device'}` : 'slabserve GPU bench, run on the CPU') + (args.failed ? ' (FAILED)' : '');
out.push(`# ${title}`, '');
const when = cases[0] ? new Date(cases[0].start * 1000).toISOString().replace(/\.\d+Z$/, 'Z') : new Date().toISOString();
out.push(
  `${when}; device **${device}**${card ? ` (${card[0]}, ${card[1]}, driver ${card[2]})` : ''}; host ${env.cpu ?? '?'}, ${env.memory ?? '?'}; ` +
    `${env.node ?? 'node ?'}; onnxruntime-node ${check?.onnxruntime ?? env['meta onnxruntime-node'] ?? '?'}; bundle ${env.bundle ?? '?'} ` +
    `(git ${(env['meta git'] ?? '?').replace(/ (\d+)$/, ' + $1 modified files')}, build ${env['meta build'] ?? '?'}, made ${env['meta created'] ?? '?'}).`,
  '',
);
if (!onGpu) out.push('**Not a GPU run**: the same cases on the CPU (with `--dry-run`: short phases, for checking the plumbing; the numbers mean little).', '');
if (args.failed) out.push(`**FAILED**: ${args.failed}`, '');

// cases
if (cases.length) {
  const memHead = sampleSource === 'host' ? 'host memory MiB: before → peak' : 'GPU memory MiB: before → peak';
  out.push('## Cases', '');
  out.push(
    table(
      ['case', 'status', 'seconds', memHead, 'mean GPU util %', 'peak power W'],
      cases.map((c) => {
        const m = Number.isFinite(c.start) && c.end > c.start ? memStats(c.start, c.end) : null;
        return [
          c.name,
          c.status + (c.rc !== '' && c.status !== 'ok' ? ` (exit ${c.rc})` : ''),
          fmt(c.end - c.start),
          m ? `${fmt(m.beforeMiB)} → ${fmt(m.peakMiB)}` : '–',
          m?.meanUtilPct !== null && m?.meanUtilPct !== undefined ? fmt(m.meanUtilPct) : '–',
          m?.peakPowerW !== null && m?.peakPowerW !== undefined ? fmt(m.peakPowerW) : '–',
        ];
      }),
      2,
    ),
    '',
  );
  if (!samples.length) out.push('(no memory samples)', '');
  else out.push(`${samples.length} samples (${sampleSource}) over ${fmt(samples.at(-1).t - samples[0].t)} s; peak ${fmt(Math.max(...samples.map((s) => s.used)))} MiB of ${fmt(samples[0].total)} MiB.`, '');
}

if (check?.check) {
  out.push(
    `Device check (${check.model}): session opened in ${fmt(check.sessionCreateMs)} ms, first run ${fmt(check.check.firstRunMs, 1)} ms, second ${fmt(check.check.secondRunMs, 2)} ms` +
      `${check.check.gpuMemMiB !== null ? `; one session held ${check.check.gpuMemMiB} MiB of GPU memory` : ''}.`,
    '',
  );
}

// raw ceiling
if (raws.length) {
  out.push(`## Raw onnxruntime on ${device} (raw-ceiling.mjs)`, '');
  out.push(
    'One `InferenceSession` on the model as the server prepares it, the runner\'s options, closed loop of `session.run` on B sequences of T tokens, every token real; ' +
      'CPU tensors in and out (as the engine passes them). Cell: sequences/s (ms per batch, P50).',
    '',
  );
  for (const r of raws) {
    const Bs = [...new Set(r.points.map((p) => p.B))].sort((a, b) => a - b);
    const Ts = [...new Set(r.points.map((p) => p.T))].sort((a, b) => a - b);
    out.push(`**${r.model}** (${r.layers} layers x ${r.hidden}; session ${fmt(r.sessionCreateMs)} ms; ${r.durationS} s per point${r.gpuMemMiB !== null && r.gpuMemMiB !== undefined ? `; this process held ${r.gpuMemMiB} MiB of GPU memory at the end` : ''})`, '');
    out.push(
      table(
        ['T \\ B', ...Bs.map(String)],
        Ts.map((T) => [
          String(T),
          ...Bs.map((B) => {
            const p = r.points.find((x) => x.T === T && x.B === B);
            if (!p) return '';
            if (p.skipped) return 'skipped';
            return `${fmt(p.seqPerSec)} (${fmt(p.msPerBatchP50, p.msPerBatchP50 < 10 ? 2 : 1)})`;
          }),
        ]),
      ),
      '',
    );
    const best = r.points.filter((p) => !p.skipped).sort((a, b) => b.tokensPerSec - a.tokensPerSec)[0];
    if (best) out.push(`Most tokens/s: ${fmt(best.tokensPerSec)} at T=${best.T}, B=${best.B} (${fmt(best.seqPerSec)} seq/s).`, '');
  }
}

// batching: one bench/suite.js --cases batching run per model, each in its own folder
const median = (xs) => {
  const v = xs.filter(Number.isFinite).sort((a, b) => a - b);
  if (!v.length) return NaN;
  return v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
};
const suites = files
  .filter((f) => /^batching-/.test(f))
  .map((f) => [f.slice('batching-'.length), json(join(f, 'results.json')), read(`${f}.log`) ?? ''])
  .filter(([, j]) => j && Array.isArray(j.phases));
/** One row per configuration measured (target, transport, workload, callers): the median of its rounds. */
function rowsOf(results) {
  const groups = new Map();
  for (const p of results.phases) {
    const k = [p.transport, p.workload, p.concurrency, p.target].join('|');
    if (!groups.has(k)) groups.set(k, []);
    groups.get(k).push(p);
  }
  return [...groups.values()].map((ps) => {
    const m = (f) => median(ps.map(f));
    const perBatch = (p, x) => (p.server?.batches ? (x * p.windowS * 1000) / p.server.batches : NaN);
    const { target, transport, workload, concurrency, generator } = ps[0];
    return {
      target,
      transport,
      workload,
      concurrency,
      generator,
      rounds: ps.length,
      rps: m((p) => p.rps),
      inputsPerS: m((p) => p.inputsPerS),
      p50Ms: m((p) => p.latencyMs?.p50),
      p99Ms: m((p) => p.latencyMs?.p99),
      meanBatch: m((p) => p.server?.meanBatch ?? NaN),
      msPerBatch: m((p) => perBatch(p, 1)),
      ortMsPerBatch: m((p) => perBatch(p, p.server?.deviceBusy ?? NaN)),
      cpuUsPerRequest: m((p) => (p.cpuMsPerRequest ?? NaN) * 1000),
      cores: m((p) => ((p.cpuMsPerRequest ?? NaN) * p.rps) / 1000),
      clientUsPerRequest: m((p) => (p.clientCpuMsPerRequest ?? NaN) * 1000),
      failed: ps.reduce((a, p) => a + p.errors + p.rejected, 0),
    };
  });
}
const shapeOf = (r) =>
  r.transport === 'ws' ? `1 socket x ${r.concurrency} in flight` : r.workload === 'client-batch' ? `${r.concurrency} clients x 16 texts` : `${r.concurrency} client${r.concurrency === 1 ? '' : 's'}`;
const UNITS = { rps: 'req/s', inputsPerS: 'inputs/s', tokensPerS: 'tokens/s', p50: 'ms P50', p99: 'ms P99' };
const compLine = (c) =>
  `${c.question} ${c.a.label} ${fmt(c.a.value, c.metric.startsWith('p') ? 2 : 0)} against ${c.b.label} ${fmt(c.b.value, c.metric.startsWith('p') ? 2 : 0)} ${UNITS[c.metric] ?? c.metric}: ` +
  `**${fmt(c.ratio, 2)}x** (by round ${c.roundRatios.map((x) => fmt(x, 2)).join(' ')})`;
const perModel = suites.map(([model, j, log]) => ({
  model,
  settings: j.settings ?? {},
  rows: rowsOf(j),
  comparisons: j.comparisons ?? [],
  // the suite's checks before timing, as its log has them
  raw: [...log.matchAll(/^\S+: (.+?) vectors equal raw onnxruntime within (\S+)$/gm)].map((x) => `${x[1]} ${x[2]}`),
  ws: [...log.matchAll(/^\S+: (.+?) \/ws f32 rows equal its POST \/embed vectors within (\S+)$/gm)].map((x) => `${x[1]} ${x[2]}`),
}));

if (perModel.length) {
  const st = perModel[0].settings;
  const how = `${st.rounds ?? '?'} round(s) of ${st.durationS ?? '?'} s after ${st.warmupS ?? '?'} s of warm-up, sides alternating round by round, median round shown`;
  out.push('## Engine in process (bench/suite.js --cases batching)', '');
  out.push(
    `64 in-process callers of \`engine.embed(text)\` (tokenizing included) on the suite's short workload (one text of 8–32 tokens per request); ${how}. ` +
      '`vs ceiling`: seq/s over raw-ceiling.mjs at T=32, B=32 on the same device (the engine\'s largest batch in the workload\'s main bucket). ' +
      '`ms/batch`: the window over its batches (the time from one batch to the next); `ORT ms/batch`: `session.run`\'s mean time per batch (above `ms/batch` where batches overlap, several in flight). `host cores`: the bench process (callers and engine threads).',
    '',
  );
  const rows = [];
  for (const { model, rows: rs } of perModel) {
    const ceiling = ceilingOf(model);
    for (const r of rs.filter((x) => x.transport === 'in-process')) {
      rows.push([model, r.target, fmt(r.rps), fmt(r.p50Ms, 2), fmt(r.p99Ms, 2), fmt(r.meanBatch, 1), fmt(r.msPerBatch, 2), fmt(r.ortMsPerBatch, 2), fmt(r.cores, 2), ceiling ? `${fmt(r.rps / ceiling.seqPerSec, 2)}x` : '']);
    }
  }
  out.push(table(['model', 'config', 'seq/s', 'P50 ms', 'P99 ms', 'mean batch', 'ms/batch', 'ORT ms/batch', 'host cores', 'vs ceiling'], rows, 2), '');
  for (const { model, comparisons } of perModel) {
    for (const c of comparisons.filter((x) => x.transport === 'in-process' || x.id.endsWith('/http-vs-engine'))) out.push(`- ${model}: ${compLine(c)}`);
  }
  out.push('');

  out.push('## HTTP and WebSocket (bench/suite.js --cases batching)', '');
  const gens = [...new Set(perModel.flatMap((m) => m.rows.map((r) => r.generator)).filter(Boolean))];
  out.push(
    `\`slabserve serve\` in child processes on the same device, with its defaults (batched) and with \`--max-batch-size 1\`, driven over loopback (load from ${gens.join(', ') || '?'}); the server tokenizes. ${how}.`,
    '',
  );
  const hrows = [];
  for (const { model, rows: rs } of perModel) {
    for (const r of rs.filter((x) => x.transport !== 'in-process')) {
      hrows.push([model, r.transport === 'ws' ? 'WebSocket' : 'HTTP', shapeOf(r), r.target, fmt(r.rps), fmt(r.inputsPerS), fmt(r.p50Ms, 2), fmt(r.p99Ms, 2), fmt(r.meanBatch, 1), fmt(r.cores, 2), fmt(r.cpuUsPerRequest), fmt(r.clientUsPerRequest)]);
    }
  }
  out.push(table(['model', 'transport', 'load', 'config', 'req/s', 'inputs/s', 'P50 ms', 'P99 ms', 'mean batch', 'server cores', 'server CPU us/req', 'client CPU us/req'], hrows, 4), '');
  for (const { model, comparisons, raw, ws } of perModel) {
    for (const c of comparisons.filter((x) => x.transport !== 'in-process' && !x.id.endsWith('/http-vs-engine'))) out.push(`- ${model}: ${compLine(c)}`);
    if (raw.length) out.push(`- ${model} checks before timing: vectors equal raw onnxruntime's (a CPU session) within: ${raw.join(', ')}` + (ws.length ? `; /ws f32 rows equal POST /embed within: ${ws.join(', ')}` : ''));
    else out.push(`- ${model}: no check line in the case's log`);
  }
  const failed = perModel.flatMap((m) => m.rows.filter((r) => r.failed > 0).map((r) => `${m.model} ${r.target} ${r.transport} ${shapeOf(r)}: ${r.failed}`));
  if (failed.length) out.push(`- requests refused or failed: ${failed.join('; ')}`);
  out.push('');
}

const missing = cases.filter((c) => c.status !== 'ok').map((c) => `${c.name} (${c.status})`);
if (missing.length) out.push(`Cases without results: ${missing.join(', ')}; see their logs in results.tar.gz.`, '');
out.push('Files: results.tar.gz holds detail/ (every case\'s log and JSON, cases.tsv, samples.csv, env.txt, card.csv, ldd-provider.txt, device-check.*).', '');

const md = out.join('\n');
writeFileSync(args.out, md);
writeFileSync(args.out.replace(/\.md$/, '') + '.json', JSON.stringify({ device, card, env, cases, raws, batching: Object.fromEntries(perModel.map(({ model, ...rest }) => [model, rest])) }, null, 2) + '\n');
