/**
 * SPLADE: sentence-transformers SparseEncoder folders (MLMTransformer, then
 * SpladePooling) served on /embed_sparse as text-embeddings-inference answers
 * it, and on /embed as vocabulary-wide rows.
 *
 * The reference is independent of the server's graph: a plain onnxruntime
 * session of the unmodified model.onnx, one input at a time, unpadded, whose
 * masked-LM logits are pooled here by this file's own code, as SpladePooling
 * does (log(1 + relu(logit)), log1p twice with log1p_relu, max or sum over
 * the tokens). The server answers the same inputs queued together (held
 * before the inference loop takes them: test/fixtures/queued-together.ts), so
 * they run batched and padded.
 */
import * as grpc from '@grpc/grpc-js';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as ort from 'onnxruntime-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { writePreset } from '../dist/models/generator/presets.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { parseMetrics } from './fixtures/http-client.js';
import { loadModelSpec } from '../dist/src/shared/model-format/model-config.js';
import { grpcJsPackages, unaryCall } from './fixtures/grpc-js-client.js';
import { sentTogether } from './fixtures/queued-together.js';
import { makeRandom, randomTexts, testServerConfig, vocabularyWords, wsRequest } from './helpers.js';

process.env.SLABSERVE_TEST_HOOKS = '1';

const TOLERANCE = 1e-5;
const MAX_LENGTH = 64;
const TEI_PROTO = fileURLToPath(new URL('../proto/tei.proto', import.meta.url));

type Entry = { index: number; value: number };
type Splade = { strategy: 'max' | 'sum'; activation: 'relu' | 'log1p_relu' };

let root: string;
let spladeDir: string;
let sumDir: string;
let server: Server;
let plain: ort.InferenceSession;
let tok: TextTokenizer;
let words: string[];

/** A copy of the SPLADE folder whose SpladePooling config says `s`. */
function spladeVariant(name: string, s: Splade): string {
  const dir = join(root, name);
  cpSync(spladeDir, dir, { recursive: true });
  writeFileSync(join(dir, '1_SpladePooling', 'config.json'), JSON.stringify({ pooling_strategy: s.strategy, activation_function: s.activation }));
  return dir;
}

/** The masked-LM logits of one input alone, [n, V], from the unmodified graph. */
async function logits(ids: Int32Array): Promise<{ data: Float32Array; vocab: number }> {
  const n = ids.length;
  const i64 = (f: (i: number) => number) => new ort.Tensor('int64', BigInt64Array.from({ length: n }, (_, i) => BigInt(f(i))), [1, n]);
  const out = await plain.run({ input_ids: i64((i) => ids[i]!), attention_mask: i64(() => 1), token_type_ids: i64(() => 0) });
  const t = out.logits!;
  return { data: t.data as Float32Array, vocab: Number(t.dims[2]) };
}

/** SpladePooling over one unpadded input's logits, in float64: every entry (zeros included), by token id. */
function spladeRow(l: { data: Float32Array; vocab: number }, s: Splade): Float64Array {
  const n = l.data.length / l.vocab;
  const row = new Float64Array(l.vocab);
  for (let t = 0; t < n; t++) {
    for (let v = 0; v < l.vocab; v++) {
      let w = Math.log1p(Math.max(0, l.data[t * l.vocab + v]!));
      if (s.activation === 'log1p_relu') w = Math.log1p(w);
      row[v] = s.strategy === 'max' ? Math.max(row[v]!, w) : row[v]! + w;
    }
  }
  return row;
}

/** The reference's non-zero entries, ids ascending. */
function nonZeros(row: Float64Array): Entry[] {
  const out: Entry[] = [];
  for (let v = 0; v < row.length; v++) if (row[v] !== 0) out.push({ index: v, value: row[v]! });
  return out;
}

/** Fails unless `got` has exactly the reference's ids, each value within TOLERANCE; returns the worst difference. */
function expectSparse(got: Entry[], want: Entry[], what: string): number {
  expect(got.map((e) => e.index), `${what}: the non-zero ids`).toEqual(want.map((e) => e.index));
  let worst = 0;
  for (let k = 0; k < want.length; k++) worst = Math.max(worst, Math.abs(got[k]!.value - want[k]!.value));
  expect(worst, `${what}: the values`).toBeLessThan(TOLERANCE);
  return worst;
}

const idsOf = (text: string) => tok.encode(text, { maxLength: MAX_LENGTH, truncate: false }).ids;

async function post(path: string, body: unknown): Promise<{ status: number; body: any }> {
  const r = await fetch(`${server.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), 'slabserve-sparse-'));
  spladeDir = writePreset('tiny-splade', root, { maxLength: MAX_LENGTH }).dir;
  sumDir = spladeVariant('splade-sum', { strategy: 'sum', activation: 'log1p_relu' });
  plain = await ort.InferenceSession.create(readFileSync(join(spladeDir, 'model.onnx')), { executionProviders: ['cpu'], intraOpNumThreads: 1 });
  const spec = loadModelSpec(spladeDir);
  tok = await loadTokenizer(spec.tokenizerPath);
  words = vocabularyWords(spec);
  // tiny-embed first: /embed_sparse naming no model must find the SPLADE one, not the first embedding model.
  server = await startServer(testServerConfig({ models: ['tiny-embed', spladeDir, sumDir], slotsPerModel: 64, batching: { maxBatchTokens: 2048 } }));
  await server.ready;
}, 120_000);

afterAll(async () => {
  await server?.close();
  await plain?.release();
  if (root) rmSync(root, { recursive: true, force: true });
});

describe('a SparseEncoder folder is read as sentence-transformers reads it', () => {
  it('MLMTransformer then SpladePooling: pooling splade with its strategy and activation, not normalised, rows as wide as the vocabulary', () => {
    const spec = loadModelSpec(spladeDir);
    expect([spec.task, spec.pooling, spec.splade, spec.normalize, spec.dimension, spec.outputs]).toEqual(['embed', 'splade', { strategy: 'max', activation: 'relu' }, false, 30522, ['dense', 'sparse']]);
    expect(spec.sources.pooling).toBe('1_SpladePooling/config.json');
    expect(loadModelSpec(sumDir).splade).toEqual({ strategy: 'sum', activation: 'log1p_relu' });
  });

  it('/info says what each model answers with', async () => {
    const info = (await (await fetch(`${server.url}/info`)).json()) as { models: { name: string; pooling?: string; outputs?: string[]; dimension: number }[] };
    const of = (name: string) => info.models.find((m) => m.name === name);
    expect(of('tiny-splade')).toMatchObject({ pooling: 'splade', outputs: ['dense', 'sparse'], dimension: 30522 });
    expect(of('tiny-embed')).toMatchObject({ pooling: 'mean', outputs: ['dense', 'tokens'], dimension: 128 });
  });

  it('refuses, naming the file, what it cannot serve as the folder means it', () => {
    const bad = (name: string, change: (dir: string) => void) => {
      const dir = spladeVariant(name, { strategy: 'max', activation: 'relu' });
      change(dir);
      return () => loadModelSpec(dir);
    };
    expect(bad('no-mlm-head', (d) => writeFileSync(join(d, 'config.json'), readFileSync(join(d, 'config.json'), 'utf8').replace('BertForMaskedLM', 'BertModel')))).toThrow(/SPLADE pooling needs a ForMaskedLM model/);
    expect(bad('bad-strategy', (d) => writeFileSync(join(d, '1_SpladePooling', 'config.json'), '{"pooling_strategy": "mean"}'))).toThrow(/1_SpladePooling\/config.json: pooling_strategy must be "max" or "sum"/);
    expect(
      bad('half-chain', (d) => writeFileSync(join(d, 'modules.json'), JSON.stringify([{ idx: 0, name: '0', path: '1_SpladePooling', type: 'sentence_transformers.sparse_encoder.models.SpladePooling' }]))),
    ).toThrow(/needs both MLMTransformer and SpladePooling/);
    expect(
      bad('mixed-chain', (d) => {
        const modules = JSON.parse(readFileSync(join(d, 'modules.json'), 'utf8')) as unknown[];
        writeFileSync(join(d, 'modules.json'), JSON.stringify([...modules, { idx: 2, name: '2', path: '2_Normalize', type: 'sentence_transformers.models.Normalize' }]));
      }),
    ).toThrow(/module 2_Normalize .* is not supported/);
  });
});

describe('/embed_sparse', () => {
  it('batched and padded, every non-zero id is the reference\'s and every value within 1e-5 (max/relu and sum/log1p_relu)', async () => {
    const texts = randomTexts(makeRandom('embed_sparse batched'), words, 20, 40);
    const cases: { model: string; splade: Splade }[] = [
      { model: 'tiny-splade', splade: { strategy: 'max', activation: 'relu' } },
      { model: 'splade-sum', splade: { strategy: 'sum', activation: 'log1p_relu' } },
    ];
    const answers = await sentTogether(server.testHooks, { 'tiny-splade': texts.length, 'splade-sum': texts.length }, () =>
      Promise.all(cases.flatMap((c) => texts.map((t) => post('/embed_sparse', { model: c.model, inputs: t })))),
    );
    let worst = 0;
    let entries = 0;
    for (const [ci, c] of cases.entries()) {
      for (const [i, t] of texts.entries()) {
        const a = answers[ci * texts.length + i]!;
        expect(a.status, JSON.stringify(a.body).slice(0, 300)).toBe(200);
        expect(a.body).toHaveLength(1);
        const want = nonZeros(spladeRow(await logits(idsOf(t)), c.splade));
        worst = Math.max(worst, expectSparse(a.body[0], want, `${c.model} "${t}"`));
        entries += want.length;
      }
    }
    console.log(`embed_sparse: ${2 * texts.length} inputs, ${entries} non-zeros (${(entries / (2 * texts.length)).toFixed(0)} an input), worst |diff| ${worst.toExponential(2)}`);
    expect(entries).toBeGreaterThan(2 * texts.length); // a row is not empty: the comparison compared something
  });

  it('a list of inputs answers one list of entries each, in order; the path names the model; with none named, the first SPLADE model', async () => {
    const texts = randomTexts(makeRandom('embed_sparse list'), words, 5, 30);
    const wants = await Promise.all(texts.map(async (t) => nonZeros(spladeRow(await logits(idsOf(t)), { strategy: 'max', activation: 'relu' }))));
    for (const [path, body] of [
      ['/embed_sparse', { inputs: texts }],
      ['/models/tiny-splade/embed_sparse', { inputs: texts }],
      ['/embed_sparse', { inputs: texts, model: 'tiny-splade' }],
    ] as const) {
      const r = await post(path, body);
      expect(r.status, `${path}: ${JSON.stringify(r.body).slice(0, 200)}`).toBe(200);
      expect(r.body).toHaveLength(texts.length);
      for (let i = 0; i < texts.length; i++) expectSparse(r.body[i], wants[i]!, `${path} input ${i}`);
    }
  });

  it('over WebSocket (op embed_sparse) and gRPC (EmbedSparse) the same entries', async () => {
    const text = randomTexts(makeRandom('embed_sparse transports'), words, 1, 30)[0]!;
    const want = nonZeros(spladeRow(await logits(idsOf(text)), { strategy: 'max', activation: 'relu' }));
    const frame = await wsRequest(server.port, { id: 's', op: 'embed_sparse', inputs: [text], model: 'tiny-splade' });
    expect(frame.error).toBeUndefined();
    expectSparse(frame.result[0], want, 'WebSocket');
    const client = new (grpcJsPackages(TEI_PROTO).tei.v1.Embed)(`127.0.0.1:${server.grpcPort}`, grpc.credentials.createInsecure());
    try {
      const metadata = new grpc.Metadata();
      metadata.set('x-model', 'tiny-splade');
      const reply = await unaryCall(client, 'EmbedSparse', { inputs: text }, metadata);
      expectSparse(reply.sparse_embeddings, want, 'gRPC');
      const dense = (await unaryCall(client, 'EmbedSparse', { inputs: text }, (() => { const m = new grpc.Metadata(); m.set('x-model', 'tiny-embed'); return m; })()).catch((e: unknown) => e)) as grpc.ServiceError;
      expect([dense.code, dense.metadata.get('slabserve-code')[0]]).toEqual([grpc.status.FAILED_PRECONDITION, 'SLABSERVE_OUTPUT_UNAVAILABLE']);
    } finally {
      client.close();
    }
  });

  it('a model without a sparse output is 424 naming what it gives; a bad body is 422 and names the field', async () => {
    const dense = await post('/embed_sparse', { inputs: 'hello', model: 'tiny-embed' });
    expect([dense.status, dense.body.code, dense.body.type]).toEqual([424, 'SLABSERVE_OUTPUT_UNAVAILABLE', 'unsupported_output']);
    expect(dense.body.error).toMatch(/"tiny-embed" has no sparse output .*it gives dense and tokens/);
    expect((await post('/models/tiny-embed/embed_sparse', { inputs: 'hello' })).status).toBe(424);
    const normalize = await post('/embed_sparse', { inputs: 'hello', normalize: true });
    expect([normalize.status, normalize.body.code]).toEqual([422, 'SLABSERVE_INVALID_INPUT']);
    expect(normalize.body.error).toMatch(/normalize/);
    const empty = await post('/embed_sparse', { inputs: [] });
    expect([empty.status, empty.body.code]).toEqual([422, 'SLABSERVE_INVALID_INPUT']);
  });
});

describe('/embed on a SPLADE model', () => {
  it('runs its graph unfused, where the dense model beside it is fused: its zero entries turn on the signs of its logits', async () => {
    const metrics = parseMetrics(await (await fetch(`${server.url}/metrics`)).text());
    for (const name of ['slabserve_model_fused_layer_norms', 'slabserve_model_fused_attentions']) {
      expect(metrics.sum(name, { model: 'tiny-splade' }), name).toBe(0);
      expect(metrics.sum(name, { model: 'tiny-embed' }), name).toBeGreaterThan(0);
    }
  });

  it('answers the vocabulary-wide row: the reference weights at every id, zeros included', async () => {
    const texts = randomTexts(makeRandom('splade embed'), words, 6, 30);
    const r = await post('/embed', { model: 'tiny-splade', inputs: texts });
    expect(r.status).toBe(200);
    for (const [i, t] of texts.entries()) {
      const want = spladeRow(await logits(idsOf(t)), { strategy: 'max', activation: 'relu' });
      const got = r.body[i] as number[];
      expect(got).toHaveLength(want.length);
      let worst = 0;
      for (let v = 0; v < want.length; v++) {
        if ((want[v] === 0) !== (got[v] === 0)) throw new Error(`input ${i} id ${v}: got ${got[v]}, the reference ${want[v]}`);
        worst = Math.max(worst, Math.abs(got[v]! - want[v]!));
      }
      expect(worst).toBeLessThan(TOLERANCE);
    }
  });

  it('refuses normalize: true (424, as TEI) and quantized embedding types', async () => {
    const normalize = await post('/embed', { model: 'tiny-splade', inputs: 'hello', normalize: true });
    expect([normalize.status, normalize.body.code]).toEqual([424, 'SLABSERVE_OUTPUT_UNAVAILABLE']);
    expect(normalize.body.error).toMatch(/`normalize` is not available for SPLADE models/);
    const int8 = await post('/embed', { model: 'tiny-splade', inputs: 'hello', embedding_type: 'int8' });
    expect([int8.status, int8.body.code]).toEqual([424, 'SLABSERVE_OUTPUT_UNAVAILABLE']);
    // normalize: false is what it serves anyway
    expect((await post('/embed', { model: 'tiny-splade', inputs: 'hello', normalize: false })).status).toBe(200);
  });
});
