/**
 * /embed_all: per input, per token, the token states (text-embeddings-inference's
 * route), over HTTP, WebSocket and gRPC (EmbedAll, EmbedAllStream).
 *
 * The reference is independent of the server's graph: a plain onnxruntime
 * session of the unmodified model.onnx, one input at a time and unpadded, its
 * last_hidden_state rows as they are. The server answers the same inputs
 * queued together (test/fixtures/queued-together.ts), so they run batched and
 * padded with other lengths. The token area (--token-output-mb) bounds how many
 * inputs' vectors are in flight: over it, 429 at once, and every page comes
 * back once its request is answered or cancelled.
 */
import * as grpc from '@grpc/grpc-js';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
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
import { sentTogether } from './fixtures/queued-together.js';
import { eventually, makeRandom, randomTexts, testServerConfig, vocabularyWords, wsRequest } from './helpers.js';
import { parseMetrics } from './fixtures/http-client.js';

process.env.SLABSERVE_TEST_HOOKS = '1';

const TOLERANCE = 1e-5;
const MAX_LENGTH = 64;
/** One page holds MAX_LENGTH tokens of 128 floats: 32 KiB. 0.25 MiB holds 8 pages. */
const TOKEN_OUTPUT_MB = 0.25;
const PAGES = 8;
const TEI_PROTO = fileURLToPath(new URL('../proto/tei.proto', import.meta.url));

let root: string;
let embedDir: string;
let server: Server;
let plain: ort.InferenceSession;
let tok: TextTokenizer;
let words: string[];

/** The unmodified graph's token states of one input alone: [n][hidden]. */
async function tokenStates(ids: ArrayLike<number>): Promise<Float32Array[]> {
  const n = ids.length;
  const i64 = (f: (i: number) => number) => new ort.Tensor('int64', BigInt64Array.from({ length: n }, (_, i) => BigInt(f(i))), [1, n]);
  const out = await plain.run({ input_ids: i64((i) => ids[i]!), attention_mask: i64(() => 1), token_type_ids: i64(() => 0) });
  const t = out.last_hidden_state!;
  const h = Number(t.dims[2]);
  const data = t.data as Float32Array;
  return Array.from({ length: n }, (_, i) => data.slice(i * h, (i + 1) * h));
}

/** Fails unless `got` has the reference's token count and every float within TOLERANCE; returns the worst difference. */
function expectTokens(got: ArrayLike<ArrayLike<number>>, want: Float32Array[], what: string): number {
  expect(got.length, `${what}: tokens`).toBe(want.length);
  let worst = 0;
  for (let t = 0; t < want.length; t++) {
    expect(got[t]!.length, `${what}: token ${t}'s width`).toBe(want[t]!.length);
    for (let k = 0; k < want[t]!.length; k++) worst = Math.max(worst, Math.abs(got[t]![k]! - want[t]![k]!));
  }
  expect(worst, `${what}: the values`).toBeLessThan(TOLERANCE);
  return worst;
}

const idsOf = (text: string) => tok.encode(text, { maxLength: MAX_LENGTH, truncate: false }).ids;

async function post(path: string, body: unknown): Promise<{ status: number; body: any; headers: Headers }> {
  const r = await fetch(`${server.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json(), headers: r.headers };
}

const scrape = async () => parseMetrics(await (await fetch(`${server.url}/metrics`)).text());
const pagesInUse = async () => (await scrape()).sum('slabserve_token_pages_in_use', { model: 'tiny-embed' });

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), 'slabserve-embed-all-'));
  embedDir = writePreset('tiny-embed', root, { maxLength: MAX_LENGTH }).dir;
  const spladeDir = writePreset('tiny-splade', root, { maxLength: MAX_LENGTH }).dir;
  plain = await ort.InferenceSession.create(readFileSync(join(embedDir, 'model.onnx')), { executionProviders: ['cpu'], intraOpNumThreads: 1 });
  const spec = loadModelSpec(embedDir);
  tok = await loadTokenizer(spec.tokenizerPath);
  words = vocabularyWords(spec);
  server = await startServer(
    testServerConfig({ models: [spladeDir, embedDir, 'tiny-intent'], slotsPerModel: 64, tokenOutputMb: TOKEN_OUTPUT_MB, batching: { maxBatchTokens: 2048 } }),
  );
  await server.ready;
}, 120_000);

afterAll(async () => {
  await server?.close();
  await plain?.release();
  if (root) rmSync(root, { recursive: true, force: true });
});

describe('/embed_all', () => {
  it('batched and padded with other lengths, every token vector is the unmodified graph\'s within 1e-5, [CLS] and [SEP] included', async () => {
    const texts = randomTexts(makeRandom('embed_all batched'), words, PAGES, 40);
    const answers = await sentTogether(server.testHooks, { 'tiny-embed': texts.length }, () => Promise.all(texts.map((t) => post('/embed_all', { inputs: t }))));
    let worst = 0;
    let tokens = 0;
    for (const [i, t] of texts.entries()) {
      const a = answers[i]!;
      expect(a.status, JSON.stringify(a.body).slice(0, 300)).toBe(200);
      expect(a.body).toHaveLength(1);
      const ids = idsOf(t);
      worst = Math.max(worst, expectTokens(a.body[0], await tokenStates(ids), `"${t}"`));
      tokens += ids.length;
    }
    const lengths = new Set(texts.map((t) => idsOf(t).length));
    console.log(`embed_all: ${texts.length} inputs of ${lengths.size} lengths, ${tokens} token vectors, worst |diff| ${worst.toExponential(2)}`);
    expect(lengths.size).toBeGreaterThan(1); // padded: a batch of one length would pad nothing
  });

  it('a list of inputs answers one list of token vectors each, in order; the path or `model` names the model; with none named, the first model with token vectors', async () => {
    const texts = randomTexts(makeRandom('embed_all list'), words, 4, 30);
    const wants = await Promise.all(texts.map((t) => tokenStates(idsOf(t))));
    for (const [path, body] of [
      ['/embed_all', { inputs: texts }],
      ['/models/tiny-embed/embed_all', { inputs: texts }],
      ['/embed_all', { inputs: texts, model: 'tiny-embed' }],
    ] as const) {
      const r = await post(path, body);
      expect(r.status, `${path}: ${JSON.stringify(r.body).slice(0, 200)}`).toBe(200);
      expect(r.body).toHaveLength(texts.length);
      for (let i = 0; i < texts.length; i++) expectTokens(r.body[i], wants[i]!, `${path} input ${i}`);
    }
  });

  it('truncate cuts an input to the max length, truncation_direction left keeps its end, prompt_name and prompt put tokens before the text', async () => {
    const long = randomTexts(makeRandom('embed_all truncate'), words, 1, 1)[0]!.concat(' ', words.slice(0, 80).join(' '));
    const full = tok.encode(long, { maxLength: 100_000, truncate: false }).ids;
    expect(full.length).toBeGreaterThan(MAX_LENGTH);
    const tooLong = await post('/embed_all', { inputs: long });
    expect([tooLong.status, tooLong.body.code]).toEqual([413, 'SLABSERVE_INPUT_TOO_LONG']);
    const right = await post('/embed_all', { inputs: long, truncate: true });
    expectTokens(right.body[0], await tokenStates(tok.encode(long, { maxLength: MAX_LENGTH, truncate: true }).ids), 'truncate right');
    const left = await post('/embed_all', { inputs: long, truncate: true, truncation_direction: 'left' });
    expectTokens(left.body[0], await tokenStates(tok.encode(long, { maxLength: MAX_LENGTH, truncate: true, direction: 'left' }).ids), 'truncate left');
    const prompted = await post('/embed_all', { inputs: 'where is my parcel', prompt: 'query: ' });
    expectTokens(prompted.body[0], await tokenStates(idsOf('query: where is my parcel')), 'prompt');
  });

  it('over WebSocket (op embed_all), gRPC EmbedAll and EmbedAllStream: the same vectors', async () => {
    const texts = randomTexts(makeRandom('embed_all transports'), words, 3, 30);
    const wants = await Promise.all(texts.map((t) => tokenStates(idsOf(t))));
    const frame = await wsRequest(server.port, { id: 'a', op: 'embed_all', inputs: texts });
    expect(frame.error).toBeUndefined();
    for (let i = 0; i < texts.length; i++) expectTokens(frame.result[i], wants[i]!, `WebSocket input ${i}`);
    const client = new (grpcJsPackages(TEI_PROTO).tei.v1.Embed)(`127.0.0.1:${server.grpcPort}`, grpc.credentials.createInsecure());
    try {
      const reply = await unaryCall(client, 'EmbedAll', { inputs: texts[0] });
      expectTokens(reply.token_embeddings.map((t: { embeddings: number[] }) => t.embeddings), wants[0]!, 'gRPC EmbedAll');
      expect(reply.metadata.compute_tokens).toBe(wants[0]!.length);
      const stream = client.EmbedAllStream();
      const replies: { token_embeddings: { embeddings: number[] }[] }[] = [];
      const ended = new Promise<void>((resolve, reject) => {
        stream.on('data', (m: (typeof replies)[number]) => replies.push(m));
        stream.on('end', resolve);
        stream.on('error', reject);
      });
      for (const t of texts) stream.write({ inputs: t });
      stream.end();
      await ended;
      expect(replies).toHaveLength(texts.length);
      for (let i = 0; i < texts.length; i++) expectTokens(replies[i]!.token_embeddings.map((t) => t.embeddings), wants[i]!, `gRPC EmbedAllStream message ${i}`);
      const metadata = new grpc.Metadata();
      metadata.set('x-model', 'tiny-splade');
      const sparse = (await unaryCall(client, 'EmbedAll', { inputs: 'x' }, metadata).catch((e: unknown) => e)) as grpc.ServiceError;
      expect([sparse.code, sparse.metadata.get('slabserve-code')[0]]).toEqual([grpc.status.FAILED_PRECONDITION, 'SLABSERVE_OUTPUT_UNAVAILABLE']);
    } finally {
      client.close();
    }
  });

  it('a model without token vectors is 424 naming what it gives; another task or a bad body is 422', async () => {
    const splade = await post('/embed_all', { inputs: 'hello', model: 'tiny-splade' });
    expect([splade.status, splade.body.code]).toEqual([424, 'SLABSERVE_OUTPUT_UNAVAILABLE']);
    expect(splade.body.error).toMatch(/"tiny-splade" has no tokens output .*it gives dense and sparse/);
    expect((await post('/models/tiny-splade/embed_all', { inputs: 'hello' })).status).toBe(424);
    const intent = await post('/embed_all', { inputs: 'hello', model: 'tiny-intent' });
    expect([intent.status, intent.body.code]).toEqual([422, 'SLABSERVE_INVALID_INPUT']);
    const normalize = await post('/embed_all', { inputs: 'hello', normalize: true });
    expect([normalize.status, normalize.body.code]).toEqual([422, 'SLABSERVE_INVALID_INPUT']);
    expect(normalize.body.error).toMatch(/normalize/);
  });
});

describe('the token area (--token-output-mb)', () => {
  it('/info and the metrics say its size; more inputs than it holds in one request is 429 at once, naming the flag', async () => {
    const info = (await (await fetch(`${server.url}/info`)).json()) as { models: { name: string; outputs?: string[] }[]; limits: { tokenOutputMb: number } };
    expect(info.models.find((m) => m.name === 'tiny-embed')?.outputs).toEqual(['dense', 'tokens']);
    expect(info.limits.tokenOutputMb).toBe(TOKEN_OUTPUT_MB);
    expect((await scrape()).sum('slabserve_token_pages', { model: 'tiny-embed' })).toBe(PAGES);
    const over = await post('/embed_all', { inputs: Array.from({ length: PAGES + 1 }, (_, i) => `text ${i}`) });
    expect([over.status, over.body.code]).toEqual([429, 'SLABSERVE_OVERLOADED']);
    expect(over.body.error).toMatch(new RegExp(`more than the ${PAGES} .*--token-output-mb`));
    expect(await pagesInUse()).toBe(0);
  });

  it('while its pages are taken, a request for token vectors is 429 at once; every page comes back after answers and after cancels', async () => {
    const hooks = server.testHooks!;
    const texts = randomTexts(makeRandom('token area full'), words, PAGES, 20);
    const rowsBefore = (await scrape()).sum('slabserve_batch_size_sum', { model: 'tiny-embed' });
    await hooks.holdInference();
    let held: Promise<{ status: number }>[] = [];
    const aborts = texts.map(() => new AbortController());
    try {
      // Half answered after the hold, half cancelled while queued (their clients go away).
      held = texts.map((t, i) =>
        fetch(`${server.url}/embed_all`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: t }), signal: aborts[i]!.signal }).then(
          (r) => ({ status: r.status }),
          () => ({ status: -1 }),
        ),
      );
      await eventually('every page taken', pagesInUse, (n) => n === PAGES);
      const refused = await post('/embed_all', { inputs: 'one more' });
      expect([refused.status, refused.body.code]).toEqual([429, 'SLABSERVE_OVERLOADED']);
      expect(refused.headers.get('retry-after')).not.toBeNull();
      const cancelsBefore = (await scrape()).sum('slabserve_cancellations_total', { reason: 'client_disconnect' });
      for (let i = 0; i < PAGES / 2; i++) aborts[i]!.abort();
      // The gateway hears each client go before the loop runs again (else one could run first).
      await eventually('the cancels seen', async () => (await scrape()).sum('slabserve_cancellations_total', { reason: 'client_disconnect' }) - cancelsBefore, (n) => n === PAGES / 2);
    } finally {
      hooks.releaseInference();
    }
    const statuses = (await Promise.all(held)).map((r) => r.status);
    expect(statuses.slice(PAGES / 2)).toEqual(Array(PAGES / 2).fill(200));
    await eventually('every page back', pagesInUse, (n) => n === 0);
    // The cancelled half never ran: the rows run are the answered half's, one each.
    expect((await scrape()).sum('slabserve_batch_size_sum', { model: 'tiny-embed' }) - rowsBefore).toBe(PAGES / 2);
    const after = await post('/embed_all', { inputs: texts });
    expect(after.status).toBe(200);
  });
});

describe('a model whose one input does not fit the token area', () => {
  it('starts without token vectors, says so at start, and answers 424 on /embed_all', async () => {
    const lines: string[] = [];
    const small = await startServer(testServerConfig({ models: [embedDir], tokenOutputMb: 0.01, log: (l: string) => lines.push(l) }));
    try {
      await small.ready;
      expect(lines.join('\n')).toMatch(/tiny-embed: one input's token vectors \(0\.03 MiB\) do not fit --token-output-mb 0\.01: \/embed_all is off for it/);
      const r = await fetch(`${small.url}/embed_all`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"inputs":"hi"}' });
      expect(r.status).toBe(424);
      expect((await fetch(`${small.url}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"inputs":"hi"}' })).status).toBe(200);
    } finally {
      await small.close();
    }
  });
});

describe('a model loaded while serving (its session on a thread of its own)', () => {
  it('answers the same token vectors: the token area crosses to the session thread and back', async () => {
    const loaded = await startServer(testServerConfig({ modelsDir: root, models: ['tiny-splade'], modelControlMode: 'explicit', tokenOutputMb: TOKEN_OUTPUT_MB }));
    try {
      await loaded.ready;
      const load = await fetch(`${loaded.url}/v2/repository/models/tiny-embed/load`, { method: 'POST' });
      expect(load.status).toBe(200);
      const texts = randomTexts(makeRandom('embed_all session thread'), words, 4, 30);
      const r = await fetch(`${loaded.url}/embed_all`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tiny-embed', inputs: texts }) });
      expect(r.status).toBe(200);
      const body = (await r.json()) as number[][][];
      for (const [i, t] of texts.entries()) expectTokens(body[i]!, await tokenStates(idsOf(t)), `session thread input ${i}`);
    } finally {
      await loaded.close();
    }
  });
});
