/**
 * gRPC (src/gateway/grpc/), called by Connect's Node client (test/fixtures/grpc-connect-client.ts:
 * another implementation of the protocol than the server's grpc-js, messages from descriptors buf
 * compiles from proto/; all from npm) against a real server: answers equal an
 * independent reference (a plain onnxruntime run of the unmodified graph, pooled here), a gRPC
 * call rides in the same batch as HTTP requests, errors map to their gRPC codes with the
 * SLABSERVE_ code in the trailers, deadlines and cancellation free the slots, streams answer in
 * order, keys are checked, health follows readiness.
 */
import * as grpc from '@grpc/grpc-js';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { portOutsideEphemeral, serveCli } from './cli-process.js';
import { grpcCalls as connectCalls, type Call, type Reply } from './fixtures/grpc-connect-client.js';
import { grpcJsPackages, unaryCall } from './fixtures/grpc-js-client.js';
import { parseMetrics } from './fixtures/http-client.js';
import { batchesOfQueued, sentTogether, servedBatching } from './fixtures/queued-together.js';
import { eventually, makeRandom, maxAbsDiff, PlainReference, randomTexts, Reference, testServerConfig, vocabularyWords } from './helpers.js';

process.env.SLABSERVE_TEST_HOOKS = '1';

const PROTOS = ['inference.proto', 'tei.proto'].map((f) => fileURLToPath(new URL(`../proto/${f}`, import.meta.url)));
const HEALTH_PROTO = fileURLToPath(new URL('../node_modules/grpc-health-check/proto/health/v1/health.proto', import.meta.url));
const REFLECTION_PROTO = fileURLToPath(new URL('../node_modules/@grpc/reflection/build/proto/grpc/reflection/v1/reflection.proto', import.meta.url));
const TOLERANCE = 1e-5;
/** A signal from the test to a client call (read_when, cancel_when, open_until): `fired` settles once `fire()` is called. */
function signal(): { fired: Promise<void>; fire: () => void } {
  let fire!: () => void;
  const fired = new Promise<void>((resolve) => (fire = resolve));
  return { fired, fire };
}
/** TEI's and KServe's own protos, unchanged (test/fixtures/upstream-protos/README.md). */
const UPSTREAM_PROTOS = ['tei.proto', 'grpc_predict_v2.proto'].map((f) => fileURLToPath(new URL(`./fixtures/upstream-protos/${f}`, import.meta.url)));

/**
 * Makes `calls` at once on one connection (messages from `protos`); their replies in order. `onReply`
 * hears each reply of a stream with `progress` as it arrives (test/fixtures/grpc-connect-client.ts).
 */
function grpcCalls(port: number, calls: Call[], protos = PROTOS, onReply?: (call: number, reply: any) => void): Promise<Reply[]> {
  return connectCalls(port, calls, protos, onReply);
}

const one = async (port: number, call: Call) => (await grpcCalls(port, [call]))[0]!;

/** base64 of a string's UTF-8 bytes: a BYTES element in protobuf's JSON form. */
const b64 = (s: string) => Buffer.from(s, 'utf8').toString('base64');

async function metrics(srv: Server) {
  return parseMetrics(await (await fetch(srv.url + '/metrics')).text());
}

describe('gRPC: TEI and KServe services beside HTTP', () => {
  let server: Server;
  let port: number;
  let ref: Reference;
  let intentRef: Reference;
  let tok: TextTokenizer;
  let words: string[];
  let dim: number;

  beforeAll(async () => {
    ref = await Reference.open('tiny-embed');
    intentRef = await Reference.open('tiny-intent');
    tok = await loadTokenizer(ref.spec.tokenizerPath);
    words = vocabularyWords(ref.spec);
    dim = ref.spec.hiddenSize;
    server = await startServer(testServerConfig({ models: ['tiny-embed', 'tiny-intent'] }));
    await server.ready;
    port = server.grpcPort!;
  });

  afterAll(async () => {
    await server?.close();
    await ref?.close();
    await intentRef?.close();
  });

  it('listens on its own port, a free one with --port 0', () => {
    expect(server.grpcPort).toBeGreaterThan(0);
    expect(server.grpcPort).not.toBe(server.port);
  });

  it("Embed, EmbedStream and KServe's ModelInfer (typed and raw) equal the graph run alone, pooled here", async () => {
    const rand = makeRandom('grpc embed');
    const texts = randomTexts(rand, words, 6, 12);
    const rawTexts = Buffer.concat(texts.map((t) => Buffer.concat([Buffer.from(new Uint32Array([Buffer.byteLength(t)]).buffer), Buffer.from(t)])));
    const replies = await grpcCalls(port, [
      ...texts.map((t) => ({ method: '/tei.v1.Embed/Embed', request: { inputs: t } })),
      { method: '/tei.v1.Embed/EmbedStream', kind: 'stream', requests: texts.map((t) => ({ inputs: t })) },
      { method: '/inference.GRPCInferenceService/ModelInfer', request: { model_name: 'tiny-embed', inputs: [{ name: 'text', datatype: 'BYTES', shape: [texts.length], contents: { bytes_contents: texts.map(b64) } }] } },
      { method: '/inference.GRPCInferenceService/ModelInfer', request: { model_name: 'tiny-embed', inputs: [{ name: 'text', datatype: 'BYTES', shape: [texts.length] }], raw_input_contents: [rawTexts.toString('base64')] } },
    ]);
    const unary = replies.slice(0, texts.length).map((r) => r.ok.embeddings as number[]);
    const stream = (replies[texts.length]!.ok as { embeddings: number[] }[]).map((r) => r.embeddings);
    const typed = replies[texts.length + 1]!.ok.outputs[0];
    const raw = replies[texts.length + 2]!.ok;
    expect(typed).toMatchObject({ name: 'embedding', datatype: 'FP32', shape: [String(texts.length), String(dim)] });
    const rawRows = new Float32Array(new Uint8Array(Buffer.from(raw.raw_output_contents[0], 'base64')).buffer);
    expect(raw.outputs[0].contents).toBeUndefined(); // raw in, raw out
    let worst = 0;
    for (let i = 0; i < texts.length; i++) {
      const want = (await ref.rowOfText(tok, texts[i]!)).slice(0, dim);
      for (const got of [unary[i]!, stream[i]!, typed.contents.fp32_contents.slice(i * dim, (i + 1) * dim), Array.from(rawRows.subarray(i * dim, (i + 1) * dim))]) {
        expect(got).toHaveLength(dim);
        worst = Math.max(worst, maxAbsDiff(got, want));
      }
    }
    console.log(`grpc embed: worst |diff| ${worst.toExponential(2)} over ${texts.length} texts, 4 ways`);
    expect(worst).toBeLessThan(TOLERANCE);
  });

  it('a Node client (@grpc/grpc-js, its stubs loaded from proto/ by @grpc/proto-loader): Embed and ModelInfer equal the reference rows; an error carries its code and SLABSERVE_ trailer', async () => {
    const loaded = grpcJsPackages(PROTOS);
    const target = `127.0.0.1:${port}`;
    const embedder = new loaded.tei.v1.Embed(target, grpc.credentials.createInsecure());
    const kserve = new loaded.inference.GRPCInferenceService(target, grpc.credentials.createInsecure());
    try {
      const texts = randomTexts(makeRandom('grpc-js client'), words, 5, 10);
      const [embedded, inferred] = await Promise.all([
        Promise.all(texts.map((t) => unaryCall(embedder, 'Embed', { inputs: t }))),
        unaryCall(kserve, 'ModelInfer', { model_name: 'tiny-embed', inputs: [{ name: 'text', datatype: 'BYTES', shape: [texts.length], contents: { bytes_contents: texts.map((t) => Buffer.from(t)) } }] }),
      ]);
      const rows = inferred.outputs[0].contents.fp32_contents as number[];
      expect(inferred.outputs[0].shape).toEqual([String(texts.length), String(dim)]);
      for (const [i, t] of texts.entries()) {
        const want = (await ref.rowOfText(tok, t)).slice(0, dim);
        expect(maxAbsDiff(embedded[i].embeddings, want)).toBeLessThan(TOLERANCE);
        expect(maxAbsDiff(rows.slice(i * dim, (i + 1) * dim), want)).toBeLessThan(TOLERANCE);
      }
      const metadata = new grpc.Metadata();
      metadata.set('x-model', 'no-such-model');
      const err = (await unaryCall(embedder, 'Embed', { inputs: 'hello' }, metadata).catch((e: unknown) => e)) as grpc.ServiceError;
      expect(err.code).toBe(grpc.status.NOT_FOUND);
      expect(err.metadata.get('slabserve-code')).toEqual(['SLABSERVE_MODEL_NOT_FOUND']);
    } finally {
      embedder.close();
      kserve.close();
    }
  });

  it("message classes generated from TEI's and KServe's published protos call the server unchanged and get the answers ours get", async () => {
    const texts = randomTexts(makeRandom('grpc upstream protos'), words, 3, 10);
    const calls: Call[] = [
      { method: '/tei.v1.Info/Info', request: {} },
      { method: '/tei.v1.Embed/Embed', request: { inputs: texts[0], truncate: true, normalize: true, dimensions: 64 } },
      { method: '/tei.v1.Embed/EmbedStream', kind: 'stream', requests: texts.map((t) => ({ inputs: t })) },
      { method: '/tei.v1.Predict/Predict', request: { inputs: texts[1], raw_scores: true }, metadata: [['x-model', 'tiny-intent']] },
      { method: '/tei.v1.Tokenize/Tokenize', request: { inputs: texts[2], add_special_tokens: true } },
      { method: '/tei.v1.Tokenize/Decode', request: { ids: [7592, 2088], skip_special_tokens: true } },
      { method: '/inference.GRPCInferenceService/ModelMetadata', request: { name: 'tiny-embed' } },
      { method: '/inference.GRPCInferenceService/ModelInfer', request: { model_name: 'tiny-embed', inputs: [{ name: 'text', datatype: 'BYTES', shape: [texts.length], contents: { bytes_contents: texts.map(b64) } }] } },
    ];
    const [theirs, ours] = await Promise.all([grpcCalls(port, calls, UPSTREAM_PROTOS), grpcCalls(port, calls)]);
    // Floats differ by batching noise, timings by the clock: compare them apart.
    // `floats` gathers each float with its counterpart in `pair` (ours) when given.
    const floats: [number, number][] = [];
    const structure = (v: unknown, pair?: unknown, gather = false): unknown => {
      if (typeof v === 'number' && !Number.isInteger(v)) {
        if (gather) floats.push([v, pair as number]);
        return 'float';
      }
      if (Array.isArray(v)) return v.map((x, i) => structure(x, (pair as unknown[] | undefined)?.[i], gather));
      if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).filter(([k]) => k !== 'metadata').map(([k, x]) => [k, structure(x, (pair as Record<string, unknown> | undefined)?.[k], gather)]));
      return v;
    };
    theirs.forEach((reply, i) => {
      expect(reply.error, calls[i]!.method).toBeUndefined();
      expect(structure(reply, ours[i], true), calls[i]!.method).toEqual(structure(ours[i]));
    });
    expect(floats.length).toBeGreaterThan(64 * 2);
    expect(Math.max(...floats.map(([a, b]) => Math.abs(a - b)))).toBeLessThan(TOLERANCE);
    expect(theirs[1]!.ok.embeddings).toHaveLength(64);
    expect(theirs[0]!.ok.model_id).toBe('tiny-embed');
  });

  it('ModelInfer with INT64 input_ids and an attention mask (typed and raw) equals the graph run on the real tokens', async () => {
    const rand = makeRandom('grpc tokens');
    const lengths = [3, 7, 5];
    const T = Math.max(...lengths);
    const rows = lengths.map((n) => [101, ...Array.from({ length: n - 2 }, () => 1000 + Math.floor(rand() * 20000)), 102]);
    const ids = rows.flatMap((r) => [...r, ...Array(T - r.length).fill(0)]);
    const mask = rows.flatMap((r) => [...Array(r.length).fill(1), ...Array(T - r.length).fill(0)]);
    const int64 = (v: number[]) => Buffer.from(new BigInt64Array(v.map(BigInt)).buffer).toString('base64');
    const tensor = (name: string, data: number[]) => ({ name, datatype: 'INT64', shape: [rows.length, T], contents: { int64_contents: data } });
    const [typed, raw] = await grpcCalls(port, [
      { method: '/inference.GRPCInferenceService/ModelInfer', request: { model_name: 'tiny-embed', inputs: [tensor('input_ids', ids), tensor('attention_mask', mask)] } },
      {
        method: '/inference.GRPCInferenceService/ModelInfer',
        request: { model_name: 'tiny-embed', inputs: ['input_ids', 'attention_mask'].map((name) => ({ name, datatype: 'INT64', shape: [rows.length, T] })), raw_input_contents: [int64(ids), int64(mask)] },
      },
    ]);
    const rawRows = new Float32Array(new Uint8Array(Buffer.from(raw!.ok.raw_output_contents[0], 'base64')).buffer);
    for (let i = 0; i < rows.length; i++) {
      const want = (await ref.row(rows[i]!)).slice(0, dim);
      expect(maxAbsDiff(typed!.ok.outputs[0].contents.fp32_contents.slice(i * dim, (i + 1) * dim), want)).toBeLessThan(TOLERANCE);
      expect(maxAbsDiff(rawRows.subarray(i * dim, (i + 1) * dim), want)).toBeLessThan(TOLERANCE);
    }
  });

  it("Predict answers the classifier's probabilities, best first, as the graph's softmax", async () => {
    const text = randomTexts(makeRandom('grpc predict'), words, 1, 10)[0]!;
    const r = await one(port, { method: '/tei.v1.Predict/Predict', request: { inputs: text } });
    const want = (await intentRef.rowOfText(tok, text)).slice(0, intentRef.spec.labels.length);
    const preds = r.ok.predictions as { label: string; score: number }[];
    expect(preds.map((p) => p.score)).toEqual([...preds.map((p) => p.score)].sort((a, b) => b - a));
    for (const p of preds) expect(Math.abs(p.score - want[intentRef.spec.labels.indexOf(p.label)]!)).toBeLessThan(TOLERANCE);
  });

  it('gRPC and HTTP requests queued together run in the same batches', async () => {
    const texts = randomTexts(makeRandom('grpc batch'), words, 16, 6);
    const lengths = texts.map((t) => tok.encode(t, { maxLength: 512, truncate: false }).ids.length);
    const batching = await servedBatching(server.url, 'tiny-embed');
    const want = batchesOfQueued(lengths, batching);
    const before = await metrics(server);
    const [grpcReplies, httpReplies] = await sentTogether(server.testHooks, { 'tiny-embed': 16 }, () =>
      Promise.all([
        grpcCalls(port, texts.slice(0, 8).map((t) => ({ method: '/tei.v1.Embed/Embed', request: { inputs: t } }))),
        Promise.all(texts.slice(8).map((t) => fetch(server.url + '/embed', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: t }) }).then((r) => r.json()))),
      ]),
    );
    const after = await metrics(server);
    const batches = after.sum('slabserve_batch_size_count', { model: 'tiny-embed' }) - before.sum('slabserve_batch_size_count', { model: 'tiny-embed' });
    console.log(`grpc batch: 8 gRPC + 8 HTTP requests in ${batches} batches (buckets make ${want})`);
    expect(batches).toBe(want);
    expect(batches).toBeLessThan(2); // both transports in one batch: 16 short texts fit one bucket's capacity
    expect(grpcReplies.every((r) => r.ok?.embeddings.length === dim)).toBe(true);
    expect((httpReplies as number[][][]).every((r) => r[0]!.length === dim)).toBe(true);
  });

  it("maps the server's errors to gRPC codes, the SLABSERVE_ code in the trailers", async () => {
    const replies = await grpcCalls(port, [
      { method: '/inference.GRPCInferenceService/ModelInfer', request: { model_name: 'no-such-model', inputs: [] } },
      { method: '/tei.v1.Embed/Embed', request: { inputs: '' } },
      { method: '/tei.v1.Rerank/Rerank', request: { query: 'a', texts: ['b'] }, metadata: [['x-model', 'tiny-embed']] },
      { method: '/tei.v1.Embed/Embed', request: { inputs: 'word '.repeat(600) } },
      { method: '/tei.v1.Embed/Embed', request: { inputs: 'x' }, metadata: [['x-priority', 'urgent-ish']] },
      // No model here gives sparse weights (test/sparse.test.ts serves SPLADE); a classifier gives no token vectors.
      { method: '/tei.v1.Embed/EmbedSparse', request: { inputs: 'x' } },
      { method: '/tei.v1.Embed/EmbedSparseStream', kind: 'stream', requests: [{ inputs: 'x' }] },
      { method: '/tei.v1.Embed/EmbedAll', request: { inputs: 'x' }, metadata: [['x-model', 'tiny-intent']] },
      { method: '/tei.v1.Embed/EmbedAllStream', kind: 'stream', requests: [{ inputs: 'x' }], metadata: [['x-model', 'tiny-intent']] },
    ]);
    const codes = replies.map((r) => [r.error?.code, r.error?.trailing['slabserve-code']]);
    expect(codes).toEqual([
      ['NOT_FOUND', 'SLABSERVE_MODEL_NOT_FOUND'],
      ['INVALID_ARGUMENT', 'SLABSERVE_INVALID_INPUT'],
      ['FAILED_PRECONDITION', 'SLABSERVE_INVALID_INPUT'],
      ['INVALID_ARGUMENT', 'SLABSERVE_INPUT_TOO_LONG'],
      ['INVALID_ARGUMENT', 'SLABSERVE_INVALID_INPUT'],
      ['FAILED_PRECONDITION', 'SLABSERVE_OUTPUT_UNAVAILABLE'],
      ['FAILED_PRECONDITION', 'SLABSERVE_OUTPUT_UNAVAILABLE'],
      ['FAILED_PRECONDITION', 'SLABSERVE_INVALID_INPUT'],
      ['FAILED_PRECONDITION', 'SLABSERVE_INVALID_INPUT'],
    ]);
    expect(replies.slice(5).map((r) => /sparse output|a classify model/.exec(r.error!.details)?.[0])).toEqual(['sparse output', 'sparse output', 'a classify model', 'a classify model']);
    // The too-long advice is one that works here: truncate: true cuts it, and the row is the cut text's.
    expect(replies[3]!.error!.details).toMatch(/truncate/);
    const cut = await one(port, { method: '/tei.v1.Embed/Embed', request: { inputs: 'word '.repeat(600), truncate: true } });
    expect(cut.ok.embeddings).toHaveLength(dim);
    expect(maxAbsDiff(cut.ok.embeddings, (await ref.rowOfText(tok, 'word '.repeat(600), true)).slice(0, dim))).toBeLessThan(TOLERANCE);
  });

  it("a call whose deadline passes while queued ends DEADLINE_EXCEEDED and never reaches the device; a cancelled one frees its slots", async () => {
    const hooks = server.testHooks!;
    const before = await metrics(server);
    const cancel = signal();
    await hooks.holdInference();
    let replies: Reply[];
    try {
      const pending = grpcCalls(port, [
        { method: '/tei.v1.Embed/Embed', request: { inputs: 'a deadline of 300 ms' }, timeout: 0.3 },
        { method: '/tei.v1.Embed/Embed', request: { inputs: 'cancelled by its client' }, cancel_when: cancel.fired },
      ]);
      await eventually('both inputs queued', async () => hooks.inputsWaiting('tiny-embed'), (n) => n === 2, 10_000);
      cancel.fire(); // its client gives up now, while it is queued
      replies = await pending; // both end while the loop is held
      // The client's cancel (RST_STREAM) reaches the gateway after the client has given up: let it land before the
      // loop may run, else the input can run first (the deadline needs no wait: it is checked when a batch is made).
      const cancelled = (m: Awaited<ReturnType<typeof metrics>>) => m.sum('slabserve_cancellations_total', { reason: 'client_disconnect' }) - before.sum('slabserve_cancellations_total', { reason: 'client_disconnect' });
      await eventually('the cancel seen by the server', async () => cancelled(await metrics(server)), (n) => n >= 1, 10_000);
    } finally {
      hooks.releaseInference();
    }
    expect(replies.map((r) => r.error?.code)).toEqual(['DEADLINE_EXCEEDED', 'CANCELLED']);
    await eventually('their slots freed', async () => (await metrics(server)).sum('slabserve_slots_in_use', { model: 'tiny-embed' }), (n) => n === 0, 10_000);
    // Neither ran: the next batch is the next request's alone.
    const ok = await one(port, { method: '/tei.v1.Embed/Embed', request: { inputs: 'after' } });
    expect(ok.ok.embeddings).toHaveLength(dim);
    const after = await metrics(server);
    expect(after.sum('slabserve_batch_size_sum', { model: 'tiny-embed' }) - before.sum('slabserve_batch_size_sum', { model: 'tiny-embed' })).toBe(1);
  });

  it('a stream answers each message in order; a failing message ends it with its status after the answers before it', async () => {
    const texts = randomTexts(makeRandom('grpc stream'), words, 5, 8);
    const [good, bad] = await grpcCalls(port, [
      { method: '/tei.v1.Embed/EmbedStream', kind: 'stream', requests: texts.map((t) => ({ inputs: t })) },
      { method: '/tei.v1.Embed/EmbedStream', kind: 'stream', requests: [{ inputs: texts[0] }, { inputs: '' }, { inputs: texts[1] }] },
    ]);
    expect(good!.ok).toHaveLength(texts.length);
    for (let i = 0; i < texts.length; i++) expect(maxAbsDiff(good!.ok[i].embeddings, (await ref.rowOfText(tok, texts[i]!)).slice(0, dim))).toBeLessThan(TOLERANCE);
    expect(bad!.error?.code).toBe('INVALID_ARGUMENT');
    expect(bad!.ok).toHaveLength(1);
    expect(maxAbsDiff(bad!.ok[0].embeddings, (await ref.rowOfText(tok, texts[0]!)).slice(0, dim))).toBeLessThan(TOLERANCE);
  });

  it('a stream of 1,000 messages: every answer, in order, each equal to /embed for its text; each message run once', async () => {
    const texts = randomTexts(makeRandom('grpc stream of 1000'), words, 1000, 10);
    const before = await metrics(server);
    const [streamed] = await grpcCalls(port, [{ method: '/tei.v1.Embed/EmbedStream', kind: 'stream', requests: texts.map((t) => ({ inputs: t })) }]);
    const after = await metrics(server);
    const ran = (m: Awaited<ReturnType<typeof metrics>>) => m.sum('slabserve_batch_size_sum', { model: 'tiny-embed' });
    expect(ran(after) - ran(before)).toBe(texts.length); // the result cache is off: one row per message
    const http = (await (await fetch(server.url + '/embed', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: texts }) })).json()) as number[][];
    const answers = streamed!.ok as { embeddings: number[] }[];
    expect(answers).toHaveLength(texts.length);
    const misplaced = answers.map((a, i) => (maxAbsDiff(a.embeddings, http[i]!) < TOLERANCE ? -1 : i)).filter((i) => i >= 0);
    expect(misplaced).toEqual([]);
  });

  it("TEI's fields reach the endpoint: dimensions, truncation_direction, prompt_name; x-priority; the streams of Tokenize, Decode and PredictPair answer as their unary calls", async () => {
    const rand = makeRandom('grpc fields');
    const long = Array.from({ length: 700 }, () => words[Math.floor(rand() * words.length)]).join(' ');
    const short = 'where is my parcel';
    const replies = await grpcCalls(port, [
      { method: '/tei.v1.Embed/Embed', request: { inputs: short, dimensions: 16 } },
      { method: '/tei.v1.Embed/Embed', request: { inputs: long, truncate: true, truncation_direction: 'TRUNCATION_DIRECTION_LEFT' } },
      { method: '/tei.v1.Embed/Embed', request: { inputs: short, prompt_name: 'no-such-prompt' } },
      { method: '/tei.v1.Embed/Embed', request: { inputs: short }, metadata: [['x-priority', 'bulk']] },
      { method: '/tei.v1.Tokenize/TokenizeStream', kind: 'stream', requests: [{ inputs: short, add_special_tokens: true }, { inputs: 'hello' }] },
      { method: '/tei.v1.Tokenize/DecodeStream', kind: 'stream', requests: [{ ids: [7592, 2088] }, { ids: [101, 7592, 102], skip_special_tokens: true }] },
      { method: '/tei.v1.Predict/PredictPairStream', kind: 'stream', requests: [{ inputs: [short, 'it shipped'] }, { inputs: ['a', 'b'] }] },
      { method: '/tei.v1.Predict/PredictPair', request: { inputs: [short, 'it shipped'] } },
      { method: '/tei.v1.Tokenize/Tokenize', request: { inputs: 'hello' } },
    ]);
    const full = (await ref.rowOfText(tok, short)).slice(0, dim);
    const first16 = full.slice(0, 16);
    const norm = Math.hypot(...first16);
    expect(maxAbsDiff(replies[0]!.ok.embeddings, first16.map((v) => v / norm))).toBeLessThan(TOLERANCE);
    const left = tok.encode(long, { maxLength: 512, truncate: true, direction: 'left' });
    expect(left.ids.length).toBe(512);
    expect(maxAbsDiff(replies[1]!.ok.embeddings, (await ref.row(left.ids, left.typeIds)).slice(0, dim))).toBeLessThan(TOLERANCE);
    expect(replies[2]!.error).toMatchObject({ code: 'INVALID_ARGUMENT', details: expect.stringContaining('no-such-prompt') });
    expect(maxAbsDiff(replies[3]!.ok.embeddings, full)).toBeLessThan(TOLERANCE);
    expect(replies[4]!.ok.map((r: { tokens: { id: number }[] }) => r.tokens.length)).toEqual([tok.encode(short, { maxLength: 512, truncate: false }).ids.length, replies[8]!.ok.tokens.length]);
    expect(replies[5]!.ok.map((r: { text: string }) => r.text)).toEqual([tok.decode([7592, 2088], false), tok.decode([101, 7592, 102], true)]);
    expect(replies[6]!.ok).toHaveLength(2);
    expect(replies[6]!.ok[0].predictions).toEqual(replies[7]!.ok.predictions);
  });

  it('Tokenize and Decode answer as /tokenize and /decode; Info names the model', async () => {
    const [t, d, info] = await grpcCalls(port, [
      { method: '/tei.v1.Tokenize/Tokenize', request: { inputs: 'hello world', add_special_tokens: true } },
      { method: '/tei.v1.Tokenize/Decode', request: { ids: [7592, 2088] } },
      { method: '/tei.v1.Info/Info', request: {}, metadata: [['x-model', 'tiny-intent']] },
    ]);
    const http = (await (await fetch(server.url + '/tokenize', { method: 'POST', body: JSON.stringify({ inputs: 'hello world' }), headers: { 'content-type': 'application/json' } })).json()) as { id: number }[][];
    expect(t!.ok.tokens.map((x: { id: number }) => x.id)).toEqual(http[0]!.map((x) => x.id));
    expect(d!.ok.text).toBe(tok.decode([7592, 2088], false));
    expect(info!.ok).toMatchObject({ model_id: 'tiny-intent', model_type: 'MODEL_TYPE_CLASSIFIER', max_input_length: 512 });
  });

  it('health: SERVING per service while ready and able to serve it (no reranker: Rerank NOT_SERVING)', async () => {
    const check = (service: string) => ({ method: '/grpc.health.v1.Health/Check', request: { service } });
    const replies = await grpcCalls(port, ['', 'tei.v1.Embed', 'tei.v1.Predict', 'tei.v1.Rerank', 'inference.GRPCInferenceService'].map(check), [HEALTH_PROTO]);
    expect(replies.map((r) => r.ok?.status)).toEqual(['SERVING', 'SERVING', 'SERVING', 'NOT_SERVING', 'SERVING']);
  });

  it("KServe's ServerLive, ServerReady, ModelReady, ServerMetadata and ModelMetadata answer as /v2/health/*, /v2 and /v2/models/{name}; an unknown model is NOT_FOUND", async () => {
    const kserve = (method: string, request: object = {}) => ({ method: `/inference.GRPCInferenceService/${method}`, request });
    const [live, ready, modelReady, serverMeta, embedMeta, intentMeta, unknownReady, unknownMeta, badVersion] = await grpcCalls(port, [
      kserve('ServerLive'),
      kserve('ServerReady'),
      kserve('ModelReady', { name: 'tiny-intent' }),
      kserve('ServerMetadata'),
      kserve('ModelMetadata', { name: 'tiny-embed' }),
      kserve('ModelMetadata', { name: 'tiny-intent', version: '1' }),
      kserve('ModelReady', { name: 'no-such-model' }),
      kserve('ModelMetadata', { name: 'no-such-model' }),
      kserve('ModelMetadata', { name: 'tiny-embed', version: '7' }),
    ]);
    const http = async (path: string) => (await (await fetch(server.url + path)).json()) as Record<string, unknown>;
    expect(live!.ok).toEqual(await http('/v2/health/live'));
    expect(ready!.ok).toEqual(await http('/v2/health/ready'));
    expect(modelReady!.ok).toEqual({ ready: true });
    const { extensions, ...serverHttp } = await http('/v2');
    expect(extensions).toEqual([]); // protobuf's JSON leaves an empty list out
    expect(serverMeta!.ok).toEqual(serverHttp);
    // The HTTP document less its `parameters` extension, which the proto's message has no field for.
    type Meta = { inputs: { shape: (string | number)[] }[]; outputs: { shape: (string | number)[] }[] };
    const shapesAsNumbers = (m: Meta) => ({ ...m, inputs: m.inputs.map((t) => ({ ...t, shape: t.shape.map(Number) })), outputs: m.outputs.map((t) => ({ ...t, shape: t.shape.map(Number) })) });
    for (const [got, name] of [[embedMeta!, 'tiny-embed'], [intentMeta!, 'tiny-intent']] as const) {
      const { parameters, ...want } = await http(`/v2/models/${name}`);
      expect(parameters).toBeDefined();
      expect(shapesAsNumbers(got.ok as Meta)).toEqual(want);
    }
    for (const missing of [unknownReady!, unknownMeta!]) {
      expect(missing.error).toMatchObject({ code: 'NOT_FOUND', details: expect.stringContaining('no-such-model') });
      expect(missing.error!.trailing['slabserve-code']).toBe('SLABSERVE_MODEL_NOT_FOUND');
    }
    expect(badVersion!.error).toMatchObject({ code: 'NOT_FOUND', details: expect.stringContaining('"7"'), trailing: { 'slabserve-code': 'SLABSERVE_MODEL_VERSION_NOT_FOUND' } });
  });

  it('reflection lists every service and gives the files that define them', async () => {
    const [r] = await grpcCalls(port, [{ method: '/grpc.reflection.v1.ServerReflection/ServerReflectionInfo', kind: 'stream', requests: [{ list_services: '' }, { file_containing_symbol: 'tei.v1.Embed' }] }], [REFLECTION_PROTO]);
    const services = (r!.ok[0].list_services_response.service as { name: string }[]).map((x) => x.name);
    expect(services).toEqual(expect.arrayContaining(['inference.GRPCInferenceService', 'tei.v1.Embed', 'tei.v1.Predict', 'tei.v1.Rerank', 'tei.v1.Tokenize', 'tei.v1.Info', 'grpc.health.v1.Health']));
    const files = r!.ok[1].file_descriptor_response.file_descriptor_proto as string[];
    expect(files.length).toBeGreaterThan(0);
    expect(Buffer.from(files[0]!, 'base64').toString('latin1')).toContain('EmbedRequest');
  });
});

describe('gRPC: API keys, message size, a taken port', () => {
  let server: Server;
  const KEY = 'grpc-test-key-0123456789abcdef';
  const ADMIN = 'grpc-admin-key-0123456789abcdef';

  beforeAll(async () => {
    server = await startServer(testServerConfig({ models: ['tiny-embed'], apiKeys: [KEY], adminApiKeys: [ADMIN], maxBodyBytes: 4096 }));
    await server.ready;
  });
  afterAll(async () => server?.close());

  it('needs `authorization: Bearer <key>`: UNAUTHENTICATED without one or with a wrong one; admin keys for the repository', async () => {
    const embed = (md: [string, string][]) => ({ method: '/tei.v1.Embed/Embed', request: { inputs: 'hi' }, metadata: md });
    const index = (md: [string, string][]) => ({ method: '/inference.GRPCInferenceService/RepositoryIndex', request: {}, metadata: md });
    const r = await grpcCalls(server.grpcPort!, [
      embed([]),
      embed([['authorization', 'Bearer wrong-key-0123456789abcdef']]),
      embed([['authorization', `Bearer ${KEY}`]]),
      index([['authorization', `Bearer ${KEY}`]]),
      index([['authorization', `Bearer ${ADMIN}`]]),
      { method: '/inference.GRPCInferenceService/ServerLive', request: {} },
    ]);
    expect(r.map((x) => x.error?.code ?? 'OK')).toEqual(['UNAUTHENTICATED', 'UNAUTHENTICATED', 'OK', 'UNAUTHENTICATED', 'OK', 'OK']);
    expect(r[0]!.error!.trailing['slabserve-code']).toBe('SLABSERVE_UNAUTHORIZED');
  });

  it('refuses a message over --max-body-bytes with RESOURCE_EXHAUSTED', async () => {
    const r = await one(server.grpcPort!, { method: '/tei.v1.Embed/Embed', request: { inputs: 'x'.repeat(8000) }, metadata: [['authorization', `Bearer ${KEY}`]] });
    expect(r.error?.code).toBe('RESOURCE_EXHAUSTED');
  });

  it('a taken --grpc-port stops the start before warm-up, naming the flag', async () => {
    const blocker = createServer();
    const taken = await new Promise<number>((r) => blocker.listen(0, '127.0.0.1', () => r((blocker.address() as { port: number }).port)));
    try {
      await expect(startServer(testServerConfig({ models: ['tiny-embed'], grpcPort: taken }))).rejects.toMatchObject({ code: 'SLABSERVE_PORT_IN_USE', message: expect.stringContaining('--grpc-port') });
    } finally {
      blocker.close();
    }
  });
});

describe('gRPC health when nothing tells the gateway (a batch hung past --heartbeat-timeout-ms)', () => {
  it('Check reads readiness at the call (no Watch open, nothing polls); a Watch open meanwhile hears NOT_SERVING, then SERVING once the thread is replaced', { timeout: 60_000 }, async () => {
    const server = await startServer(testServerConfig({ models: ['tiny-embed'], heartbeatTimeoutMs: 600, inferenceTimeoutMs: 12_000 }));
    const stop = signal();
    try {
      await server.ready;
      const port = server.grpcPort!;
      const check = async () => (await grpcCalls(port, [{ method: '/grpc.health.v1.Health/Check', request: { service: 'tei.v1.Embed' } }], [HEALTH_PROTO]))[0]!.ok?.status;
      expect(await check()).toBe('SERVING');
      // The next run hangs in the inference thread: readiness turns false once the heartbeat is 600 ms old,
      // and nothing tells the gateway (the thread is replaced only after --inference-timeout-ms).
      await server.testHooks!.inferenceFault('hang', 1);
      const hung = fetch(`${server.url}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"inputs": "the run that hangs"}' }).then((r) => r.status);
      await eventually('/readyz 503', async () => (await fetch(`${server.url}/readyz`)).status, (s) => s === 503, 5000);
      expect(await check()).toBe('NOT_SERVING');
      // A Watch opened now: its first word is NOT_SERVING; the poll (while a Watch is open) hears the replacement's SERVING.
      const seen: string[] = [];
      const watch = grpcCalls(port, [{ method: '/grpc.health.v1.Health/Watch', kind: 'server_stream', request: { service: 'tei.v1.Embed' }, progress: true, cancel_when: stop.fired }], [HEALTH_PROTO], (_i, reply) => seen.push(reply.status));
      expect(await hung).toBe(503); // answered by the replacement's start: the hung run's input
      await eventually('the Watch hears SERVING again', async () => [...seen], (w) => w.includes('SERVING'), 30_000);
      stop.fire();
      const [watched] = await watch;
      expect(watched!.ok).toEqual([{ status: 'NOT_SERVING' }, { status: 'SERVING' }]);
      expect(await check()).toBe('SERVING');
    } finally {
      stop.fire();
      await server.close();
    }
  });
});

describe('gRPC while draining', () => {
  it('a call in flight when the drain starts is answered; health turns NOT_SERVING first; a call after it is refused', async () => {
    const server = await startServer(testServerConfig({ models: ['tiny-embed'] }));
    await server.ready;
    const port = server.grpcPort!;
    const hooks = server.testHooks!;
    const watch: string[] = [];
    let closing: Promise<void> | null = null;
    await hooks.holdInference();
    try {
      const calls = grpcCalls(port, [
        { method: '/grpc.health.v1.Health/Watch', kind: 'server_stream', request: { service: '' }, progress: true },
        { method: '/tei.v1.Embed/Embed', request: { inputs: 'in flight when the drain starts' } },
      ], [HEALTH_PROTO, ...PROTOS], (i, reply) => i === 0 && watch.push(reply.status));
      // A ready server's first word is SERVING: the health service once kept a status read before ready.
      await eventually('watching, and the call queued', async () => ({ watch: [...watch], waiting: hooks.inputsWaiting('tiny-embed') }), (v) => v.watch.length > 0 && v.waiting === 1, 20_000);
      expect(watch[0]).toBe('SERVING');
      closing = server.close();
      await eventually('health NOT_SERVING', async () => [...watch], (w) => w.includes('NOT_SERVING'), 20_000);
      const refused = await one(port, { method: '/tei.v1.Embed/Embed', request: { inputs: 'after the drain began' } });
      expect(refused.error?.code).toBe('UNAVAILABLE');
      hooks.releaseInference();
      const [watched, inFlight] = await calls;
      expect(inFlight!.ok?.embeddings).toHaveLength(128);
      // Changes only, each once (the health protocol's Watch).
      expect(watched!.ok).toEqual([{ status: 'SERVING' }, { status: 'NOT_SERVING' }]);
    } finally {
      hooks.releaseInference();
      await (closing ?? server.close());
    }
  });

  it('a drain with 32 streams open (their clients not half-closed): each answers every message it read, then ends OK; none is cut', async () => {
    const server = await startServer(testServerConfig({ models: ['tiny-embed'] }));
    await server.ready;
    const port = server.grpcPort!;
    const hooks = server.testHooks!;
    const halfClose = signal();
    const STREAMS = 32;
    const EACH = 3;
    let closing: Promise<void> | null = null;
    await hooks.holdInference();
    try {
      const streams = grpcCalls(port, Array.from({ length: STREAMS }, (_, s): Call => ({
        method: '/tei.v1.Embed/EmbedStream',
        kind: 'stream',
        open_until: halfClose.fired,
        requests: Array.from({ length: EACH }, (_, m) => ({ inputs: `stream ${s} message ${m}` })),
      })));
      await eventually('every message queued', async () => hooks.inputsWaiting('tiny-embed'), (n) => n === STREAMS * EACH, 30_000);
      closing = server.close();
      hooks.releaseInference();
      await closing; // the server has closed: every stream ended before it, the clients still holding theirs open
      halfClose.fire();
      const replies = await streams;
      expect(replies.map((r) => r.error?.code ?? 'OK')).toEqual(Array(STREAMS).fill('OK'));
      expect(replies.map((r) => (r.ok as { embeddings: number[] }[]).filter((a) => a.embeddings.length === 128).length)).toEqual(Array(STREAMS).fill(EACH));
    } finally {
      halfClose.fire();
      hooks.releaseInference();
      await (closing ?? server.close());
    }
  });
});

describe('gRPC streams: flow control', () => {
  it("a stream whose reader does not read stops being read, and holds back no other caller; once read, every answer comes, in order", async () => {
    const server = await startServer(testServerConfig({ models: ['tiny-embed'] }));
    const gate = signal();
    try {
      await server.ready;
      const port = server.grpcPort!;
      const N = 2000;
      const texts = Array.from({ length: N }, (_, i) => `message number ${i}`);
      // BDP probing off: the client's window stays 64 KiB instead of growing to megabytes.
      const streaming = grpcCalls(port, [{ method: '/tei.v1.Embed/EmbedStream', kind: 'stream', requests: texts.map((t) => ({ inputs: t })), read_when: gate.fired }], PROTOS);
      const answered = async () => (await metrics(server)).sum('slabserve_request_duration_seconds_count', { route: '/tei.v1.Embed/EmbedStream' });
      // Stalled: the same count three scrapes in a row, after some answers went out.
      let seen: number[] = [];
      await eventually('the stream stalled', async () => (seen = [...seen.slice(-2), await answered()]), (v) => v.length === 3 && v[0]! > 0 && v.every((x) => x === v[0]), 60_000);
      console.log(`grpc flow control: ${seen[0]} of ${N} messages answered while the reader did not read`);
      // Bounded by what the windows and the server's write buffer hold, not by N (without the
      // server's back-pressure it stalls past 1200 here: the client's own send window).
      expect(seen[0]).toBeLessThan(512);
      // Another caller is not held back meanwhile.
      const other = await one(port, { method: '/tei.v1.Embed/Embed', request: { inputs: 'another caller' } });
      expect(other.ok?.embeddings).toHaveLength(128);
      gate.fire();
      const [r] = await streaming;
      expect(r!.ok).toHaveLength(N);
      // In order: each answer is its own message's.
      const probes = [0, 1, N - 1];
      const rows = await grpcCalls(port, probes.map((i) => ({ method: '/tei.v1.Embed/Embed', request: { inputs: texts[i] } })));
      probes.forEach((i, k) => expect(maxAbsDiff(r!.ok[i].embeddings, rows[k]!.ok.embeddings)).toBeLessThan(TOLERANCE));
    } finally {
      gate.fire();
      await server.close();
    }
  }, 120_000);
});

describe('gRPC: the repository RPCs, a reranker, the other streams, overload', () => {
  let server: Server;
  let port: number;
  const SLOTS = 8;

  beforeAll(async () => {
    server = await startServer(testServerConfig({ models: ['tiny-embed', 'tiny-intent'], modelControlMode: 'explicit', slotsPerModel: SLOTS }));
    await server.ready;
    port = server.grpcPort!;
  });
  afterAll(async () => server?.close());

  it('RepositoryModelLoad loads a model while serving; Rerank and RerankStream then answer as the cross-encoder run alone; RepositoryModelUnload takes it away', async () => {
    const rerankRef = await PlainReference.open('tiny-rerank');
    const intentRef = await Reference.open('tiny-intent');
    const rerankTok = await loadTokenizer(rerankRef.spec.tokenizerPath);
    const intentTok = await loadTokenizer(intentRef.spec.tokenizerPath);
    const texts = randomTexts(makeRandom('grpc rerank'), vocabularyWords(rerankRef.spec), 4, 8);
    const [loaded] = await grpcCalls(port, [{ method: '/inference.GRPCInferenceService/RepositoryModelLoad', request: { model_name: 'tiny-rerank' } }]);
    expect(loaded!.ok).toEqual({});
    const [index, ranked, streamed, stream2] = await grpcCalls(port, [
      { method: '/inference.GRPCInferenceService/RepositoryIndex', request: { ready: true } },
      { method: '/tei.v1.Rerank/Rerank', request: { query: texts[0], texts: texts.slice(1), return_text: true } },
      { method: '/tei.v1.Rerank/RerankStream', kind: 'client_stream', requests: texts.slice(1).map((t) => ({ query: texts[0], text: t, return_text: true })) },
      { method: '/tei.v1.Predict/PredictStream', kind: 'stream', requests: texts.map((t) => ({ inputs: t })) },
    ]);
    expect((index!.ok.models as { name: string }[]).map((m) => m.name).sort()).toEqual(['tiny-embed', 'tiny-intent', 'tiny-rerank']);
    // The reference: each (query, text) pair run alone through the unmodified graph, its logit's sigmoid.
    const scores = await Promise.all(texts.slice(1).map(async (t) => {
      const pair = rerankTok.encodePair!(texts[0]!, t, { maxLength: 512, truncate: false });
      return (await rerankRef.rerank(pair.ids, pair.typeIds)).score;
    }));
    const best = scores.map((score, index) => ({ index, score })).sort((a, b) => b.score - a.score);
    for (const [what, reply] of [['Rerank', ranked!], ['RerankStream', streamed!]] as const) {
      const ranks = reply.ok.ranks as { index?: number; score: number; text?: string }[];
      expect(ranks.map((r) => r.index ?? 0), what).toEqual(best.map((b) => b.index));
      for (const r of ranks) {
        expect(Math.abs(r.score - scores[r.index ?? 0]!), what).toBeLessThan(TOLERANCE);
        expect(r.text, what).toBe(texts[1 + (r.index ?? 0)]);
      }
    }
    expect(ranked!.ok.metadata.compute_tokens).toBeGreaterThan(0);
    // PredictStream: an answer per message, in order, each the classifier's softmax.
    expect(stream2!.ok).toHaveLength(texts.length);
    for (const [i, t] of texts.entries()) {
      const want = (await intentRef.rowOfText(intentTok, t)).slice(0, intentRef.spec.labels.length);
      for (const p of stream2!.ok[i].predictions as { label: string; score: number }[]) expect(Math.abs(p.score - want[intentRef.spec.labels.indexOf(p.label)]!)).toBeLessThan(TOLERANCE);
    }
    await rerankRef.close();
    await intentRef.close();
    const [unloaded, after] = await grpcCalls(port, [
      { method: '/inference.GRPCInferenceService/RepositoryModelUnload', request: { model_name: 'tiny-rerank' } },
      { method: '/inference.GRPCInferenceService/RepositoryModelUnload', request: { model_name: 'no-such-folder' } },
    ]);
    expect(unloaded!.ok).toEqual({});
    expect(after!.error?.code).toBe('INVALID_ARGUMENT'); // Triton answers a repository refusal 400: INVALID_ARGUMENT
    const gone = await one(port, { method: '/tei.v1.Rerank/Rerank', request: { query: 'a', texts: ['b'] } });
    expect(gone.error?.code).toBe('NOT_FOUND');
  });

  it("health follows the models: a Watch on tei.v1.Rerank turns SERVING when a reranker loads and NOT_SERVING when it unloads; a Watch on the server hears no change", async () => {
    const stop = signal();
    const rerank: string[] = [];
    const server: string[] = [];
    const watch = (service: string) => ({ method: '/grpc.health.v1.Health/Watch', kind: 'server_stream' as const, request: { service }, progress: true, cancel_when: stop.fired });
    const watches = grpcCalls(port, [watch('tei.v1.Rerank'), watch('')], [HEALTH_PROTO], (i, reply) => (i === 0 ? rerank : server).push(reply.status));
    try {
      await eventually('both watching', async () => [rerank.length, server.length], ([r, s]) => r! > 0 && s! > 0);
      expect((await one(port, { method: '/inference.GRPCInferenceService/RepositoryModelLoad', request: { model_name: 'tiny-rerank' } })).ok).toEqual({});
      await eventually('Rerank SERVING', async () => [...rerank], (r) => r.length >= 2);
      expect((await one(port, { method: '/inference.GRPCInferenceService/RepositoryModelUnload', request: { model_name: 'tiny-rerank' } })).ok).toEqual({});
      await eventually('Rerank NOT_SERVING again', async () => [...rerank], (r) => r.length >= 3);
    } finally {
      stop.fire();
    }
    const [onRerank, onServer] = await watches;
    expect(onRerank!.ok).toEqual([{ status: 'NOT_SERVING' }, { status: 'SERVING' }, { status: 'NOT_SERVING' }]);
    expect(onServer!.ok).toEqual([{ status: 'SERVING' }]); // a change elsewhere is not news to this Watch
    expect([onRerank!.error?.code, onServer!.error?.code]).toEqual(['CANCELLED', 'CANCELLED']);
  });

  it('PredictPair tokenizes the two inputs as a pair: the classifier\'s answer for that pair, not for either text', async () => {
    const [pair, a] = await grpcCalls(port, [
      { method: '/tei.v1.Predict/PredictPair', request: { inputs: ['where is my parcel', 'it shipped yesterday'], raw_scores: true } },
      { method: '/tei.v1.Predict/Predict', request: { inputs: 'where is my parcel', raw_scores: true } },
    ]);
    const ref = await Reference.open('tiny-intent');
    try {
      const tokenizer = await loadTokenizer(ref.spec.tokenizerPath);
      const enc = tokenizer.encodePair!('where is my parcel', 'it shipped yesterday', { maxLength: 512, truncate: false });
      const logits = (await ref.row(enc.ids, enc.typeIds)).slice(ref.spec.labels.length);
      for (const p of pair!.ok.predictions as { label: string; score: number }[]) expect(Math.abs(p.score - logits[ref.spec.labels.indexOf(p.label)]!)).toBeLessThan(TOLERANCE);
      expect(pair!.ok.predictions[0]).not.toEqual(a!.ok.predictions[0]);
    } finally {
      await ref.close();
    }
  });

  it('no free slot: RESOURCE_EXHAUSTED with the retry delay in the trailers', async () => {
    const hooks = server.testHooks!;
    await hooks.holdInference();
    try {
      const fill = Promise.all(Array.from({ length: SLOTS }, (_, i) => fetch(server.url + '/embed', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: `filler ${i}` }) })));
      await eventually('every slot taken', async () => hooks.inputsWaiting('tiny-embed'), (n) => n === SLOTS, 10_000);
      const r = await one(port, { method: '/tei.v1.Embed/Embed', request: { inputs: 'one too many' } });
      expect(r.error).toMatchObject({ code: 'RESOURCE_EXHAUSTED', trailing: { 'slabserve-code': 'SLABSERVE_OVERLOADED', 'retry-after': expect.stringMatching(/^[1-9]\d*$/), 'grpc-retry-pushback-ms': expect.stringMatching(/^[1-9]\d*000$/) } });
      hooks.releaseInference();
      expect((await fill).map((f) => f.status)).toEqual(Array(SLOTS).fill(200));
    } finally {
      hooks.releaseInference();
    }
  });
});

describe('gRPC on threads of its own (--grpc-threads)', () => {
  it('a thread that serves only gRPC answers calls, the gateway answers HTTP, and the metrics name it grpc-N', async () => {
    const server = await startServer(testServerConfig({ models: ['tiny-embed'], gatewayThreads: 1, grpcThreads: 1 }));
    try {
      await server.ready;
      const [r] = await grpcCalls(server.grpcPort!, [{ method: '/tei.v1.Embed/Embed', request: { inputs: 'on a thread of its own' } }]);
      expect(r!.ok.embeddings).toHaveLength(128);
      const http = await fetch(server.url + '/embed', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: 'over HTTP' }) });
      expect(http.status).toBe(200);
      const m = await metrics(server);
      expect(m.has('slabserve_thread_cpu_seconds_total', { thread: 'grpc-1' })).toBe(true);
      expect(m.has('slabserve_thread_cpu_seconds_total', { thread: 'gateway-0' })).toBe(true);
      expect(m.sum('slabserve_request_duration_seconds_count', { route: '/tei.v1.Embed/Embed' })).toBe(1);
    } finally {
      await server.close();
    }
  });
});

describe('gRPC from the CLI', () => {
  it('`slabserve serve --grpc-port N` serves gRPC there (the variable SLABSERVE_GRPC_PORT=0 of the test run loses to the flag) and drains on SIGTERM', async () => {
    const grpcPort = await portOutsideEphemeral();
    const server = await serveCli(['--grpc-port', String(grpcPort)]);
    try {
      expect(server.stderr()).toContain(`grpc on 127.0.0.1:${grpcPort}`);
      const r = await one(grpcPort, { method: '/tei.v1.Embed/Embed', request: { inputs: 'from the command line' } });
      expect(r.ok?.embeddings).toHaveLength(128);
    } finally {
      server.kill('SIGTERM');
    }
    expect((await server.exited).code).toBe(0);
  });
});
