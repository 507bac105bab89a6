#!/usr/bin/env node
// Turns the files run.sh leaves in its detail folder into summary.md (and summary.json).
//
//   node bench/gpu/summarize.mjs --dir OUT/detail --out OUT/summary.md [--device cuda] [--failed "why"]
//
// Reads: cases.tsv, env.txt, card.csv, device-check.json, samples.csv, raw-*.json
// (raw-ceiling.mjs), engine-*.json and http-*.json (bench/quick.js --json). Every input
// is optional: what is missing is said, not guessed. Plain Node, no dependencies.
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
const engines = files.filter((f) => /^engine-.*\.json$/.test(f)).map((f) => [f.slice(7, -5), json(f)]).filter(([, j]) => j);
const https = files.filter((f) => /^http-.*\.json$/.test(f)).map((f) => [f.slice(5, -5), json(f)]).filter(([, j]) => j);
const rawOf = (model) => raws.find((r) => r.model === model) ?? null;
/** The raw ceiling the engine is held against: T=32 (66% of quick's workload), B=32 (the engine's default maxBatchSize). */
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

// engine
const rowOf = (j, name) => j?.reported?.[name] ?? null;
if (engines.length) {
  out.push('## Engine (bench/quick.js --skip-http --skip-extra)', '');
  const o = engines[0][1].options ?? {};
  out.push(
    `${o.concurrency ?? '?'} closed-loop callers, one sequence per request (quick's text workload, 8–32 tokens); ${o.rounds ?? '?'} rounds of ${o.durationS ?? '?'} s, ${o.report ?? 'median'} round shown. ` +
      '`vs ceiling`: seq/s over raw-ceiling.mjs at T=32, B=32 on the same device (the engine\'s largest batch in the workload\'s main bucket). ' +
      "quick's own `raw b=N` rows open CPU sessions whatever `--device` says: on a GPU they are a CPU baseline.",
    '',
  );
  const rows = [];
  for (const [model, j] of engines) {
    const ceiling = ceilingOf(model);
    for (const name of ['engine batched', 'engine maxBatchSize=1', 'raw b=1', 'raw b=8', 'raw b=32']) {
      const r = rowOf(j, name);
      if (!r) continue;
      const isRaw = name.startsWith('raw');
      rows.push([
        model,
        isRaw ? `${name} (CPU session)` : name,
        fmt(r.seqPerSec),
        fmt(r.p50Ms, 2),
        fmt(r.p99Ms, 2),
        fmt(r.meanBatch, 1),
        fmt(r.msPerBatch, 2),
        r.ortMsPerBatch === null ? '–' : fmt(r.ortMsPerBatch, 2),
        fmt(r.cores, 2),
        !isRaw && ceiling ? `${fmt(r.seqPerSec / ceiling.seqPerSec, 2)}x` : '',
      ]);
    }
  }
  out.push(table(['model', 'config', 'seq/s', 'P50 ms', 'P99 ms', 'mean batch', 'ms/batch', 'ORT ms/batch', 'host cores', 'vs ceiling'], rows, 2), '');
  for (const [model, j] of engines) {
    const g = j.derived?.batchingGain;
    const c = ceilingOf(model);
    out.push(
      `- ${model}: batching gain (engine batched / maxBatchSize=1) **${fmt(g, 2)}x**` +
        (c ? `; engine batched at ${fmt(rowOf(j, 'engine batched')?.seqPerSec / c.seqPerSec, 2)}x the raw ceiling (${fmt(c.seqPerSec)} seq/s)` : '') +
        `; set-up: engines ${fmt((j.setup?.engineStartMs ?? NaN) / 1000, 1)} s each.`,
    );
  }
  out.push('');
}

// http
if (https.length) {
  out.push('## HTTP and WebSocket (bench/quick.js --http-only)', '');
  out.push('`slabserve serve` in a child process on the same device, driven over loopback; the server tokenizes. Rows as quick.js names them.', '');
  const rows = [];
  for (const [model, j] of https) {
    for (const [name, r] of Object.entries(j.reported ?? {})) {
      if (r.kind !== 'http' && r.kind !== 'ws') continue;
      rows.push([
        model,
        name,
        fmt(r.seqPerSec),
        fmt(r.p50Ms, 2),
        fmt(r.p99Ms, 2),
        fmt(r.meanBatch, 1),
        fmt(r.cores, 2),
        fmt(r.cpuUsPerSeq),
        r.client ? fmt(r.client.cores, 2) : '–',
      ]);
    }
  }
  out.push(table(['model', 'config', 'req/s', 'P50 ms', 'P99 ms', 'mean batch', 'server cores', 'server CPU us/req', 'client cores'], rows, 2), '');
  for (const [model, j] of https) {
    const d = j.derived?.http ?? {};
    const parts = Object.entries(d).map(
      ([k, v]) => `${k.replace(/^c/, '')} client(s): batching gain ${fmt(v?.batchingGain ?? NaN, 2)}x` + (v?.vsEngine !== undefined ? `, HTTP/engine ${fmt(v.vsEngine, 2)}x` : ''),
    );
    if (parts.length) out.push(`- ${model}: ${parts.join('; ')}`);
    const checks = j.setup?.serverChecks;
    if (checks) out.push(`- ${model} checks: ${Object.entries(checks).map(([k, v]) => `${k}: ${v}`).join('; ')}`);
  }
  out.push('');
}

const missing = cases.filter((c) => c.status !== 'ok').map((c) => `${c.name} (${c.status})`);
if (missing.length) out.push(`Cases without results: ${missing.join(', ')}; see their logs in results.tar.gz.`, '');
out.push('Files: results.tar.gz holds detail/ (every case\'s log and JSON, cases.tsv, samples.csv, env.txt, card.csv, ldd-provider.txt, device-check.*).', '');

const md = out.join('\n');
writeFileSync(args.out, md);
writeFileSync(args.out.replace(/\.md$/, '') + '.json', JSON.stringify({ device, card, env, cases, raws, engines: Object.fromEntries(engines.map(([m, j]) => [m, { reported: j.reported, derived: j.derived }])), http: Object.fromEntries(https.map(([m, j]) => [m, { reported: j.reported, derived: j.derived }])) }, null, 2) + '\n');
