/**
 * The post-processing appended to a loaded graph (src/gpu-worker/graph.ts)
 * against the same arithmetic done by hand on the model's raw outputs.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { beforeAll, describe, expect, it } from 'vitest';
import { prepareModel } from '../dist/src/gpu-worker/graph.js';
import { loadModelSpec, type ModelSpec } from '../dist/src/shared/model-format/model-config.js';
import { decodeModel, encodeModel } from '../dist/src/shared/model-format/onnx-graph.js';
import { makeRandom, maxAbsDiff, modelsDir } from './helpers.js';

const B = 3;
const T = 12;
let feeds: Record<string, ort.Tensor>;
let lengths: number[];

beforeAll(() => {
  const rand = makeRandom('graph test');
  lengths = [T, 5, 9];
  const ids = new BigInt64Array(B * T);
  const mask = new BigInt64Array(B * T);
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < lengths[b]!; t++) {
      ids[b * T + t] = BigInt(1000 + Math.floor(rand() * 28000));
      mask[b * T + t] = 1n;
    }
  }
  feeds = {
    input_ids: new ort.Tensor('int64', ids, [B, T]),
    attention_mask: new ort.Tensor('int64', mask, [B, T]),
    token_type_ids: new ort.Tensor('int64', new BigInt64Array(B * T), [B, T]),
  };
});

const spec = (name: string): ModelSpec => loadModelSpec(join(modelsDir, name), name);
const open = (bytes: Uint8Array) => ort.InferenceSession.create(bytes, { executionProviders: ['cpu'] });

describe('graph post-processing', () => {
  for (const pooling of ['mean', 'cls'] as const) {
    it(`embed (${pooling} pooling): only [batch, dim] leaves the graph, equal to pooling by hand`, async () => {
      const s = { ...spec('tiny-embed'), pooling };
      const bytes = readFileSync(s.onnxPath);
      const prepared = prepareModel(bytes, s);
      expect(prepared.outputs.map((o) => o.name)).toEqual(['slabserve_embedding', 'slabserve_norm']);

      const raw = await open(bytes);
      const hidden = (await raw.run(feeds)).last_hidden_state!.data as Float32Array; // [B,T,H]
      const served = await open(prepared.bytes);
      expect(served.outputNames).not.toContain('last_hidden_state');
      const out = await served.run(feeds);
      const H = s.hiddenSize;
      expect(out.slabserve_embedding!.dims).toEqual([B, H]);

      for (let b = 0; b < B; b++) {
        const pooled = new Float64Array(H);
        const used = pooling === 'cls' ? 1 : lengths[b]!;
        for (let t = 0; t < used; t++) for (let h = 0; h < H; h++) pooled[h]! += hidden[(b * T + t) * H + h]! / used;
        const norm = Math.hypot(...pooled);
        const expected = pooled.map((x) => x / norm);
        const got = (out.slabserve_embedding!.data as Float32Array).subarray(b * H, b * H + H);
        expect(maxAbsDiff(got, expected)).toBeLessThan(1e-5);
        expect((out.slabserve_norm!.data as Float32Array)[b]).toBeCloseTo(norm, 3);
      }
    });
  }

  it('classify: softmax of the logits, logits kept', async () => {
    const s = spec('tiny-intent');
    const bytes = readFileSync(s.onnxPath);
    const prepared = prepareModel(bytes, s);
    expect(prepared.outputs).toEqual([
      { name: 'slabserve_probabilities', width: 8 },
      { name: 'logits', width: 8 },
    ]);
    const out = await (await open(prepared.bytes)).run(feeds);
    const logits = out.logits!.data as Float32Array;
    const probs = out.slabserve_probabilities!.data as Float32Array;
    for (let b = 0; b < B; b++) {
      const row = Array.from(logits.subarray(b * 8, b * 8 + 8));
      const m = Math.max(...row);
      const e = row.map((x) => Math.exp(x - m));
      const z = e.reduce((a, c) => a + c, 0);
      expect(maxAbsDiff(probs.subarray(b * 8, b * 8 + 8), e.map((x) => x / z))).toBeLessThan(1e-6);
    }
  });

  it('refuses graphs it cannot serve, saying why', () => {
    const s = spec('tiny-embed');
    const model = decodeModel(readFileSync(s.onnxPath));
    model.graph!.output![0]!.name = 'something_else';
    expect(() => prepareModel(encodeModel(model), s)).toThrow(/expected an output named last_hidden_state/);

    const old = decodeModel(readFileSync(s.onnxPath));
    old.opsetImport![0]!.version = 11;
    expect(() => prepareModel(encodeModel(old), s)).toThrow(/opset 11 is too old/);
  });
});
