/**
 * ColBERT: PyLate folders (Transformer, then its Dense) served on /embed_all
 * with `input_type` query or document, as PyLate's ColBERT.encode answers.
 *
 * The reference is this file's own: it marks and expands the ids as PyLate's
 * tokenize does ([CLS], the marker, the text cut to its length less one,
 * [SEP], a query padded with [MASK] that the attention does not see), runs
 * the unmodified model.onnx on one input alone, projects the token states with
 * the Dense weights it reads from 1_Dense/model.safetensors itself
 * (fixtures/safetensors.ts), normalises
 * in float64 and drops a document's skiplist tokens. The server answers the
 * same texts queued together, queries and documents of many lengths in one go.
 * A chunked long document is windowed and joined by this file's own code.
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
import { loadModelSpec } from '../dist/src/shared/model-format/model-config.js';
import { grpcJsPackages, unaryCall } from './fixtures/grpc-js-client.js';
import { readF32Tensors } from './fixtures/safetensors.js';
import { sentTogether } from './fixtures/queued-together.js';
import { makeRandom, randomTexts, testServerConfig, vocabularyWords, wsRequest } from './helpers.js';

process.env.SLABSERVE_TEST_HOOKS = '1';

const TOLERANCE = 1e-5;
const TEI_PROTO = fileURLToPath(new URL('../proto/tei.proto', import.meta.url));
type Kind = 'query' | 'document';

/** What the reference reads of a PyLate folder, by its own code. */
interface Folder {
  dir: string;
  session: ort.InferenceSession;
  weight: Float32Array; // [out, in]
  out: number;
  hidden: number;
  st: { query_prefix: string; document_prefix: string; query_length: number; document_length: number; do_query_expansion: boolean; attend_to_expansion_tokens: boolean; skiplist_words: string[] };
  vocab: Map<string, number>;
}

let root: string;
let server: Server;
/** tiny-colbert alone, --chunk-overlap-tokens OVERLAP. */
let overlapping: Server;
const OVERLAP = 10;
let tok: TextTokenizer;
let words: string[];
const folders = new Map<string, Folder>();

async function readFolder(dir: string): Promise<Folder> {
  const { data, shape } = readF32Tensors(join(dir, '1_Dense', 'model.safetensors')).get('linear.weight')!;
  const tj = JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')) as { model: { vocab: Record<string, number> }; added_tokens: { id: number; content: string }[] };
  const vocab = new Map(Object.entries(tj.model.vocab));
  for (const a of tj.added_tokens) vocab.set(a.content, a.id);
  const session = await ort.InferenceSession.create(readFileSync(join(dir, 'model.onnx')), { executionProviders: ['cpu'], intraOpNumThreads: 1 });
  return { dir, session, weight: data, out: shape[0]!, hidden: shape[1]!, st: JSON.parse(readFileSync(join(dir, 'config_sentence_transformers.json'), 'utf8')), vocab };
}

/** A copy of tiny-colbert whose config_sentence_transformers.json has `change` applied. */
function variant(name: string, change: (st: Record<string, unknown>) => void): string {
  const dir = join(root, name);
  cpSync(join(root, 'tiny-colbert'), dir, { recursive: true });
  const path = join(dir, 'config_sentence_transformers.json');
  const st = JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown>;
  change(st);
  writeFileSync(path, JSON.stringify(st));
  return dir;
}

/** PyLate's ids and attention mask for one text: [CLS] marker text... [SEP], cut to the length; a query padded with [MASK]. */
function pylateInput(f: Folder, text: string, kind: Kind): { ids: number[]; mask: number[] } {
  const length = kind === 'query' ? f.st.query_length : f.st.document_length;
  const marker = f.vocab.get(kind === 'query' ? f.st.query_prefix : f.st.document_prefix)!;
  const enc = Array.from(tok.encode(text, { maxLength: length - 1, truncate: true }).ids);
  const ids = [enc[0]!, marker, ...enc.slice(1)];
  const mask = ids.map(() => 1);
  if (kind === 'query' && f.st.do_query_expansion) {
    while (ids.length < length) {
      ids.push(f.vocab.get('[MASK]')!);
      mask.push(f.st.attend_to_expansion_tokens ? 1 : 0);
    }
  }
  return { ids, mask };
}

/** The reference's token vectors for one text: the graph alone, the Dense projection, normalised; a document's skiplist dropped. */
async function reference(f: Folder, text: string, kind: Kind): Promise<Float64Array[]> {
  const { ids, mask } = pylateInput(f, text, kind);
  const rows = await vectorsOf(f, ids, mask);
  return kind === 'document' ? withoutSkiplist(f, ids, rows) : rows;
}

/** A document's vectors less those of its skiplist tokens. */
function withoutSkiplist(f: Folder, ids: number[], rows: Float64Array[]): Float64Array[] {
  const skip = new Set(f.st.skiplist_words.map((w) => f.vocab.get(w)).filter((id) => id !== undefined));
  return rows.filter((_, t) => !skip.has(ids[t]!));
}

/** Every token's vector of one input run alone: the graph, the Dense projection, normalised in float64. */
async function vectorsOf(f: Folder, ids: number[], mask: number[]): Promise<Float64Array[]> {
  const n = ids.length;
  const i64 = (v: number[]) => new ort.Tensor('int64', BigInt64Array.from(v, BigInt), [1, n]);
  const out = await f.session.run({ input_ids: i64(ids), attention_mask: i64(mask), token_type_ids: i64(ids.map(() => 0)) });
  const states = out.last_hidden_state!.data as Float32Array;
  const rows: Float64Array[] = [];
  for (let t = 0; t < n; t++) {
    const v = new Float64Array(f.out);
    for (let o = 0; o < f.out; o++) {
      let s = 0;
      for (let i = 0; i < f.hidden; i++) s += f.weight[o * f.hidden + i]! * states[t * f.hidden + i]!;
      v[o] = s;
    }
    const norm = Math.max(Math.hypot(...v), 1e-12);
    rows.push(v.map((x) => x / norm));
  }
  return rows;
}

/**
 * A long document as this file windows it: the text's tokens (unmarked, never
 * cut) in windows of document_length - 3 ([CLS], [D] and [SEP] take three),
 * each `overlap` tokens into the one before, each window run alone as PyLate
 * runs one document, and their vectors joined: the first window's [CLS] and
 * [D], each window's text tokens less the overlap, the last window's [SEP];
 * then the skiplist's dropped.
 */
async function chunkedReference(f: Folder, text: string, overlap: number): Promise<{ vectors: Float64Array[]; windows: number }> {
  const enc = Array.from(tok.encode(text, { maxLength: 100_000, truncate: false }).ids);
  const [cls, sep] = [enc[0]!, enc[enc.length - 1]!];
  const body = enc.slice(1, -1);
  const marker = f.vocab.get(f.st.document_prefix)!;
  const step = f.st.document_length - 3;
  const ids = [cls, marker];
  const joined: Float64Array[] = [];
  let windows = 0;
  for (let s = 0; ; s += step - overlap) {
    const slice = body.slice(s, s + step);
    const window = [cls, marker, ...slice, sep];
    const rows = await vectorsOf(f, window, window.map(() => 1));
    windows++;
    if (s === 0) joined.push(rows[0]!, rows[1]!);
    const from = s === 0 ? 0 : overlap;
    joined.push(...rows.slice(2 + from, 2 + slice.length));
    ids.push(...slice.slice(from));
    if (s + step >= body.length) {
      joined.push(rows[rows.length - 1]!);
      ids.push(sep);
      return { vectors: withoutSkiplist(f, ids, joined), windows };
    }
  }
}

/** A punctuated text (the skiplist's work) of at least `tokens` tokens, [CLS] and [SEP] included. */
function textOfTokens(label: string, tokens: number): string {
  const rand = makeRandom(label);
  const list: string[] = [];
  while (tok.encode(list.join(' '), { maxLength: 100_000, truncate: false }).ids.length < tokens) {
    const w = words[Math.floor(rand() * words.length)]!;
    list.push(rand() < 0.2 ? `${w}${'.,!?'[Math.floor(rand() * 4)]}` : w);
  }
  return list.join(' ');
}

function expectVectors(got: number[][], want: Float64Array[], what: string): number {
  expect(got.length, `${what}: vectors`).toBe(want.length);
  let worst = 0;
  for (let t = 0; t < want.length; t++) {
    expect(got[t]!.length, `${what}: vector ${t}'s width`).toBe(want[t]!.length);
    for (let k = 0; k < want[t]!.length; k++) worst = Math.max(worst, Math.abs(got[t]![k]! - want[t]![k]!));
  }
  expect(worst, `${what}: the values`).toBeLessThan(TOLERANCE);
  return worst;
}

async function post(path: string, body: unknown, to: Server = server): Promise<{ status: number; body: any; headers: Headers }> {
  const r = await fetch(`${to.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json(), headers: r.headers };
}

/** Texts with punctuation in them (the skiplist's work), of many lengths. */
function texts(label: string, count: number, maxWords: number): string[] {
  const rand = makeRandom(label);
  return randomTexts(rand, words, count, maxWords).map((t) => t.split(' ').map((w) => (rand() < 0.2 ? `${w}${'.,!?'[Math.floor(rand() * 4)]}` : w)).join(' '));
}

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), 'slabserve-colbert-'));
  const base = writePreset('tiny-colbert', root).dir;
  const attending = variant('colbert-attend', (st) => (st.attend_to_expansion_tokens = true));
  const unexpanded = variant('colbert-noexpand', (st) => (st.do_query_expansion = false));
  for (const dir of [base, attending, unexpanded]) folders.set(dir.split('/').pop()!, await readFolder(dir));
  tok = await loadTokenizer(loadModelSpec(base).tokenizerPath);
  words = vocabularyWords(loadModelSpec(base));
  server = await startServer(testServerConfig({ models: ['tiny-embed', base, attending, unexpanded], slotsPerModel: 128, batching: { maxBatchTokens: 8192 } }));
  overlapping = await startServer(testServerConfig({ models: [base], slotsPerModel: 64, chunkOverlapTokens: OVERLAP }));
  await Promise.all([server.ready, overlapping.ready]);
}, 120_000);

afterAll(async () => {
  await Promise.all([server?.close(), overlapping?.close()]);
  for (const f of folders.values()) await f.session.release();
  if (root) rmSync(root, { recursive: true, force: true });
});

describe('a PyLate folder is read as PyLate reads it', () => {
  it('Transformer then Dense: token vectors of the Dense width, the markers and [MASK] as token ids, lengths from config_sentence_transformers.json', () => {
    const spec = loadModelSpec(join(root, 'tiny-colbert'));
    expect([spec.task, spec.outputs, spec.tokenWidth, spec.maxLength]).toEqual(['embed', ['tokens'], 32, 180]);
    const c = spec.colbert!;
    expect([c.queryPrefixId, c.documentPrefixId, c.maskId, c.queryLength, c.documentLength, c.doQueryExpansion, c.attendToExpansionTokens]).toEqual([30522, 30523, 103, 32, 180, true, false]);
    expect(c.skiplistIds).toContain(1010); // ","
    expect(c.dense).toMatchObject({ inFeatures: 128, outFeatures: 32, bias: false, activation: 'identity' });
  });

  it('refuses, naming the file, what it would not serve as PyLate does', () => {
    const broken = (name: string, change: (dir: string) => void) => {
      const dir = join(root, name);
      cpSync(join(root, 'tiny-colbert'), dir, { recursive: true });
      change(dir);
      return () => loadModelSpec(dir);
    };
    const denseConfig = (d: string, extra: object) => writeFileSync(join(d, '1_Dense', 'config.json'), JSON.stringify({ in_features: 128, out_features: 32, bias: false, ...extra }));
    expect(broken('residual', (d) => denseConfig(d, { use_residual: true }))).toThrow(/1_Dense\/config.json: use_residual true is not supported/);
    expect(broken('relu', (d) => denseConfig(d, { activation_function: 'torch.nn.modules.activation.ReLU' }))).toThrow(/activation_function torch.nn.modules.activation.ReLU is not supported/);
    expect(broken('wide', (d) => denseConfig(d, { in_features: 64 }))).toThrow(/in_features 64 is not the hidden size 128/);
    expect(broken('no-weights', (d) => rmSync(join(d, '1_Dense', 'model.safetensors')))).toThrow(/no 1_Dense\/model.safetensors/);
    expect(
      broken('no-marker', (d) => {
        const path = join(d, 'config_sentence_transformers.json');
        writeFileSync(path, JSON.stringify({ ...JSON.parse(readFileSync(path, 'utf8')), query_prefix: '[QQ] ' }));
      }),
    ).toThrow(/the query prefix "\[QQ\] " is not a token of its tokenizer.json/);
    expect(
      broken('two-dense', (d) => {
        const modules = JSON.parse(readFileSync(join(d, 'modules.json'), 'utf8')) as unknown[];
        writeFileSync(join(d, 'modules.json'), JSON.stringify([...modules, { idx: 2, name: '2', path: '2_Dense', type: 'pylate.models.Dense.Dense' }]));
      }),
    ).toThrow(/a PyLate folder with 2 Dense modules is not supported/);
  });
});

describe('/embed_all on a ColBERT model', () => {
  it('queries and documents of many lengths queued together: every vector is the reference\'s within 1e-5 (expansion attended or not, or off)', async () => {
    const queries = texts('colbert queries', 8, 40); // some past the query length: cut
    const documents = texts('colbert documents', 8, 60);
    const models = [...folders.keys()];
    const cases = models.flatMap((model) => [...queries.map((t) => ({ model, text: t, kind: 'query' as Kind })), ...documents.map((t) => ({ model, text: t, kind: 'document' as Kind }))]);
    const answers = await sentTogether(server.testHooks, Object.fromEntries(models.map((m) => [m, queries.length + documents.length])), () =>
      Promise.all(cases.map((c) => post('/embed_all', { model: c.model, inputs: c.text, input_type: c.kind }))),
    );
    let worst = 0;
    let vectors = 0;
    for (const [i, c] of cases.entries()) {
      const a = answers[i]!;
      expect(a.status, JSON.stringify(a.body).slice(0, 300)).toBe(200);
      const want = await reference(folders.get(c.model)!, c.text, c.kind);
      worst = Math.max(worst, expectVectors(a.body[0], want, `${c.model} ${c.kind} "${c.text}"`));
      vectors += want.length;
    }
    console.log(`colbert: ${cases.length} inputs, ${vectors} vectors, worst |diff| ${worst.toExponential(2)}`);
    // What PyLate's shapes say: an expanded query is query_length vectors, an unexpanded one its tokens; a document loses its punctuation.
    const at = (model: string, kind: Kind, k: number) => answers[cases.findIndex((c) => c.model === model && c.kind === kind) + k]!.body[0].length;
    expect(queries.map((_, k) => at('tiny-colbert', 'query', k))).toEqual(queries.map(() => 32));
    expect(queries.map((_, k) => at('colbert-noexpand', 'query', k))).toEqual(queries.map((q) => Math.min(32, tok.encode(q, { maxLength: 4096, truncate: false }).ids.length + 1)));
    const punctuated = documents.findIndex((d) => /[.,!?]/.test(d));
    expect(at('tiny-colbert', 'document', punctuated)).toBeLessThan(tok.encode(documents[punctuated]!, { maxLength: 4096, truncate: false }).ids.length + 1);
  });

  it('a document past document_length is cut to it (never 413), as PyLate cuts', async () => {
    const long = words.slice(0, 300).join(' ');
    const r = await post('/embed_all', { model: 'tiny-colbert', inputs: long, input_type: 'document' });
    expect(r.status).toBe(200);
    expect(r.body[0]).toHaveLength(180);
    expectVectors(r.body[0], await reference(folders.get('tiny-colbert')!, long, 'document'), 'long document');
  });

  it('chunked, a document of 3.5 document lengths runs as windows each marked as one document: its vectors are the windows\' run alone, in order, each text token once (with and without overlap)', async () => {
    const f = folders.get('tiny-colbert')!;
    const text = textOfTokens('colbert long document', Math.round(3.5 * f.st.document_length));
    for (const [to, overlap] of [[server, 0], [overlapping, OVERLAP]] as const) {
      const want = await chunkedReference(f, text, overlap);
      expect(want.windows, 'the reference\'s windows').toBe(4);
      const r = await post('/embed_all', { model: 'tiny-colbert', inputs: text, input_type: 'document', long_inputs: 'chunk' }, to);
      expect(r.status, JSON.stringify(r.body).slice(0, 300)).toBe(200);
      expect(r.headers.get('x-windows')).toBe(String(want.windows));
      expectVectors(r.body[0], want.vectors, `chunked document, overlap ${overlap}`);
    }
  });

  it('chunking asked for, a query is still cut to query_length, as PyLate cuts it', async () => {
    const f = folders.get('tiny-colbert')!;
    const text = textOfTokens('colbert long query', 3 * f.st.query_length);
    const r = await post('/embed_all', { model: 'tiny-colbert', inputs: text, input_type: 'query', long_inputs: 'chunk' });
    expect(r.status, JSON.stringify(r.body).slice(0, 300)).toBe(200);
    expect(r.body[0]).toHaveLength(f.st.query_length);
    expectVectors(r.body[0], await reference(f, text, 'query'), 'long query');
  });

  it('over WebSocket (op embed_all) and gRPC EmbedAll (x-input-type metadata): the same vectors', async () => {
    const [query, document] = texts('colbert transports', 2, 20);
    const f = folders.get('tiny-colbert')!;
    const frame = await wsRequest(server.port, { id: 'c', op: 'embed_all', inputs: [query, document], model: 'tiny-colbert', input_type: 'document' });
    expect(frame.error).toBeUndefined();
    expectVectors(frame.result[1], await reference(f, document!, 'document'), 'WebSocket');
    const client = new (grpcJsPackages(TEI_PROTO).tei.v1.Embed)(`127.0.0.1:${server.grpcPort}`, grpc.credentials.createInsecure());
    try {
      const metadata = new grpc.Metadata();
      metadata.set('x-model', 'tiny-colbert');
      metadata.set('x-input-type', 'query');
      const reply = await unaryCall(client, 'EmbedAll', { inputs: query }, metadata);
      expectVectors(reply.token_embeddings.map((t: { embeddings: number[] }) => t.embeddings), await reference(f, query!, 'query'), 'gRPC');
      const bare = new grpc.Metadata();
      bare.set('x-model', 'tiny-colbert');
      const err = (await unaryCall(client, 'EmbedAll', { inputs: query }, bare).catch((e: unknown) => e)) as grpc.ServiceError;
      expect([err.code, err.metadata.get('slabserve-code')[0]]).toEqual([grpc.status.INVALID_ARGUMENT, 'SLABSERVE_INVALID_INPUT']);
    } finally {
      client.close();
    }
  });

  it('refuses what PyLate would not answer: no input_type, token ids, input_type on another model, and pooled rows', async () => {
    const none = await post('/embed_all', { model: 'tiny-colbert', inputs: 'hello' });
    expect([none.status, none.body.code]).toEqual([422, 'SLABSERVE_INVALID_INPUT']);
    expect(none.body.error).toMatch(/"tiny-colbert" is a ColBERT model: say "input_type": "query" or "document"/);
    const bad = await post('/embed_all', { model: 'tiny-colbert', inputs: 'hello', input_type: 'passage' });
    expect([bad.status, bad.body.code]).toEqual([422, 'SLABSERVE_INVALID_INPUT']);
    const ids = await post('/embed_all', { model: 'tiny-colbert', inputs: [101, 7592, 102], input_type: 'query' });
    expect([ids.status, ids.body.error]).toEqual([422, expect.stringMatching(/takes texts, not token ids/)]);
    const plain = await post('/embed_all', { model: 'tiny-embed', inputs: 'hello', input_type: 'query' });
    expect([plain.status, plain.body.error]).toEqual([422, expect.stringMatching(/input_type is for ColBERT models/)]);
    const pooled = await post('/embed', { model: 'tiny-colbert', inputs: 'hello' });
    expect([pooled.status, pooled.body.code]).toEqual([424, 'SLABSERVE_OUTPUT_UNAVAILABLE']);
    expect(pooled.body.error).toMatch(/"tiny-colbert" has no dense output .*it gives tokens/);
    // Routes that name a model of any task refuse before running: OpenAI's and KServe's.
    const openai = await post('/v1/embeddings', { model: 'tiny-colbert', input: 'hello' });
    expect([openai.status, openai.body.error.code]).toEqual([424, 'SLABSERVE_OUTPUT_UNAVAILABLE']);
    const kserve = await post('/v2/models/tiny-colbert/infer', { inputs: [{ name: 'text', datatype: 'BYTES', shape: [1], data: ['hello'] }] });
    expect([kserve.status, kserve.body.error]).toEqual([424, expect.stringMatching(/no dense output: it gives tokens/)]);
    // With no model named, /embed_all takes the first model with token vectors: tiny-embed, which needs no input_type.
    expect((await post('/embed_all', { inputs: 'hello' })).status).toBe(200);
  });
});
