/**
 * The generated BERT models: they load in onnxruntime, have the HF export's
 * interface, are deterministic, honour the attention mask, and give clearly
 * different outputs for different inputs. Models are built in memory (no
 * dependence on the generated models/ folders).
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  attentionProbsName,
  buildBertGraph,
  buildBertModel,
  type BertSpec,
} from '../models/generator/bert-graph.js';
import {
  INTENT_LABELS,
  buildConfigJson,
  getPreset,
  isModelFolderComplete,
  writePreset,
} from '../models/generator/presets.js';
import { Rng } from '../models/generator/rng.js';
import { GraphBuilder, decodeModel, encodeModel, makeModel, onnx } from '../src/shared/model-format/onnx-graph.js';
import { loadModelSpec } from '../src/shared/model-format/model-config.js';

type Feeds = Record<string, ort.Tensor>;

const CLS = 101;
const SEP = 102;

function feeds(ids: number[][], mask: number[][], types?: number[][]): Feeds {
  const B = ids.length;
  const T = ids[0]!.length;
  const t = (rows: number[][]) => new ort.Tensor('int64', BigInt64Array.from(rows.flat(), (v) => BigInt(v)), [B, T]);
  return {
    input_ids: t(ids),
    attention_mask: t(mask),
    token_type_ids: t(types ?? ids.map((r) => r.map(() => 0))),
  };
}

/** `n` random texts: [CLS] w... [SEP] then padding to `T`, lengths in [minLen, T]. */
function randomBatch(seed: number, n: number, T: number, minLen = 4, vocab = 30522) {
  const rng = new Rng(seed);
  const lo = vocab > 2000 ? 1000 : 110; // ordinary word ids, past the specials
  const ids: number[][] = [];
  const mask: number[][] = [];
  const lens: number[] = [];
  for (let i = 0; i < n; i++) {
    const len = minLen + rng.int(T - minLen + 1);
    lens.push(len);
    ids.push(Array.from({ length: T }, (_, j) => (j === 0 ? CLS : j === len - 1 ? SEP : j < len ? lo + rng.int(vocab - lo) : 0)));
    mask.push(Array.from({ length: T }, (_, j) => (j < len ? 1 : 0)));
  }
  return { ids, mask, lens };
}

function data(t: ort.Tensor | undefined): Float32Array {
  if (!t) throw new Error('missing output');
  return t.data as Float32Array;
}

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

/** Rows [row, positions [0, upto)) of a [B, T, H] tensor. */
function slice(t: Float32Array, T: number, H: number, row: number, upto: number): Float32Array {
  return t.slice(row * T * H, row * T * H + upto * H);
}

function meanPool(h: Float32Array, T: number, H: number, row: number, len: number): Float64Array {
  const e = new Float64Array(H);
  for (let j = 0; j < len; j++) for (let k = 0; k < H; k++) e[k]! += h[(row * T + j) * H + k]!;
  const norm = Math.hypot(...e);
  return e.map((v) => v / norm);
}

/** A decoded model's graph (protobufjs decodes sub-messages to class instances, whose arrays are always set). */
const graphOf = (m: onnx.ModelProto) => m.graph as onnx.GraphProto;

const cosine = (a: Float64Array, b: Float64Array) => a.reduce((s, v, i) => s + v * b[i]!, 0);

/** A small model for fast tests that don't need the real preset sizes. */
const SMALL: BertSpec = {
  layers: 2,
  hidden: 32,
  heads: 4,
  intermediate: 64,
  vocabSize: 500,
  maxPositions: 64,
  typeVocabSize: 2,
  task: 'embed',
  seed: 7,
};

describe('GraphBuilder', () => {
  it('types attributes by their JS form, with escape hatches', () => {
    const b = new GraphBuilder('g');
    const x = b.addInput('x', 'float', ['n', 3]);
    b.node('Custom', [x], {
      i: 3,
      neg: -1,
      f: 0.5,
      f1: { f: 1 },
      ints: [1, -2],
      floats: [0.5, 1],
      floats1: { floats: [1, 2] },
      s: 'abc',
      big: 9223372036854775807n,
    });
    const T = onnx.AttributeProto.AttributeType;
    const decoded = decodeModel(encodeModel(makeModel(b.graph())));
    const node = graphOf(decoded).node[0] as onnx.NodeProto;
    const attrs = Object.fromEntries((node.attribute as onnx.AttributeProto[]).map((a) => [a.name, a]));
    expect(attrs.i!.type).toBe(T.INT);
    expect(Number(attrs.i!.i)).toBe(3);
    expect(Number(attrs.neg!.i)).toBe(-1);
    expect(attrs.f!.type).toBe(T.FLOAT);
    expect(attrs.f!.f).toBe(0.5);
    expect(attrs.f1!.type).toBe(T.FLOAT);
    expect(attrs.f1!.f).toBe(1);
    expect(attrs.ints!.type).toBe(T.INTS);
    expect(attrs.ints!.ints.map(Number)).toEqual([1, -2]);
    expect(attrs.floats!.type).toBe(T.FLOATS);
    expect(attrs.floats!.floats).toEqual([0.5, 1]);
    expect(attrs.floats1!.type).toBe(T.FLOATS);
    expect(attrs.s!.type).toBe(T.STRING);
    expect(new TextDecoder().decode(attrs.s!.s)).toBe('abc');
    expect(attrs.big!.i.toString()).toBe('9223372036854775807');
    expect(Number(decoded.opsetImport[0]!.version)).toBe(17);
    expect(Number(decoded.irVersion)).toBe(8);
  });

  it('stores initializers as little-endian raw_data and checks dims', () => {
    const b = new GraphBuilder('g');
    b.addInitializer('w', 'float', [1.5, -2], [2]);
    b.addInitializer('n', 'int64', [1, -1], [2]);
    const t = graphOf(decodeModel(encodeModel(makeModel(b.graph())))).initializer as onnx.TensorProto[];
    expect(t[0]!.dataType).toBe(onnx.TensorProto.DataType.FLOAT);
    expect(Array.from(t[0]!.rawData)).toEqual(Array.from(new Uint8Array(new Float32Array([1.5, -2]).buffer)));
    expect(t[1]!.rawData.length).toBe(16);
    expect(() => b.addInitializer('bad', 'float', [1, 2, 3], [2, 2])).toThrow(/4 elements/);
    expect(() => b.addInitializer('w', 'float', [1], [1])).toThrow(/already used/);
  });

  it('runs in onnxruntime; wrap() extends a decoded graph, removeOutput() drops one', async () => {
    const b = new GraphBuilder('g');
    const x = b.addInput('x', 'float', ['n', 2]);
    const two = b.addInitializer('two', 'float', [2], []);
    const y = b.op('Mul', [x, two]);
    b.node('Relu', [y], undefined, ['out']);
    b.addOutput('out', 'float', ['n', 2]);
    const decoded = decodeModel(encodeModel(makeModel(b.graph())));

    const w = GraphBuilder.wrap(graphOf(decoded));
    expect(w.outputNames()).toEqual(['out']);
    const z = w.op('Neg', [y]); // a generated name must not clash with the existing /Mul ones
    expect(z).not.toBe(y);
    w.addOutput(z, 'float', ['n', 2]);
    w.removeOutput('out');
    expect(w.outputNames()).toEqual([z]);
    expect(() => w.removeOutput('out')).toThrow();

    const s = await ort.InferenceSession.create(encodeModel(decoded));
    const r = await s.run({ x: new ort.Tensor('float32', Float32Array.from([1, -3]), [1, 2]) });
    expect(Array.from(data(r[z]))).toEqual([-2, 6]);
    await s.release();
  });
});

describe('Rng', () => {
  it('is deterministic and roughly standard normal', () => {
    const a = new Rng(42).normalArray(20000, 1);
    const b = new Rng(42).normalArray(20000, 1);
    expect(Buffer.compare(Buffer.from(a.buffer), Buffer.from(b.buffer))).toBe(0);
    expect(new Rng(43).normalArray(4, 1)).not.toEqual(a.slice(0, 4));
    const mean = a.reduce((s, v) => s + v, 0) / a.length;
    const std = Math.sqrt(a.reduce((s, v) => s + (v - mean) ** 2, 0) / a.length);
    expect(Math.abs(mean)).toBeLessThan(0.03);
    expect(Math.abs(std - 1)).toBeLessThan(0.03);
    expect(new Rng(1).fork('x').nextU32()).toBe(new Rng(1).fork('x').nextU32());
    expect(new Rng(1).fork('x').nextU32()).not.toBe(new Rng(1).fork('y').nextU32());
  });
});

describe('bert graph', () => {
  it('same seed gives identical bytes, a different seed different bytes', () => {
    const a = buildBertModel(SMALL);
    const b = buildBertModel({ ...SMALL });
    const c = buildBertModel({ ...SMALL, seed: 8 });
    expect(Buffer.compare(a, b)).toBe(0);
    expect(a.length).toBe(c.length);
    expect(Buffer.compare(a, c)).not.toBe(0);
  });

  it('rejects bad specs', () => {
    expect(() => buildBertModel({ ...SMALL, heads: 5 })).toThrow(/multiple of heads/);
    expect(() => buildBertModel({ ...SMALL, task: 'classify' })).toThrow(/numLabels/);
  });

  it('attention is non-uniform and padded keys get exactly zero weight', async () => {
    const g = buildBertGraph(SMALL);
    const w = GraphBuilder.wrap(g);
    for (let l = 0; l < SMALL.layers; l++) w.addOutput(attentionProbsName(l), 'float', ['b', SMALL.heads, 't', 't']);
    const s = await ort.InferenceSession.create(encodeModel(makeModel(g)));
    const T = 12;
    const { ids, mask, lens } = randomBatch(3, 4, T, 6, SMALL.vocabSize);
    const r = await s.run(feeds(ids, mask));
    for (let l = 0; l < SMALL.layers; l++) {
      const p = data(r[attentionProbsName(l)]);
      let maxSum = 0;
      let rows = 0;
      for (let i = 0; i < 4; i++) {
        for (let h = 0; h < SMALL.heads; h++) {
          for (let q = 0; q < T; q++) {
            const row = p.subarray(((i * SMALL.heads + h) * T + q) * T, ((i * SMALL.heads + h) * T + q + 1) * T);
            for (let k = lens[i]!; k < T; k++) expect(row[k]).toBe(0);
            if (q < lens[i]!) {
              maxSum += Math.max(...row) * lens[i]!; // 1 for uniform attention
              rows++;
            }
          }
        }
      }
      expect(maxSum / rows).toBeGreaterThan(2); // the top key gets > 2x its uniform share on average
    }
    await s.release();
  });
});

describe('preset models in onnxruntime', () => {
  let embed: ort.InferenceSession;
  let intent: ort.InferenceSession;

  beforeAll(async () => {
    embed = await ort.InferenceSession.create(Buffer.from(buildBertModel(getPreset('tiny-embed').spec)));
    intent = await ort.InferenceSession.create(Buffer.from(buildBertModel(getPreset('tiny-intent').spec)));
  });
  afterAll(async () => {
    await embed?.release();
    await intent?.release();
  });

  const B2 = () => {
    // row 0: 4 real tokens + 3 padding; row 1: 7 real tokens
    const ids = [
      [CLS, 2023, 2003, SEP, 0, 0, 0],
      [CLS, 7592, 2088, 999, 2129, 2024, SEP],
    ];
    const mask = [
      [1, 1, 1, 1, 0, 0, 0],
      [1, 1, 1, 1, 1, 1, 1],
    ];
    return { ids, mask };
  };

  it('have the HF export interface and shapes for a [2, 7] batch, without NaN', async () => {
    for (const s of [embed, intent]) expect(s.inputNames).toEqual(['input_ids', 'attention_mask', 'token_type_ids']);
    expect(embed.outputNames).toEqual(['last_hidden_state']);
    expect(intent.outputNames).toEqual(['logits']);

    const { ids, mask } = B2();
    const h = (await embed.run(feeds(ids, mask))).last_hidden_state!;
    expect(h.type).toBe('float32');
    expect(h.dims).toEqual([2, 7, 128]);
    expect(data(h).every(Number.isFinite)).toBe(true);

    const logits = (await intent.run(feeds(ids, mask))).logits!;
    expect(logits.type).toBe('float32');
    expect(logits.dims).toEqual([2, INTENT_LABELS.length]);
    expect(data(logits).every(Number.isFinite)).toBe(true);
  });

  it('ignore token ids under mask 0, and depend on them under mask 1', async () => {
    const { ids, mask } = B2();
    const changed = ids.map((r, i) => (i === 0 ? [...r.slice(0, 4), 1996, 4937, 2769] : r));
    const unmasked = mask.map((r, i) => (i === 0 ? r.map(() => 1) : r));

    const base = data((await embed.run(feeds(ids, mask))).last_hidden_state);
    const padChanged = data((await embed.run(feeds(changed, mask))).last_hidden_state);
    const padAttended = data((await embed.run(feeds(changed, unmasked))).last_hidden_state);
    const H = 128;
    // real positions of row 0 are unaffected by what the padding holds ...
    expect(maxAbsDiff(slice(base, 7, H, 0, 4), slice(padChanged, 7, H, 0, 4))).toBeLessThan(1e-5);
    // ... but do attend to those tokens once the mask says they are real
    expect(maxAbsDiff(slice(base, 7, H, 0, 4), slice(padAttended, 7, H, 0, 4))).toBeGreaterThan(1e-2);
    // and row 1 never changes
    expect(maxAbsDiff(slice(base, 7, H, 1, 7), slice(padAttended, 7, H, 1, 7))).toBeLessThan(1e-5);

    const lBase = data((await intent.run(feeds(ids, mask))).logits);
    const lPadChanged = data((await intent.run(feeds(changed, mask))).logits);
    const lPadAttended = data((await intent.run(feeds(changed, unmasked))).logits);
    expect(maxAbsDiff(lBase.slice(0, 8), lPadChanged.slice(0, 8))).toBeLessThan(1e-5);
    expect(maxAbsDiff(lBase.slice(0, 8), lPadAttended.slice(0, 8))).toBeGreaterThan(1e-2);
  });

  it('padding does not change a text’s output (padded batch = unpadded run)', async () => {
    const { ids, mask } = B2();
    const padded = data((await embed.run(feeds(ids, mask))).last_hidden_state);
    const alone = data((await embed.run(feeds([ids[0]!.slice(0, 4)], [mask[0]!.slice(0, 4)]))).last_hidden_state);
    expect(maxAbsDiff(slice(padded, 7, 128, 0, 4), alone)).toBeLessThan(1e-5);
  });

  it('give clearly different outputs for different inputs', async () => {
    const T = 24;
    const n = 16;
    const { ids, mask, lens } = randomBatch(11, n, T);
    const h = data((await embed.run(feeds(ids, mask))).last_hidden_state);
    const embs = lens.map((len, i) => meanPool(h, T, 128, i, len));
    let sum = 0;
    let max = -1;
    let pairs = 0;
    for (let i = 0; i < n; i++) {
      for (let j = i + 1; j < n; j++) {
        const c = cosine(embs[i]!, embs[j]!);
        sum += c;
        max = Math.max(max, c);
        pairs++;
      }
    }
    expect(sum / pairs).toBeLessThan(0.85);
    expect(max).toBeLessThan(0.98);

    const logits = data((await intent.run(feeds(ids, mask))).logits);
    const L = INTENT_LABELS.length;
    const argmax = new Set<number>();
    let spread = 0;
    for (let i = 0; i < n; i++) {
      const row = Array.from(logits.subarray(i * L, (i + 1) * L));
      argmax.add(row.indexOf(Math.max(...row)));
      if (i > 0) spread = Math.max(spread, maxAbsDiff(row, logits.subarray(0, L)));
    }
    expect(spread).toBeGreaterThan(0.5);
    expect(argmax.size).toBeGreaterThan(1);
  });
});

describe('preset folders', () => {
  it('config.json is a BertConfig with the marker and labels', () => {
    const cfg = buildConfigJson(getPreset('tiny-intent')) as Record<string, any>;
    expect(cfg.architectures).toEqual(['BertForSequenceClassification']);
    expect(cfg.model_type).toBe('bert');
    expect(cfg.id2label['7']).toBe('talk_to_human');
    expect(cfg.label2id.billing).toBe(0);
    expect(cfg._slabserve).toEqual({ generated: true, seed: getPreset('tiny-intent').spec.seed, note: 'random weights' });
    const emb = buildConfigJson(getPreset('minilm-l6')) as Record<string, any>;
    expect(emb.architectures).toEqual(['BertModel']);
    expect([emb.num_hidden_layers, emb.hidden_size, emb.num_attention_heads, emb.intermediate_size]).toEqual([6, 384, 12, 1536]);
    expect(emb.id2label).toBeUndefined();
    const seeds = ['tiny-embed', 'tiny-intent', 'minilm-l6', 'bert-base'].map((n) => getPreset(n).spec.seed);
    expect(new Set(seeds).size).toBe(4);
  });

  it('writePreset writes a complete folder the model loader accepts', () => {
    const out = mkdtempSync(join(tmpdir(), 'slabserve-modelgen-'));
    try {
      writePreset('tiny-intent', out);
      const dir = join(out, 'tiny-intent');
      expect(isModelFolderComplete(dir)).toBe(true);
      expect(JSON.parse(readFileSync(join(dir, 'serve.json'), 'utf8'))).toEqual({ task: 'classify' });
      const spec = loadModelSpec(dir);
      expect(spec.task).toBe('classify');
      expect(spec.labels).toEqual([...INTENT_LABELS]);
      expect(spec.hiddenSize).toBe(128);
      expect(isModelFolderComplete(join(out, 'nope'))).toBe(false);
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });
});
