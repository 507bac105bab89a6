/**
 * The SkipLayerNormalization rewrite (src/gpu-worker/fusion.ts) against the
 * graph as exported: onnxruntime's CPU time per row, one intra-op thread (a
 * model instance's), rows of `--tokens` tokens at each batch size, the two
 * graphs alternating round by round, and how far apart their token states are.
 *
 *   node dist/bench/fusion.js [--models tiny-embed,minilm-l6] [--batches 1,4,16] [--rounds 2]
 *
 * The folders are generated into a temporary folder (docs/tuning.md, Graph fusion).
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { fuseSkipLayerNorm } from '../src/gpu-worker/fusion.js';
import { writePreset } from '../src/modelgen/presets.js';
import { decodeModel, encodeModel } from '../src/shared/onnx-graph.js';
import { parseOptions } from './args.js';

const values = parseOptions('node dist/bench/fusion.js [options]', {
  models: { type: 'strings', default: ['tiny-embed', 'minilm-l6'], help: 'presets to generate and compare' },
  batches: { type: 'strings', default: ['1', '4', '16'], help: 'batch sizes (rows per run)' },
  tokens: { type: 'int', min: 2, default: 24, help: 'tokens per row' },
  rounds: { type: 'int', min: 1, default: 2, help: 'rounds, the two graphs alternating' },
  'runs-ms': { type: 'number', min: 50, value: 'MS', default: 1500, help: 'CPU time each graph runs per batch size and round' },
});

/** onnxruntime's CPU µs per row running `B` rows of `T` tokens for about `budgetMs`, and its last token states. */
async function rowCost(session: ort.InferenceSession, B: number, T: number, budgetMs: number): Promise<{ us: number; states: Float32Array }> {
  const ids = BigInt64Array.from({ length: B * T }, (_, i) => BigInt(1000 + ((i * 7919) % 20000)));
  const feeds: Record<string, ort.Tensor> = { input_ids: new ort.Tensor('int64', ids, [B, T]), attention_mask: new ort.Tensor('int64', new BigInt64Array(B * T).fill(1n), [B, T]) };
  if (session.inputNames.includes('token_type_ids')) feeds.token_type_ids = new ort.Tensor('int64', new BigInt64Array(B * T), [B, T]);
  let out = await session.run(feeds); // warm
  const start = process.cpuUsage();
  let runs = 0;
  const usedMs = () => {
    const used = process.cpuUsage(start);
    return (used.user + used.system) / 1000;
  };
  while (usedMs() < budgetMs) {
    out = await session.run(feeds);
    runs++;
  }
  return { us: (usedMs() * 1000) / runs / B, states: out[session.outputNames[0]!]!.data as Float32Array };
}

const maxDiff = (a: Float32Array, b: Float32Array) => a.reduce((d, v, i) => Math.max(d, Math.abs(v - b[i]!)), 0);
const open = (bytes: Uint8Array) => ort.InferenceSession.create(bytes, { intraOpNumThreads: 1, graphOptimizationLevel: 'all', enableCpuMemArena: false, logSeverityLevel: 3 });

const root = mkdtempSync(join(tmpdir(), 'slabserve-fusion-'));
try {
  console.log(`| model | fused | batch | exported µs/row | fused µs/row | exported / fused (by round) | max diff |`);
  console.log('|---|---:|---:|---:|---:|---:|---:|');
  for (const name of values.models) {
    const exported = readFileSync(join(writePreset(name, root).dir, 'model.onnx'));
    const model = decodeModel(exported);
    const fused = fuseSkipLayerNorm(model);
    const sessions = { exported: await open(exported), fused: await open(encodeModel(model)) };
    try {
      for (const B of values.batches.map(Number)) {
        const ratios: number[] = [];
        let last = { exported: 0, fused: 0, diff: 0 };
        for (let r = 0; r < values.rounds; r++) {
          const order = r % 2 === 0 ? (['exported', 'fused'] as const) : (['fused', 'exported'] as const);
          const got: Record<string, { us: number; states: Float32Array }> = {};
          for (const side of order) got[side] = await rowCost(sessions[side], B, values.tokens, values['runs-ms']);
          last = { exported: got.exported!.us, fused: got.fused!.us, diff: maxDiff(got.exported!.states, got.fused!.states) };
          ratios.push(last.exported / last.fused);
        }
        console.log(`| ${name} | ${fused} | ${B} | ${last.exported.toFixed(0)} | ${last.fused.toFixed(0)} | ${ratios.map((x) => x.toFixed(2)).join(' ')} | ${last.diff.toExponential(1)} |`);
      }
    } finally {
      await Promise.all([sessions.exported.release(), sessions.fused.release()]);
    }
  }
} finally {
  rmSync(root, { recursive: true, force: true });
}
