/**
 * int8 against fp32 on the CPU: the same model's float graph (model.onnx) and
 * its dynamically quantized one (model_int8.onnx, `generate --int8`), each
 * behind an in-process engine with the default batching, side by side in one
 * run: throughput under 64 concurrent callers (rounds alternating), and how
 * close the int8 rows are to the fp32 ones (cosine, over every text).
 *
 *   node dist/bench/micro/dtypes.js [--models tiny-embed,minilm-l6] [--rounds 4] [--duration-s 3] [--texts 512]
 *
 * The folders are generated (with their int8 graphs) into a temporary folder.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createEngine, type Engine } from '../../src/main/engine.js';
import { writePreset } from '../../models/generator/presets.js';
import { loadModelSpec } from '../../src/shared/model-format/model-config.js';
import { parseOptions } from '../args.js';
import { runClosedLoop } from '../closed-loop.js';
import { median, roundOrder } from '../suite/phases.js';
import { makeWorkload } from '../workloads.js';

const values = parseOptions('node dist/bench/micro/dtypes.js [options]', {
  models: { type: 'strings', default: ['tiny-embed', 'minilm-l6'], help: 'presets to generate as fp32 and int8' },
  rounds: { type: 'int', min: 1, default: 4, help: 'rounds, alternating fp32 and int8' },
  'duration-s': { type: 'number', min: 0.5, value: 'S', default: 3, help: 'measured seconds per side and round' },
  texts: { type: 'int', min: 16, default: 512, help: 'workload texts' },
});
const CALLERS = 64;

/** Sequences per second of `CALLERS` closed-loop callers over `texts` for --duration-s. */
async function throughput(engine: Engine, texts: string[]): Promise<number> {
  const loop = await runClosedLoop({ clients: CALLERS, warmupMs: 0, durationMs: values['duration-s'] * 1000, call: (n) => engine.embed(texts[n % texts.length]!), snapshot: () => null });
  loop.histogram.destroy();
  return (loop.requests / loop.windowMs) * 1000;
}

const cosine = (a: Float32Array, b: Float32Array) => a.reduce((s, v, i) => s + v * b[i]!, 0) / Math.hypot(...a) / Math.hypot(...b);

const root = mkdtempSync(join(tmpdir(), 'slabserve-dtypes-'));
try {
  console.log('| model | fp32 seq/s | int8 seq/s | int8 / fp32 (by round) | cosine to fp32: mean, worst |');
  console.log('|---|---:|---:|---:|---:|');
  for (const name of values.models) {
    const dir = writePreset(name, root, { int8: true }).dir;
    const spec = loadModelSpec(dir);
    const workload = await makeWorkload('short', spec, 1, values.texts);
    const texts = workload.requests.map((r) => r[0]!.text);
    const engines = { fp32: await createEngine({ device: 'cpu', models: [dir], dtype: 'fp32', log: () => {} }), int8: await createEngine({ device: 'cpu', models: [dir], dtype: 'int8', log: () => {} }) };
    try {
      const f32 = await engines.fp32.embed(texts);
      const i8 = await engines.int8.embed(texts);
      const cos = f32.map((v, i) => cosine(v, i8[i]!));
      const rates: Record<'fp32' | 'int8', number[]> = { fp32: [], int8: [] };
      for (let r = 1; r <= values.rounds; r++) {
        for (const d of roundOrder(r, 2).map((i) => (['fp32', 'int8'] as const)[i]!)) rates[d].push(await throughput(engines[d], texts));
      }
      const ratios = rates.int8.map((v, i) => (v / rates.fp32[i]!).toFixed(2)).join(' ');
      console.log(
        `| ${name} | ${median(rates.fp32).toFixed(0)} | ${median(rates.int8).toFixed(0)} | ${(median(rates.int8) / median(rates.fp32)).toFixed(2)}x (${ratios}) | ` +
          `${(cos.reduce((a, b) => a + b, 0) / cos.length).toFixed(5)}, ${Math.min(...cos).toFixed(5)} |`,
      );
    } finally {
      await engines.fp32.close();
      await engines.int8.close();
    }
  }
} finally {
  rmSync(root, { recursive: true, force: true });
}
