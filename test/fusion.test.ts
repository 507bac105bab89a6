/**
 * The SkipLayerNormalization rewrite (src/gpu-worker/fusion.ts): what it
 * rewrites and what it leaves, that the rewritten graph computes what the
 * unmodified one does (plain onnxruntime runs of both, fresh random inputs,
 * seed printed), and that a graph whose fused form cannot run is served as
 * exported.
 */
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fuseSkipLayerNorm } from '../dist/src/gpu-worker/fusion.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { decodeModel, encodeModel, GraphBuilder, makeModel, onnx } from '../dist/src/shared/model-format/onnx-graph.js';
import { parseMetrics } from './fixtures/http-client.js';
import { expectSameTokenStates, makeRandom, maxAbsDiff, modelsDir, PlainReference, randomTexts, testServerConfig, vocabularyWords } from './helpers.js';
import { loadModelSpec } from '../dist/src/shared/model-format/model-config.js';

const TINY_EMBED = readFileSync(join(modelsDir, 'tiny-embed', 'model.onnx'));
const opTypes = (m: onnx.IModelProto) => (m.graph!.node ?? []).map((n) => n.opType);

describe('fuseSkipLayerNorm on a BERT export', () => {
  it("rewrites tiny-embed's five LayerNorms (embeddings, post-attention, post-FFN); its token states equal the unmodified graph's", async () => {
    const model = decodeModel(TINY_EMBED);
    expect(fuseSkipLayerNorm(model)).toBe(5);
    expect(opTypes(model).filter((t) => t === 'SkipLayerNormalization').length).toBe(5);
    expect(opTypes(model)).not.toContain('LayerNormalization');
    // Every Add the rewrite took in is gone: 2 per block norm, 1 for the embeddings' (words + types stays: it is the input).
    expect(opTypes(model).filter((t) => t === 'Add').length).toBe(opTypes(decodeModel(TINY_EMBED)).filter((t) => t === 'Add').length - 9);
    await expectSameTokenStates(TINY_EMBED, encodeModel(model), 'fusion tiny-embed');
  });
});

// ------------------------------------------------------------------ the pattern's edges, on small graphs

const H = 8;
const wave = (n: number, k: number) => Float32Array.from({ length: n }, (_, i) => Math.sin(k * (i + 1)));

interface Variant {
  rank?: 2 | 3;
  lnAttrs?: Record<string, number>;
  gammaFp16?: boolean;
  biasWidth?: number;
  /** The inner sum is also a graph output (used twice). */
  innerIsOutput?: boolean;
  /** No MatMul before the bias Add. */
  noMatMul?: boolean;
}

/** y = LayerNormalization(Add(Add(MatMul(x, W), bias), r), gamma, beta), with one thing changed. */
function patternGraph(v: Variant = {}): onnx.IModelProto {
  const dims = v.rank === 2 ? ['n', H] : ['b', 's', H];
  const b = new GraphBuilder('pattern');
  b.addInput('x', 'float', dims);
  b.addInput('r', 'float', dims);
  b.addInitializer('W', 'float', wave(H * H, 1), [H, H]);
  b.addInitializer('bias', 'float', wave(v.biasWidth ?? H, 2), [v.biasWidth ?? H]);
  b.addInitializer('beta', 'float', wave(H, 4), [H]);
  if (v.gammaFp16) b.graph().initializer!.push({ name: 'gamma', dataType: onnx.TensorProto.DataType.FLOAT16, dims: [H], rawData: new Uint8Array(2 * H) });
  else b.addInitializer('gamma', 'float', wave(H, 3), [H]);
  const inner = b.op('Add', [v.noMatMul ? 'x' : b.op('MatMul', ['x', 'W']), 'bias']);
  const sum = b.op('Add', [inner, 'r']);
  b.node('LayerNormalization', [sum, 'gamma', 'beta'], { axis: -1, epsilon: 1e-5, ...v.lnAttrs }, ['y']);
  b.addOutput('y', 'float', dims);
  if (v.innerIsOutput) b.addOutput(inner, 'float', dims);
  return makeModel(b.graph());
}

describe('fuseSkipLayerNorm: what it takes and what it leaves', () => {
  for (const rank of [2, 3] as const) {
    it(`rewrites the pattern (rank ${rank}) into one SkipLayerNormalization that computes the same`, async () => {
      const model = patternGraph({ rank });
      const plain = encodeModel(model);
      expect(fuseSkipLayerNorm(model)).toBe(1);
      expect(opTypes(model)).toEqual(['MatMul', 'SkipLayerNormalization']);
      const shape = rank === 2 ? [6, H] : [2, 3, H];
      const r = makeRandom(`fusion pattern rank ${rank}`);
      const input = () => new ort.Tensor('float32', Float32Array.from({ length: 6 * H }, () => r() * 4 - 2), shape);
      const feeds = { x: input(), r: input() };
      const run = async (bytes: Uint8Array) => (await (await ort.InferenceSession.create(bytes)).run(feeds)).y!.data as Float32Array;
      expect(maxAbsDiff(await run(plain), await run(encodeModel(model)))).toBeLessThan(1e-5);
    });
  }

  const leftAlone: [string, Variant][] = [
    ['a LayerNorm over another axis', { lnAttrs: { axis: 1 } }],
    ['a LayerNorm stashing in another type', { lnAttrs: { stash_type: 10 } }],
    ['an fp16 gamma', { gammaFp16: true }],
    ['a bias of another width', { biasWidth: H + 1 }],
    ['an inner sum used twice', { innerIsOutput: true }],
    ['no MatMul before the bias', { noMatMul: true }],
  ];
  for (const [name, variant] of leftAlone) {
    it(`leaves ${name} as it is`, () => {
      const model = patternGraph(variant);
      const before = encodeModel(model);
      expect(fuseSkipLayerNorm(model)).toBe(0);
      expect(Buffer.from(encodeModel(model)).equals(Buffer.from(before))).toBe(true);
    });
  }
});

/** y = LayerNormalization(Add(Add(Gather(words, ids), Gather(types, ids)), positions [s, H]), gamma, beta); `typesWidth` changed for a near-miss. */
function embeddingsGraph(typesWidth = H): onnx.IModelProto {
  const b = new GraphBuilder('embeddings');
  b.addInput('ids', 'int64', ['b', 's']);
  b.addInput('positions', 'float', ['s', H]);
  b.addInitializer('words', 'float', wave(50 * H, 5), [50, H]);
  b.addInitializer('types', 'float', wave(50 * typesWidth, 6), [50, typesWidth]);
  b.addInitializer('gamma', 'float', wave(H, 3), [H]);
  b.addInitializer('beta', 'float', wave(H, 4), [H]);
  const summed = b.op('Add', [b.op('Gather', ['words', 'ids']), b.op('Gather', ['types', 'ids'])]);
  b.node('LayerNormalization', [b.op('Add', [summed, 'positions']), 'gamma', 'beta'], { axis: -1, epsilon: 1e-12 }, ['y']);
  b.addOutput('y', 'float', ['b', 's', H]);
  return makeModel(b.graph());
}

describe('fuseSkipLayerNorm: the embeddings', () => {
  it('rewrites word + type lookups plus positions [S, H] (broadcast over the batch); the same numbers', async () => {
    const model = embeddingsGraph();
    const plain = encodeModel(model);
    expect(fuseSkipLayerNorm(model)).toBe(1);
    expect(opTypes(model)).toEqual(['Gather', 'Gather', 'Add', 'SkipLayerNormalization']);
    const r = makeRandom('fusion embeddings');
    const feeds = {
      ids: new ort.Tensor('int64', BigInt64Array.from({ length: 2 * 5 }, () => BigInt(Math.floor(r() * 50))), [2, 5]),
      positions: new ort.Tensor('float32', Float32Array.from({ length: 5 * H }, () => r() * 2 - 1), [5, H]),
    };
    const run = async (bytes: Uint8Array) => (await (await ort.InferenceSession.create(bytes)).run(feeds)).y!.data as Float32Array;
    expect(maxAbsDiff(await run(plain), await run(encodeModel(model)))).toBeLessThan(1e-5);
  });

  it('leaves lookups into a table of another width as they are', () => {
    const model = embeddingsGraph(H + 1);
    expect(fuseSkipLayerNorm(model)).toBe(0);
  });
});

// ------------------------------------------------------------------ a fused graph that cannot run: served as exported

/**
 * tiny-embed with its first post-attention block lifted to rank 4 ([1, B, S, H]: an Unsqueeze before
 * the MatMul and the residual, a Squeeze after the LayerNorm). The pattern still matches, and
 * onnxruntime's SkipLayerNormalization takes rank 2 or 3 only: the fused graph fails its first run.
 */
function rankFourEmbed(): Uint8Array {
  const model = decodeModel(TINY_EMBED);
  const g = model.graph!;
  const nodes = g.node!;
  const producer = (name: string) => nodes.find((n) => n.output!.includes(name))!;
  // The first LayerNorm after a MatMul's bias sum and the residual: LN(Add(Add(MatMul(x, W), bias), r)).
  const matMulBefore = (ln: onnx.INodeProto) => producer(producer(producer(ln.input![0]!).input![0]!).input![0]!);
  const ln = nodes.find((n) => n.opType === 'LayerNormalization' && matMulBefore(n).opType === 'MatMul')!;
  const outer = producer(ln.input![0]!);
  const matMul = matMulBefore(ln);
  g.initializer!.push({ name: 'axis0', dataType: onnx.TensorProto.DataType.INT64, dims: [1], int64Data: [0] });
  const lift = (name: string): onnx.INodeProto => ({ opType: 'Unsqueeze', input: [name, 'axis0'], output: [`${name}/rank4`], name: `${name}/lift` });
  const liftX = lift(matMul.input![0]!);
  const liftR = lift(outer.input![1]!);
  matMul.input![0] = liftX.output![0]!;
  outer.input![1] = liftR.output![0]!;
  const out = ln.output![0]!;
  ln.output![0] = `${out}/rank4`;
  const drop: onnx.INodeProto = { opType: 'Squeeze', input: [ln.output![0]!, 'axis0'], output: [out], name: `${out}/drop` };
  nodes.splice(nodes.indexOf(ln) + 1, 0, drop);
  nodes.splice(nodes.indexOf(matMul), 0, liftX, liftR);
  return encodeModel(model);
}

describe('a fused graph that fails its trial run', () => {
  let root: string;
  let server: Server;
  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), 'slabserve-fusion-'));
    cpSync(join(modelsDir, 'tiny-embed'), join(root, 'tiny-embed'), { recursive: true });
    cpSync(join(modelsDir, 'tiny-embed'), join(root, 'rank-four'), { recursive: true });
    writeFileSync(join(root, 'rank-four', 'model.onnx'), rankFourEmbed());
    server = await startServer(testServerConfig({ modelsDir: root, models: ['tiny-embed', 'rank-four'] }));
    await server.ready;
  }, 120_000);
  afterAll(async () => {
    await server?.close();
    rmSync(root, { recursive: true, force: true });
  });

  it('is served as exported (nothing fused, rows equal to a plain onnxruntime run of it); the other model runs fused', async () => {
    const metrics = parseMetrics(await (await fetch(`${server.url}/metrics`)).text());
    expect(metrics.sum('slabserve_model_fused_layer_norms', { model: 'tiny-embed' })).toBe(5);
    expect(metrics.sum('slabserve_model_fused_layer_norms', { model: 'rank-four' })).toBe(0);
    expect(metrics.sum('slabserve_model_fused_attentions', { model: 'tiny-embed' })).toBe(2);
    expect(metrics.sum('slabserve_model_fused_attentions', { model: 'rank-four' })).toBe(0); // served as exported: nothing fused
    const r = makeRandom('fusion fallback');
    const texts = randomTexts(r, vocabularyWords(loadModelSpec(join(root, 'tiny-embed'))), 6, 20);
    const { loadTokenizer } = await import('../dist/src/core/tokenizer/tokenizer.js');
    const tok = await loadTokenizer(join(root, 'tiny-embed', 'tokenizer.json'));
    for (const model of ['rank-four', 'tiny-embed']) {
      const reference = await PlainReference.open(join(root, model));
      try {
        const res = await fetch(`${server.url}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, inputs: texts }) });
        expect(res.status).toBe(200);
        const rows = (await res.json()) as number[][];
        for (const [i, text] of texts.entries()) {
          const want = await reference.embedding(tok.encode(text, { maxLength: 512, truncate: false }).ids);
          expect(maxAbsDiff(rows[i]!, want), `${model}: ${text}`).toBeLessThan(1e-5);
        }
      } finally {
        await reference.close();
      }
    }
  });
});
