/**
 * The onnxruntime ceiling on a device, for bench/gpu/run.sh: a raw session
 * (bench/raw-ort.ts: the model as the server prepares it, the runner's options)
 * in a closed loop on batches of B sequences of T tokens, every token real,
 * CPU tensors in and out (the copies the engine pays too). A B x T grid, where
 * the suite's efficiency case stops at b = 32: it shows where the device levels
 * off. `--check` opens a session, runs it twice and checks the outputs.
 *
 *   node dist/bench/gpu/raw-ceiling.js --model-dir DIR --device cuda [--batches 1,8,32] [--seq-lens 16,32] [--check] [--json PATH]
 */
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import type { InferenceSession } from 'onnxruntime-node';
import { mulberry32 } from '../../models/generator/rng.js';
import { prepareModel, type PreparedModel } from '../../src/gpu-worker/graph.js';
import { loadModelSpec } from '../../src/shared/model-format/model-config.js';
import { fail, parseOptions } from '../args.js';
import { newHistogram } from '../load.js';
import { machineInfo } from '../machine.js';
import { openRawSession, rawBatches, runRawLoop, type RawBatch } from '../raw-ort.js';

const o = parseOptions('node dist/bench/gpu/raw-ceiling.js --model-dir DIR [options]', {
  'model-dir': { type: 'string', value: 'DIR', help: 'the model folder (required)' },
  device: { type: 'string', value: 'D', default: 'cpu', help: 'cpu, cuda or cuda:N' },
  batches: { type: 'ints', min: 1, default: [1, 8, 32, 64, 128, 256], help: 'batch sizes B' },
  'seq-lens': { type: 'ints', min: 2, default: [16, 32, 128], help: 'tokens per sequence T' },
  'duration-s': { type: 'number', min: 0.1, value: 'S', default: 1, help: 'measured seconds per point' },
  'warmup-s': { type: 'number', min: 0, value: 'S', default: 0.3, help: 'warm-up seconds per point' },
  'max-point-s': { type: 'number', min: 0.1, value: 'S', default: 4, help: 'skip a point whose batches would take longer than this' },
  check: { type: 'boolean', help: 'open a session, run it twice, check the outputs are finite; exit 1 if not' },
  json: { type: 'string', value: 'PATH', help: 'write the results here' },
});
if (!o['model-dir']) fail('--model-dir is required (--help lists the options)');
const spec = loadModelSpec(resolve(o['model-dir']));
const prepared = prepareModel(readFileSync(spec.onnxPath), spec);
const config = JSON.parse(readFileSync(resolve(o['model-dir'], 'config.json'), 'utf8')) as { num_hidden_layers?: number };

/** One batch of B sequences of T real tokens ([CLS] ... [SEP]), seeded. */
function batchOf(p: PreparedModel, B: number, T: number): RawBatch {
  const r = mulberry32(B * 1000 + T);
  const seq = () => ({ ids: Int32Array.from({ length: T }, (_, t) => (t === 0 ? 101 : t === T - 1 ? 102 : 1000 + Math.floor(r() * 28000))), typeIds: new Int32Array(T) });
  return rawBatches(Array.from({ length: B }, seq), [T], B, p, r)[0]!;
}

/** This process's GPU memory from nvidia-smi (MiB), or null. */
function gpuMemMiB(): number | null {
  if (!o.device.startsWith('cuda')) return null;
  try {
    const out = execFileSync(process.env.NVIDIA_SMI || 'nvidia-smi', ['--query-compute-apps=pid,used_memory', '--format=csv,noheader,nounits'], { encoding: 'utf8', timeout: 5000 });
    const mine = out.split('\n').map((l) => l.split(',').map((s) => s.trim())).find(([pid]) => Number(pid) === process.pid);
    return mine ? Number(mine[1]) : null;
  } catch {
    return null;
  }
}

/** Open, run twice, outputs finite: what run.sh asks before any case. */
async function check(session: InferenceSession) {
  const { feeds } = batchOf(prepared, 2, 16);
  const t0 = performance.now();
  const out = await session.run(feeds);
  const firstRunMs = performance.now() - t0;
  const t1 = performance.now();
  await session.run(feeds);
  const secondRunMs = performance.now() - t1;
  const first = out[session.outputNames[0]!]!;
  const finite = Array.from(first.data as Float32Array).every(Number.isFinite);
  const res = { firstRunMs: +firstRunMs.toFixed(1), secondRunMs: +secondRunMs.toFixed(2), output: `${session.outputNames[0]} [${first.dims.join(', ')}]`, finite, gpuMemMiB: gpuMemMiB() };
  console.log(`raw-ceiling: ${o.device} session on ${spec.name} OK: first run ${res.firstRunMs} ms, second ${res.secondRunMs} ms, ${res.output}, finite ${finite}${res.gpuMemMiB !== null ? `, ${res.gpuMemMiB} MiB of GPU memory` : ''}`);
  return res;
}

/** Every (T, B) point of the grid; a point whose batches would run past --max-point-s is skipped. */
async function grid(session: InferenceSession): Promise<Record<string, unknown>[]> {
  const points: Record<string, unknown>[] = [];
  console.log('    T     B    runs   ms/batch p50   ms/batch p99       seq/s      tokens/s');
  for (const T of o['seq-lens']) {
    let msPerRow = 0;
    for (const B of o.batches) {
      if (msPerRow * B * 3 > o['max-point-s'] * 1000) {
        points.push({ T, B, skipped: `one batch would take ~${(msPerRow * B).toFixed(0)} ms` });
        console.log(`${String(T).padStart(5)} ${String(B).padStart(5)}    skipped (one batch ~${(msPerRow * B).toFixed(0)} ms)`);
        continue;
      }
      const h = newHistogram();
      const res = await runRawLoop(session, [batchOf(prepared, B, T)], o['warmup-s'] * 1000, o['duration-s'] * 1000, h);
      const p = { T, B, runs: res.batches, msPerBatchP50: h.getValueAtPercentile(50) / 1000, msPerBatchP99: h.getValueAtPercentile(99) / 1000, seqPerSec: +((res.rows * 1000) / res.windowMs).toFixed(1), tokensPerSec: Math.round((res.realTokens * 1000) / res.windowMs) };
      h.destroy();
      msPerRow = p.msPerBatchP50 / B;
      points.push(p);
      const cells = [T, B, p.runs].map((x, i) => String(x).padStart(i < 2 ? 5 : 7)).join(' ');
      console.log(`${cells} ${p.msPerBatchP50.toFixed(3).padStart(15)} ${p.msPerBatchP99.toFixed(3).padStart(15)} ${p.seqPerSec.toFixed(0).padStart(11)} ${String(p.tokensPerSec).padStart(13)}`);
    }
  }
  return points;
}

const t0 = performance.now();
let session: InferenceSession;
try {
  session = await openRawSession(prepared, o.device, 0);
} catch (err) {
  console.error(`raw-ceiling: cannot open a ${o.device} session on ${spec.name}: ${(err as Error).message}`);
  process.exit(1);
}
const head = {
  model: spec.name,
  layers: config.num_hidden_layers ?? null,
  hidden: spec.hiddenSize,
  device: o.device,
  machine: machineInfo(),
  sessionCreateMs: +(performance.now() - t0).toFixed(1),
};
const res = o.check ? { ...head, check: await check(session) } : { ...head, durationS: o['duration-s'], points: await grid(session), gpuMemMiB: gpuMemMiB() };
if (o.json) writeFileSync(o.json, JSON.stringify(res, null, 2) + '\n');
await session.release();
process.exit('check' in res && !res.check.finite ? 1 : 0);
