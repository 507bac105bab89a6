#!/usr/bin/env node
// The onnxruntime ceiling on a device: one InferenceSession on the model as the server
// prepares it (prepareModel: pooling appended), opened with the runner's options
// (src/gpu-worker/runner.ts: provider cuda with deviceId, or cpu; graph optimization
// 'all'), closed loop of session.run on padded batches of B sequences of T tokens, every
// token real. Inputs and outputs are CPU tensors, as the engine passes them, so the
// numbers include the host<->device copies the engine also pays.
//
// (The suite's efficiency case runs raw onnxruntime on its --device too, but only at
// B 1, 8, 32 on the workload's own lengths; this walks a B x T grid, to show where the
// device levels off.)
//
//   node bench/gpu/raw-ceiling.mjs --model-dir DIR --device cuda [--batches 1,8,32,64,128,256]
//        [--seq-lens 16,32,128] [--duration-s 1] [--warmup-runs 3] [--max-point-s 4] [--json PATH]
//   node bench/gpu/raw-ceiling.mjs --model-dir DIR --device cuda --check    # open, run once, report; exit 1 if it cannot
//
// slabserve's built dist/ and node_modules are found from --app (default: the
// SLABSERVE_APP variable, else this repository: two folders up).
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

const here = dirname(fileURLToPath(import.meta.url));
const { values: args } = parseArgs({
  options: {
    app: { type: 'string', default: process.env.SLABSERVE_APP ?? resolve(here, '..', '..') },
    'model-dir': { type: 'string' },
    device: { type: 'string', default: 'cpu' },
    batches: { type: 'string', default: '1,8,32,64,128,256' },
    'seq-lens': { type: 'string', default: '16,32,128' },
    'duration-s': { type: 'string', default: '1' },
    'warmup-runs': { type: 'string', default: '3' },
    'max-point-s': { type: 'string', default: '4' },
    'intra-op-threads': { type: 'string', default: '0' },
    check: { type: 'boolean', default: false },
    json: { type: 'string' },
    help: { type: 'boolean', short: 'h', default: false },
  },
});
if (args.help || !args['model-dir']) {
  console.log(`usage: node raw-ceiling.mjs --model-dir DIR [--device cpu|cuda|cuda:N] [--batches LIST] [--seq-lens LIST]
  [--duration-s S] [--warmup-runs N] [--max-point-s S] [--intra-op-threads N] [--check] [--json PATH] [--app DIR]`);
  process.exit(args.help ? 0 : 2);
}
const list = (s) => s.split(',').map((x) => Number(x.trim())).filter((x) => Number.isInteger(x) && x > 0);
const BATCHES = list(args.batches);
const SEQ_LENS = list(args['seq-lens']);
const DURATION_MS = Number(args['duration-s']) * 1000;
const WARMUP_RUNS = Number(args['warmup-runs']);
const MAX_POINT_MS = Number(args['max-point-s']) * 1000;
const m = /^(cpu|cuda)(?::(\d+))?$/.exec(args.device);
if (!m) {
  console.error(`--device: cpu, cuda or cuda:N, got ${args.device}`);
  process.exit(2);
}
const device = { kind: m[1], id: Number(m[2] ?? 0) };

const app = resolve(args.app);
const require = createRequire(join(app, 'package.json'));
const ort = require('onnxruntime-node');
const ortVersion = require('onnxruntime-node/package.json').version;
const { prepareModel } = await import(pathToFileURL(join(app, 'dist/src/gpu-worker/graph.js')).href);
const { loadModelSpec } = await import(pathToFileURL(join(app, 'dist/src/shared/model-format/model-config.js')).href);
const { keepOnnxruntimeTelemetryOff } = await import(pathToFileURL(join(app, 'dist/src/main/onnxruntime-telemetry.js')).href);
keepOnnxruntimeTelemetryOff(); // as the server does: before the first session

const modelDir = resolve(args['model-dir']);
const spec = loadModelSpec(modelDir, basename(modelDir));
const config = JSON.parse(readFileSync(join(modelDir, 'config.json'), 'utf8'));

/** This process's GPU memory from nvidia-smi (MiB), or null. */
function gpuMemMiB() {
  if (device.kind !== 'cuda') return null;
  try {
    const out = execFileSync(process.env.NVIDIA_SMI || 'nvidia-smi', ['--query-compute-apps=pid,used_memory', '--format=csv,noheader,nounits'], {
      encoding: 'utf8',
      timeout: 5000,
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    for (const line of out.split('\n')) {
      const [pid, mem] = line.split(',').map((s) => s.trim());
      if (Number(pid) === process.pid) return Number(mem);
    }
    return null;
  } catch {
    return null;
  }
}

const t0 = performance.now();
const prepared = prepareModel(readFileSync(spec.onnxPath), spec);
const providers = device.kind === 'cuda' ? [{ name: 'cuda', deviceId: device.id }] : ['cpu'];
let session;
try {
  session = await ort.InferenceSession.create(prepared.bytes, {
    executionProviders: providers,
    graphOptimizationLevel: 'all',
    intraOpNumThreads: Number(args['intra-op-threads']),
    logSeverityLevel: args.check ? 2 : 3,
  });
} catch (err) {
  console.error(`raw-ceiling: cannot open a ${args.device} session on ${spec.name}: ${err.message}`);
  process.exit(1);
}
const createMs = performance.now() - t0;
const fetches = prepared.outputs.map((o) => o.name);

function feeds(B, T, seed) {
  const n = B * T;
  const make = () => (prepared.inputType === 'int64' ? new BigInt64Array(n) : new Int32Array(n));
  const ids = make();
  const mask = make();
  const types = make();
  let s = seed >>> 0;
  const rnd = () => ((s = (s * 1664525 + 1013904223) >>> 0) / 2 ** 32);
  const put = (a, i, v) => (a[i] = prepared.inputType === 'int64' ? BigInt(v) : v);
  for (let r = 0; r < B; r++) {
    for (let t = 0; t < T; t++) {
      const i = r * T + t;
      put(ids, i, t === 0 ? 101 : t === T - 1 ? 102 : 1000 + Math.floor(rnd() * 28000));
      put(mask, i, 1);
      put(types, i, 0);
    }
  }
  const f = {
    input_ids: new ort.Tensor(prepared.inputType, ids, [B, T]),
    attention_mask: new ort.Tensor(prepared.inputType, mask, [B, T]),
  };
  if (prepared.hasTokenTypeIds) f.token_type_ids = new ort.Tensor(prepared.inputType, types, [B, T]);
  return f;
}

const head = {
  model: spec.name,
  layers: config.num_hidden_layers ?? null,
  hidden: spec.hiddenSize,
  device: args.device,
  providers: providers.map((p) => (typeof p === 'string' ? p : p.name)),
  onnxruntime: ortVersion,
  node: `${process.execPath} ${process.version}`,
  cpu: `${cpus()[0]?.model ?? '?'} x${cpus().length}`,
  sessionCreateMs: Number(createMs.toFixed(1)),
};

if (args.check) {
  const f = feeds(2, 16, 1);
  const a = performance.now();
  const out = await session.run(f, fetches);
  const firstMs = performance.now() - a;
  const b = performance.now();
  await session.run(f, fetches);
  const secondMs = performance.now() - b;
  const o = out[fetches[0]];
  const finite = Array.from(o.data).every(Number.isFinite);
  const res = { ...head, check: { firstRunMs: Number(firstMs.toFixed(1)), secondRunMs: Number(secondMs.toFixed(2)), output: `${fetches[0]} [${o.dims.join(', ')}]`, finite, gpuMemMiB: gpuMemMiB() } };
  console.log(
    `raw-ceiling: ${args.device} session on ${spec.name} OK: created in ${createMs.toFixed(0)} ms, first run ${firstMs.toFixed(1)} ms, second ${secondMs.toFixed(2)} ms, ` +
      `${res.check.output}, finite ${finite}${res.check.gpuMemMiB !== null ? `, this process holds ${res.check.gpuMemMiB} MiB of GPU memory` : ''}`,
  );
  if (args.json) writeFileSync(args.json, JSON.stringify(res, null, 2) + '\n');
  await session.release();
  process.exit(finite ? 0 : 1);
}

const points = [];
console.log(`raw-ceiling: ${spec.name} (${head.layers} layers x ${head.hidden}) on ${args.device}, session ${createMs.toFixed(0)} ms; ${DURATION_MS / 1000}s per point`);
console.log('    T     B    runs   ms/batch p50   ms/batch p99       seq/s      tokens/s   first ms');
for (const T of SEQ_LENS) {
  let lastMs = 0;
  for (const B of BATCHES) {
    // a point whose warm-up + window would run past --max-point-s is skipped (CPU, big batches)
    const guess = lastMs > 0 ? (lastMs * B) / (points.at(-1)?.B ?? B) : 0;
    if (guess * (WARMUP_RUNS + 2) > MAX_POINT_MS) {
      points.push({ T, B, skipped: `one batch would take ~${guess.toFixed(0)} ms` });
      console.log(`${String(T).padStart(5)} ${String(B).padStart(5)}    skipped (one batch ~${guess.toFixed(0)} ms > --max-point-s)`);
      continue;
    }
    const f = feeds(B, T, B * 1000 + T);
    const w = performance.now();
    await session.run(f, fetches);
    const firstMs = performance.now() - w;
    for (let i = 1; i < WARMUP_RUNS; i++) await session.run(f, fetches);
    const times = [];
    const start = performance.now();
    let now = start;
    while (now - start < DURATION_MS || times.length < 3) {
      const a = performance.now();
      await session.run(f, fetches);
      now = performance.now();
      times.push(now - a);
      if (now - start > MAX_POINT_MS) break;
    }
    const wall = now - start;
    times.sort((x, y) => x - y);
    const q = (p) => times[Math.min(times.length - 1, Math.floor(p * times.length))];
    const pt = {
      T,
      B,
      runs: times.length,
      windowMs: Number(wall.toFixed(1)),
      msPerBatchMean: Number((wall / times.length).toFixed(3)),
      msPerBatchP50: Number(q(0.5).toFixed(3)),
      msPerBatchP99: Number(q(0.99).toFixed(3)),
      seqPerSec: Number(((B * times.length * 1000) / wall).toFixed(1)),
      tokensPerSec: Math.round((B * T * times.length * 1000) / wall),
      firstRunMs: Number(firstMs.toFixed(1)),
    };
    lastMs = pt.msPerBatchP50;
    points.push(pt);
    console.log(
      `${String(T).padStart(5)} ${String(B).padStart(5)} ${String(pt.runs).padStart(7)} ${pt.msPerBatchP50.toFixed(3).padStart(15)} ${pt.msPerBatchP99
        .toFixed(3)
        .padStart(15)} ${pt.seqPerSec.toFixed(0).padStart(11)} ${String(pt.tokensPerSec).padStart(13)} ${pt.firstRunMs.toFixed(1).padStart(10)}`,
    );
  }
}
const res = { ...head, durationS: DURATION_MS / 1000, warmupRuns: WARMUP_RUNS, gpuMemMiB: gpuMemMiB(), points };
if (args.json) {
  writeFileSync(args.json, JSON.stringify(res, null, 2) + '\n');
  console.log(`wrote ${args.json}`);
}
await session.release();
