/**
 * BGE-M3: dense, sparse and colbert from one pass (`/embed` with `outputs`),
 * on a folder laid out as BAAI/bge-m3's (an XLM-RoBERTa encoder with CLS
 * pooling and Normalize, and FlagEmbedding's colbert_linear and sparse_linear
 * beside it, here as safetensors).
 *
 * The reference is this file's own, as FlagEmbedding's M3Embedder computes
 * it: the unmodified model.onnx on one input alone; dense = the first token's
 * state, normalised; sparse = relu(sparse_linear(h)) per token, the largest per
 * token id, the tokenizer's cls/eos/pad/unk ids and weights <= 0 left out;
 * colbert = colbert_linear(h) of every token after the first, normalised. The
 * heads' weights are read by the test's own safetensors reader.
 */
import * as grpc from '@grpc/grpc-js';
import { copyFileSync, cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as ort from 'onnxruntime-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { writePreset } from '../dist/models/generator/presets.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { loadModelSpec } from '../dist/src/shared/model-format/model-config.js';
import { readSafetensors } from '../dist/src/shared/model-format/safetensors.js';
import { grpcJsPackages, unaryCall } from './fixtures/grpc-js-client.js';
import { parseMetrics } from './fixtures/http-client.js';
import { sentTogether } from './fixtures/queued-together.js';
import { readF32Tensors } from './fixtures/safetensors.js';
import { makeRandom, randomTexts, testServerConfig, wsRequest } from './helpers.js';

process.env.SLABSERVE_TEST_HOOKS = '1';

const TOLERANCE = 1e-5;
const TEI_PROTO = fileURLToPath(new URL('../proto/tei.proto', import.meta.url));
const SLABSERVE_PROTO = fileURLToPath(new URL('../proto/slabserve.proto', import.meta.url));
type Entry = { index: number; value: number };
type Outputs = { dense: number[]; sparse: Entry[]; colbert: number[][] };

let root: string;
let m3Dir: string;
let server: Server;
let session: ort.InferenceSession;
let tok: TextTokenizer;
let words: string[];
let heads: { colbert: { w: Float32Array; b: Float32Array; dim: number }; sparse: { w: Float32Array; b: number } };
let unused: Set<number>;

/** The reference's three outputs for one text, in float64. */
async function reference(text: string): Promise<{ dense: Float64Array; sparse: Entry[]; colbert: Float64Array[] }> {
  const ids = Array.from(tok.encode(text, { maxLength: 512, truncate: false }).ids);
  const n = ids.length;
  const i64 = (v: number[]) => new ort.Tensor('int64', BigInt64Array.from(v, BigInt), [1, n]);
  const h = (await session.run({ input_ids: i64(ids), attention_mask: i64(ids.map(() => 1)) })).last_hidden_state!.data as Float32Array;
  const H = h.length / n;
  const normalised = (v: Float64Array) => v.map((x) => x / Math.max(Math.hypot(...v), 1e-12));
  const state = (t: number) => h.subarray(t * H, (t + 1) * H);
  const dense = normalised(Float64Array.from(state(0)));
  const best = new Map<number, number>();
  const colbert: Float64Array[] = [];
  for (let t = 0; t < n; t++) {
    let w = heads.sparse.b;
    for (let i = 0; i < H; i++) w += heads.sparse.w[i]! * state(t)[i]!;
    if (w > 0 && !unused.has(ids[t]!) && w > (best.get(ids[t]!) ?? 0)) best.set(ids[t]!, w);
    if (t === 0) continue;
    const { w: cw, b: cb, dim } = heads.colbert;
    const v = new Float64Array(dim);
    for (let o = 0; o < dim; o++) {
      let s = cb[o]!;
      for (let i = 0; i < H; i++) s += cw[o * H + i]! * state(t)[i]!;
      v[o] = s;
    }
    colbert.push(normalised(v));
  }
  const sparse = [...best.entries()].sort((a, b) => a[0] - b[0]).map(([index, value]) => ({ index, value }));
  return { dense, sparse, colbert };
}

function maxDiff(got: ArrayLike<number>, want: ArrayLike<number>, what: string): number {
  expect(got.length, `${what}: length`).toBe(want.length);
  let worst = 0;
  for (let k = 0; k < want.length; k++) worst = Math.max(worst, Math.abs(got[k]! - want[k]!));
  return worst;
}

/**
 * Fails unless `got` holds exactly the outputs `asked`, each of the reference's length, and each is the
 * reference within TOLERANCE (sparse ids exactly); returns the worst difference.
 */
function expectOutputs(got: Partial<Outputs>, want: Awaited<ReturnType<typeof reference>>, what: string, asked: readonly (keyof Outputs)[]): number {
  expect(Object.keys(got).filter((k) => got[k as keyof Outputs] !== undefined).sort(), `${what}: the outputs`).toEqual([...asked].sort());
  for (const k of asked) expect(got[k]!.length, `${what}: ${k}'s length`).toBe(want[k].length);
  let worst = 0;
  if (got.dense) worst = Math.max(worst, maxDiff(got.dense, want.dense, `${what} dense`));
  if (got.sparse) {
    expect(got.sparse.map((e) => e.index), `${what}: sparse ids`).toEqual(want.sparse.map((e) => e.index));
    worst = Math.max(worst, maxDiff(got.sparse.map((e) => e.value), want.sparse.map((e) => e.value), `${what} sparse`));
  }
  if (got.colbert) {
    expect(got.colbert.length, `${what}: colbert vectors`).toBe(want.colbert.length);
    got.colbert.forEach((v, t) => (worst = Math.max(worst, maxDiff(v, want.colbert[t]!, `${what} colbert ${t}`))));
  }
  expect(worst, `${what}: the values`).toBeLessThan(TOLERANCE);
  return worst;
}

async function post(path: string, body: unknown): Promise<{ status: number; body: any }> {
  const r = await fetch(`${server.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

const rowsRun = async () => parseMetrics(await (await fetch(`${server.url}/metrics`)).text()).sum('slabserve_batch_size_sum', { model: 'tiny-m3' });

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), 'slabserve-m3-'));
  m3Dir = writePreset('tiny-m3', root).dir;
  session = await ort.InferenceSession.create(readFileSync(join(m3Dir, 'model.onnx')), { executionProviders: ['cpu'], intraOpNumThreads: 1 });
  const c = readF32Tensors(join(m3Dir, 'colbert_linear.safetensors'));
  const s = readF32Tensors(join(m3Dir, 'sparse_linear.safetensors'));
  heads = { colbert: { w: c.get('weight')!.data, b: c.get('bias')!.data, dim: c.get('weight')!.shape[0]! }, sparse: { w: s.get('weight')!.data, b: s.get('bias')!.data[0]! } };
  const tj = JSON.parse(readFileSync(join(m3Dir, 'tokenizer.json'), 'utf8')) as { added_tokens: { id: number; content: string }[] };
  const tc = JSON.parse(readFileSync(join(m3Dir, 'tokenizer_config.json'), 'utf8')) as Record<string, string>;
  const idOf = (t: string) => tj.added_tokens.find((a) => a.content === t)!.id;
  unused = new Set(['cls_token', 'eos_token', 'pad_token', 'unk_token'].filter((k) => tc[k]).map((k) => idOf(tc[k]!)));
  tok = await loadTokenizer(loadModelSpec(m3Dir).tokenizerPath);
  words = ['where', 'is', 'my', 'parcel', 'refund', 'the', 'order', 'cancel', 'password', 'account', 'delivery', 'late', 'help', 'please', 'today', 'payment'];
  server = await startServer(testServerConfig({ models: ['tiny-embed', m3Dir], slotsPerModel: 64 }));
  await server.ready;
}, 120_000);

afterAll(async () => {
  await server?.close();
  await session?.release();
  if (root) rmSync(root, { recursive: true, force: true });
});

describe('a BGE-M3 folder', () => {
  it('is read with its heads: dense, sparse and colbert; the ids sparse leaves out are the tokenizer\'s cls, eos, pad and unk', () => {
    const spec = loadModelSpec(m3Dir);
    expect([spec.pooling, spec.normalize, spec.outputs, spec.tokenWidth, spec.m3!.colbert.dim]).toEqual(['cls', true, ['dense', 'sparse', 'colbert'], 129, 128]);
    expect(new Set(spec.m3!.unusedIds)).toEqual(unused);
    expect(unused.size).toBe(4);
  });

  it('with only the torch pickles, is served dense and says how to convert them; one head alone or a wrong shape is refused', () => {
    const variant = (name: string, change: (dir: string) => void) => {
      const dir = join(root, name);
      cpSync(m3Dir, dir, { recursive: true });
      change(dir);
      return dir;
    };
    const pickles = variant('m3-pt', (d) => {
      for (const h of ['colbert_linear', 'sparse_linear']) {
        copyFileSync(join(d, `${h}.safetensors`), join(d, `${h}.pt`)); // stands for the pickle: its bytes are never read
        rmSync(join(d, `${h}.safetensors`));
      }
    });
    const spec = loadModelSpec(pickles);
    expect(spec.outputs).toEqual(['dense', 'tokens']);
    expect(spec.warnings.join('\n')).toMatch(/colbert_linear.pt and sparse_linear.pt are torch pickles, not read: served dense only.*safetensors/);
    expect(() => loadModelSpec(variant('m3-half', (d) => rmSync(join(d, 'sparse_linear.safetensors'))))).toThrow(/sparse_linear.safetensors is missing/);
    expect(() =>
      loadModelSpec(variant('m3-wide', (d) => copyFileSync(join(d, 'colbert_linear.safetensors'), join(d, 'sparse_linear.safetensors')))),
    ).toThrow(/sparse_linear.safetensors weight is \[128,128\], expected \[1,128\]/);
  });

  it('heads stored in half precision (F16, BF16) are read as float32', () => {
    const path = join(root, 'half.safetensors');
    // 1.5, -2, 65504 (the largest half), 2^-24 (the smallest subnormal); bf16 of 1.5 and -3.
    const f16 = Buffer.from(Uint16Array.from([0x3e00, 0xc000, 0x7bff, 0x0001]).buffer);
    const bf16 = Buffer.from(Uint16Array.from([0x3fc0, 0xc040]).buffer);
    const header = JSON.stringify({ h: { dtype: 'F16', shape: [4], data_offsets: [0, 8] }, b: { dtype: 'BF16', shape: [2], data_offsets: [8, 12] } });
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(header.length));
    writeFileSync(path, Buffer.concat([len, Buffer.from(header), f16, bf16]));
    const t = readSafetensors(path);
    expect(Array.from(t.get('h')!.data)).toEqual([1.5, -2, 65504, 2 ** -24]);
    expect(Array.from(t.get('b')!.data)).toEqual([1.5, -3]);
  });
});

describe('/embed with outputs on BGE-M3', () => {
  it('dense, sparse and colbert of many lengths queued together: each the reference\'s within 1e-5, sparse ids exactly; one row run per input', async () => {
    const texts = randomTexts(makeRandom('m3 outputs'), words, 12, 40);
    const before = await rowsRun();
    const answers = await sentTogether(server.testHooks, { 'tiny-m3': texts.length }, () =>
      Promise.all(texts.map((t) => post('/embed', { model: 'tiny-m3', inputs: t, outputs: ['dense', 'sparse', 'colbert'] }))),
    );
    expect((await rowsRun()) - before).toBe(texts.length); // three outputs, one pass
    let worst = 0;
    let entries = 0;
    for (const [i, t] of texts.entries()) {
      const a = answers[i]!;
      expect(a.status, JSON.stringify(a.body).slice(0, 300)).toBe(200);
      expect(Object.keys(a.body[0])).toEqual(['dense', 'sparse', 'colbert']);
      const want = await reference(t);
      worst = Math.max(worst, expectOutputs(a.body[0], want, `"${t}"`, ['dense', 'sparse', 'colbert']));
      entries += want.sparse.length;
    }
    console.log(`m3: ${texts.length} inputs, ${entries} sparse entries, worst |diff| ${worst.toExponential(2)}`);
    expect(entries).toBeGreaterThan(texts.length); // the sparse comparison compared something
  });

  it('the three outputs of one pass equal three separate computations: outputs one at a time, /embed and /embed_sparse', async () => {
    const texts = randomTexts(makeRandom('m3 separately'), words, 4, 30);
    const all = await post('/embed', { model: 'tiny-m3', inputs: texts, outputs: ['colbert', 'sparse', 'dense'] });
    expect(all.status).toBe(200);
    const alone = await Promise.all((['dense', 'sparse', 'colbert'] as const).map((o) => post('/embed', { model: 'tiny-m3', inputs: texts, outputs: [o] })));
    const dense = await post('/embed', { model: 'tiny-m3', inputs: texts });
    const sparse = await post('/embed_sparse', { model: 'tiny-m3', inputs: texts });
    for (let i = 0; i < texts.length; i++) {
      expect(Object.keys(alone[0]!.body[i])).toEqual(['dense']);
      expect(alone[0]!.body[i].dense).toEqual(all.body[i].dense);
      expect(alone[1]!.body[i].sparse).toEqual(all.body[i].sparse);
      expect(alone[2]!.body[i].colbert).toEqual(all.body[i].colbert);
      expect(dense.body[i]).toEqual(all.body[i].dense);
      expect(sparse.body[i]).toEqual(all.body[i].sparse);
      expectOutputs(all.body[i], await reference(texts[i]!), `input ${i}`, ['dense', 'sparse', 'colbert']);
    }
    const raw = await post('/embed', { model: 'tiny-m3', inputs: texts[0], outputs: ['dense'], normalize: false });
    expect(Math.hypot(...raw.body[0].dense)).not.toBeCloseTo(1, 3); // normalize applies to dense
  });

  it('over WebSocket (op embed with outputs) and gRPC EmbedSparse the same', async () => {
    const [text] = randomTexts(makeRandom('m3 transports'), words, 1, 20);
    const want = await reference(text!);
    const frame = await wsRequest(server.port, { id: 'm', op: 'embed', model: 'tiny-m3', inputs: [text], outputs: ['sparse', 'colbert'] });
    expect(frame.error).toBeUndefined();
    expectOutputs(frame.result[0], want, 'WebSocket', ['sparse', 'colbert']);
    const client = new (grpcJsPackages(TEI_PROTO).tei.v1.Embed)(`127.0.0.1:${server.grpcPort}`, grpc.credentials.createInsecure());
    try {
      const metadata = new grpc.Metadata();
      metadata.set('x-model', 'tiny-m3');
      const reply = await unaryCall(client, 'EmbedSparse', { inputs: text }, metadata);
      expectOutputs({ sparse: reply.sparse_embeddings }, want, 'gRPC', ['sparse']);
    } finally {
      client.close();
    }
  });

  it('over gRPC, slabserve.v1.Outputs: Embed (all three when none is named, or those named) and EmbedStream, each the reference', async () => {
    const texts = randomTexts(makeRandom('m3 grpc outputs'), words, 3, 25);
    const client = new (grpcJsPackages([TEI_PROTO, SLABSERVE_PROTO]).slabserve.v1.Outputs)(`127.0.0.1:${server.grpcPort}`, grpc.credentials.createInsecure());
    const metadata = new grpc.Metadata();
    metadata.set('x-model', 'tiny-m3');
    const asOutputs = (m: { dense: number[]; sparse: Entry[]; colbert: { embeddings: number[] }[] }): Partial<Outputs> => ({
      ...(m.dense.length ? { dense: m.dense } : {}),
      ...(m.sparse.length ? { sparse: m.sparse } : {}),
      ...(m.colbert.length ? { colbert: m.colbert.map((v) => v.embeddings) } : {}),
    });
    try {
      const all = await unaryCall(client, 'Embed', { inputs: texts[0] }, metadata);
      const want = await reference(texts[0]!);
      expect([all.dense.length, all.colbert.length]).toEqual([want.dense.length, want.colbert.length]);
      expectOutputs(asOutputs(all), want, 'gRPC Embed, all', ['dense', 'sparse', 'colbert']);
      const sparse = await unaryCall(client, 'Embed', { inputs: texts[0], outputs: ['sparse'] }, metadata);
      expect([sparse.dense.length, sparse.colbert.length, sparse.sparse.length]).toEqual([0, 0, want.sparse.length]);
      const stream = client.EmbedStream(metadata);
      const replies: Parameters<typeof asOutputs>[0][] = [];
      const ended = new Promise<void>((resolve, reject) => {
        stream.on('data', (m: Parameters<typeof asOutputs>[0]) => replies.push(m));
        stream.on('end', resolve);
        stream.on('error', reject);
      });
      for (const t of texts) stream.write({ inputs: t, outputs: ['dense', 'colbert'] });
      stream.end();
      await ended;
      expect(replies).toHaveLength(texts.length);
      for (const [i, t] of texts.entries()) expectOutputs(asOutputs(replies[i]!), await reference(t), `gRPC EmbedStream ${i}`, ['dense', 'colbert']);
      const plain = new grpc.Metadata();
      plain.set('x-model', 'tiny-embed');
      const err = (await unaryCall(client, 'Embed', { inputs: 'x', outputs: ['colbert'] }, plain).catch((e: unknown) => e)) as grpc.ServiceError;
      expect([err.code, err.metadata.get('slabserve-code')[0]]).toEqual([grpc.status.FAILED_PRECONDITION, 'SLABSERVE_OUTPUT_UNAVAILABLE']);
    } finally {
      client.close();
    }
  });

  it('refuses what it cannot answer: an output the model lacks (424), a bad list (422), quantized types with outputs, /embed_all on M3', async () => {
    const lacks = await post('/embed', { model: 'tiny-embed', inputs: 'hello', outputs: ['dense', 'colbert'] });
    expect([lacks.status, lacks.body.code]).toEqual([424, 'SLABSERVE_OUTPUT_UNAVAILABLE']);
    expect(lacks.body.error).toMatch(/"tiny-embed" has no colbert output: it gives dense and tokens/);
    for (const outputs of [[], ['dense', 'dense'], ['tokens'], 'dense']) {
      const r = await post('/embed', { model: 'tiny-m3', inputs: 'hello', outputs });
      expect([r.status, r.body.code], JSON.stringify(outputs)).toEqual([422, 'SLABSERVE_INVALID_INPUT']);
      expect(r.body.error).toMatch(/outputs/);
    }
    const int8 = await post('/embed', { model: 'tiny-m3', inputs: 'hello', outputs: ['dense'], embedding_type: 'int8' });
    expect([int8.status, int8.body.code]).toEqual([422, 'SLABSERVE_INVALID_INPUT']);
    const all = await post('/embed_all', { model: 'tiny-m3', inputs: 'hello' });
    expect([all.status, all.body.code]).toEqual([424, 'SLABSERVE_OUTPUT_UNAVAILABLE']);
    // outputs on an ordinary model: the dense rows, as objects
    const plain = await post('/embed', { model: 'tiny-embed', inputs: ['a', 'b'], outputs: ['dense'] });
    const rows = await post('/embed', { model: 'tiny-embed', inputs: ['a', 'b'] });
    expect(plain.body.map((x: { dense: number[] }) => x.dense)).toEqual(rows.body);
  });
});
