/**
 * The graph rewrites against the graph as exported: the SkipLayerNormalization
 * one (src/gpu-worker/fusion.ts) alone, and with the Attention one
 * (attention-fusion.ts) as the server runs them. onnxruntime's CPU time per
 * row, one intra-op thread (a model instance's), rows of `--tokens` tokens at
 * each batch size, the three graphs in turn round by round (each first once
 * in three rounds), and how far apart their token states are.
 *
 *   node dist/bench/micro/fusion.js [--models tiny-embed,minilm-l6] [--batches 1,4,16] [--rounds 3]
 *
 * The folders are generated into a temporary folder (docs/tuning.md, Graph fusion).
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { fuseAttention } from '../../src/gpu-worker/attention-fusion.js';
import { fuseSkipLayerNorm } from '../../src/gpu-worker/fusion.js';
import { writePreset } from '../../models/generator/presets.js';
import { decodeModel, encodeModel } from '../../src/shared/model-format/onnx-graph.js';
import { keepOnnxruntimeTelemetryOff } from '../../src/main/onnxruntime-telemetry.js';
import { parseOptions } from '../args.js';
import { maxAbsDiff } from '../suite/phases.js';

const values = parseOptions('node dist/bench/micro/fusion.js [options]', {
  models: { type: 'strings', default: ['tiny-embed', 'minilm-l6'], help: 'presets to generate and compare' },
  batches: { type: 'strings', default: ['1', '4', '16'], help: 'batch sizes (rows per run)' },
  tokens: { type: 'int', min: 2, default: 24, help: 'tokens per row' },
  rounds: { type: 'int', min: 1, default: 3, help: 'rounds, the three graphs in turn' },
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

keepOnnxruntimeTelemetryOff(); // as the server does
const open = (bytes: Uint8Array) => ort.InferenceSession.create(bytes, { intraOpNumThreads: 1, graphOptimizationLevel: 'all', enableCpuMemArena: false, logSeverityLevel: 3 });

const root = mkdtempSync(join(tmpdir(), 'slabserve-fusion-'));
/** The graphs compared: as exported, with the LayerNorms fused, and with the attentions fused too (what the server runs). */
const SIDES = ['exported', 'layerNorms', 'all'] as const;
try {
  console.log(`| model | fused LayerNorms | fused attentions | batch | exported µs/row | LayerNorms fused µs/row | all fused µs/row | exported / LayerNorms (by round) | exported / all (by round) | max diff |`);
  console.log('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const name of values.models) {
    const exported = readFileSync(join(writePreset(name, root).dir, 'model.onnx'));
    const withNorms = decodeModel(exported);
    const layerNorms = fuseSkipLayerNorm(withNorms);
    const withAll = decodeModel(exported);
    fuseSkipLayerNorm(withAll);
    const attentions = fuseAttention(withAll);
    const sessions = { exported: await open(exported), layerNorms: await open(encodeModel(withNorms)), all: await open(encodeModel(withAll)) };
    try {
      for (const B of values.batches.map(Number)) {
        const ratios: { layerNorms: number[]; all: number[] } = { layerNorms: [], all: [] };
        let last: Record<(typeof SIDES)[number], { us: number; states: Float32Array }> | undefined;
        for (let r = 0; r < values.rounds; r++) {
          const order = SIDES.map((_, i) => SIDES[(i + r) % SIDES.length]!); // each side first in turn
          const got = {} as Record<(typeof SIDES)[number], { us: number; states: Float32Array }>;
          for (const side of order) got[side] = await rowCost(sessions[side], B, values.tokens, values['runs-ms']);
          ratios.layerNorms.push(got.exported.us / got.layerNorms.us);
          ratios.all.push(got.exported.us / got.all.us);
          last = got;
        }
        const diff = Math.max(maxAbsDiff(last!.exported.states, last!.layerNorms.states), maxAbsDiff(last!.exported.states, last!.all.states));
        const show = (xs: number[]) => xs.map((x) => x.toFixed(2)).join(' ');
        console.log(
          `| ${name} | ${layerNorms} | ${attentions} | ${B} | ${last!.exported.us.toFixed(0)} | ${last!.layerNorms.us.toFixed(0)} | ${last!.all.us.toFixed(0)} | ${show(ratios.layerNorms)} | ${show(ratios.all)} | ${diff.toExponential(1)} |`,
        );
      }
    } finally {
      await Promise.all(Object.values(sessions).map((s) => s.release()));
    }
  }
} finally {
  rmSync(root, { recursive: true, force: true });
}
