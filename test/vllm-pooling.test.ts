/**
 * vLLM's pooling routes on a real server (port 0, CPU), through fetch, with the request and answer
 * fields of vLLM's protocol definitions (vllm/frontend/entrypoints/pooling/scoring/protocol.py and
 * classify/protocol.py): /score and /v1/score (queries/documents, and the older text_1/text_2;
 * 1:1, 1:N and N:N) and /classify and /v1/classify. Scores against the reference: a plain
 * onnxruntime session of the unmodified graph, one input or pair at a time, finished here: the
 * sigmoid of tiny-rerank's logit, the cosine of tiny-embed's mean-pooled rows, the softmax of
 * tiny-intent's logits.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { parseMetrics } from './fixtures/http-client.js';
import { makeRandom, maxAbsDiff, PlainReference, randomTexts, sigmoid, testServerConfig, vocabularyWords } from './helpers.js';

const TOLERANCE = 1e-5;
const MAX = 128;

let server: Server;
let rerankRef: PlainReference;
let embedRef: PlainReference;
let intentRef: PlainReference;
let tok: TextTokenizer;
let words: string[];

beforeAll(async () => {
  server = await startServer(testServerConfig({ models: ['tiny-rerank', 'tiny-embed', 'tiny-intent'], batching: { buckets: [8, 16, 32, 64, MAX] } }));
  await server.ready;
  [rerankRef, embedRef, intentRef] = await Promise.all(['tiny-rerank', 'tiny-embed', 'tiny-intent'].map((m) => PlainReference.open(m)));
  tok = await loadTokenizer(rerankRef.spec.tokenizerPath);
  words = vocabularyWords(rerankRef.spec);
}, 120_000);

afterAll(async () => {
  await Promise.all([rerankRef?.close(), embedRef?.close(), intentRef?.close()]);
  await server?.close();
});

async function post(path: string, body: unknown): Promise<{ status: number; body: any }> {
  const r = await fetch(server.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: JSON.parse(await r.text()) };
}

const bare = (text: string) => Array.from(tok.encode(text, { maxLength: 100_000, truncate: false }).ids).slice(1, -1);

/** The cross-encoder's logit for (a, b): [CLS] a [SEP] b [SEP], types 0 then 1, built here. */
async function logit(a: string, b: string): Promise<number> {
  const [x, y] = [bare(a), bare(b)];
  const ids = [101, ...x, 102, ...y, 102];
  return (await rerankRef.rerank(ids, ids.map((_, i) => (i < x.length + 2 ? 0 : 1)))).logit;
}

async function cosine(a: string, b: string): Promise<number> {
  const [u, v] = await Promise.all([a, b].map((t) => embedRef.embedding(tok.encode(t, { maxLength: MAX, truncate: false }).ids)));
  return u!.reduce((s, x, i) => s + x * v![i]!, 0);
}

/** A score answer's shape, as vLLM's ScoreResponse; its scores in order. */
function scoresOf(body: any, model: string, count: number): number[] {
  expect(body).toMatchObject({ object: 'list', model, usage: { prompt_tokens: expect.any(Number), completion_tokens: 0, prompt_tokens_details: null } });
  expect(body.id).toMatch(/^score-/);
  expect(Number.isInteger(body.created)).toBe(true);
  expect(body.usage.total_tokens).toBe(body.usage.prompt_tokens);
  expect(body.data).toHaveLength(count);
  body.data.forEach((d: any, i: number) => expect(d).toMatchObject({ index: i, object: 'score' }));
  return body.data.map((d: { score: number }) => d.score);
}

describe("vLLM's /score", () => {
  it("a cross-encoder: 1:N with text_1/text_2, N:N with queries/documents, 1:1; the score is the sigmoid of the unmodified graph's logit", async () => {
    const rand = makeRandom('vllm score rerank');
    const query = randomTexts(rand, words, 1, 8)[0]!;
    const docs = randomTexts(rand, words, 4, 25);
    const queries = randomTexts(rand, words, 4, 8);

    const oneToMany = await post('/score', { model: 'tiny-rerank', text_1: query, text_2: docs });
    expect(oneToMany.status).toBe(200);
    const s1 = scoresOf(oneToMany.body, 'tiny-rerank', docs.length);
    for (const [i, d] of docs.entries()) expect(Math.abs(s1[i]! - sigmoid(await logit(query, d)))).toBeLessThan(TOLERANCE);
    expect(oneToMany.body.usage.prompt_tokens).toBe(docs.reduce((n, d) => n + bare(query).length + bare(d).length + 3, 0));

    const pairwise = await post('/v1/score', { model: 'tiny-rerank', queries, documents: docs, request_id: 'r-1', user: 'u', priority: 0 });
    const s2 = scoresOf(pairwise.body, 'tiny-rerank', docs.length);
    for (const [i, d] of docs.entries()) expect(Math.abs(s2[i]! - sigmoid(await logit(queries[i]!, d))), `pair ${i}`).toBeLessThan(TOLERANCE);

    const single = await post('/score', { model: 'tiny-rerank', queries: [query], documents: docs[0] });
    expect(Math.abs(scoresOf(single.body, 'tiny-rerank', 1)[0]! - sigmoid(await logit(query, docs[0]!)))).toBeLessThan(TOLERANCE);
    // use_activation false: the logit; text parts ({content}) are texts; no model named: the first reranker
    const raw = await post('/score', { text_1: { content: [{ type: 'text', text: query }] }, text_2: docs[1], use_activation: false });
    expect(Math.abs(scoresOf(raw.body, 'tiny-rerank', 1)[0]! - (await logit(query, docs[1]!)))).toBeLessThan(TOLERANCE);
  });

  it('an embedding model: the cosine of the two texts\' embeddings, as vLLM scores with one', async () => {
    const rand = makeRandom('vllm score embed');
    const [a, ...bs] = randomTexts(rand, words, 4, 20);
    const r = await post('/v1/score', { model: 'tiny-embed', queries: a, documents: bs });
    const s = scoresOf(r.body, 'tiny-embed', bs.length);
    for (const [i, b] of bs.entries()) expect(Math.abs(s[i]! - (await cosine(a!, b)))).toBeLessThan(TOLERANCE);
    const nn = await post('/score', { model: 'tiny-embed', text_1: bs, text_2: [a, a, a] });
    const s2 = scoresOf(nn.body, 'tiny-embed', 3);
    for (const [i, b] of bs.entries()) expect(Math.abs(s2[i]! - (await cosine(b, a!)))).toBeLessThan(TOLERANCE);
  });

  it("truncate_prompt_tokens -1 cuts a pair to the model's length (absent: 400); max_tokens_per_doc cuts the document first", async () => {
    const rand = makeRandom('vllm score cut');
    const long = Array.from({ length: 200 }, () => words[Math.floor(rand() * words.length)]).join(' ');
    const refused = await post('/score', { model: 'tiny-rerank', text_1: 'parcel', text_2: long });
    expect(refused.status).toBe(400);
    expect(refused.body.error).toMatchObject({ type: 'BadRequestError', code: 400, message: expect.stringMatching(/truncate_prompt_tokens/) });
    const cut = await post('/score', { model: 'tiny-rerank', text_1: 'parcel', text_2: long, truncate_prompt_tokens: -1 });
    const q = bare('parcel');
    const ids = [101, ...q, 102, ...bare(long).slice(0, MAX - q.length - 3), 102];
    const want = sigmoid((await rerankRef.rerank(ids, ids.map((_, i) => (i < q.length + 2 ? 0 : 1)))).logit);
    expect(Math.abs(scoresOf(cut.body, 'tiny-rerank', 1)[0]! - want)).toBeLessThan(TOLERANCE);
    const perDoc = await post('/score', { model: 'tiny-rerank', text_1: 'parcel', text_2: long, max_tokens_per_doc: 6 });
    const ids6 = [101, ...q, 102, ...bare(long).slice(0, 6), 102];
    const want6 = sigmoid((await rerankRef.rerank(ids6, ids6.map((_, i) => (i < q.length + 2 ? 0 : 1)))).logit);
    expect(Math.abs(scoresOf(perDoc.body, 'tiny-rerank', 1)[0]! - want6)).toBeLessThan(TOLERANCE);
  });

  it("bad input is a 400 (unknown model 404) in vLLM's shape {error: {message, type, param, code}}", async () => {
    const cases: [unknown, number][] = [
      [{ model: 'tiny-rerank', text_1: ['a', 'b'], text_2: ['a', 'b', 'c'] }, 400],
      [{ model: 'tiny-rerank', queries: [], documents: ['a'] }, 400],
      [{ model: 'tiny-rerank', queries: 'q', documents: [] }, 400],
      [{ model: 'tiny-rerank', text_1: 'q' }, 400],
      [{ model: 'tiny-rerank', text_1: 'q', text_2: '' }, 400],
      [{ model: 'tiny-rerank', text_1: 'q', text_2: { content: [{ type: 'image_url', image_url: { url: 'x' } }] } }, 400],
      [{ model: 'tiny-intent', text_1: 'q', text_2: 'd' }, 400],
      [{ model: 'tiny-rerank', text_1: 'q', text_2: 'd', truncate_prompt_tokens: -2 }, 400],
      [{ model: 'nope', text_1: 'q', text_2: 'd' }, 404],
    ];
    for (const [body, status] of cases) {
      const r = await post('/score', body);
      expect(r.status, JSON.stringify(body)).toBe(status);
      expect(r.body, JSON.stringify(body)).toEqual({ error: { message: expect.any(String), type: status === 404 ? 'NotFoundError' : 'BadRequestError', param: expect.toSatisfy((p: unknown) => p === null || typeof p === 'string'), code: status } });
    }
  });
});

describe("vLLM's /classify", () => {
  it('labels with their probabilities: the softmax of the unmodified graph\'s logits; token ids are the model\'s own; use_activation false gives the logits', async () => {
    const rand = makeRandom('vllm classify');
    const texts = randomTexts(rand, words, 3, 20);
    const labels = intentRef.spec.labels;
    for (const path of ['/classify', '/v1/classify']) {
      const r = await post(path, { model: 'tiny-intent', input: texts, request_id: 'x', encoding_format: 'float' });
      expect(r.status, path).toBe(200);
      expect(r.body).toMatchObject({ object: 'list', model: 'tiny-intent', usage: { completion_tokens: 0, prompt_tokens_details: null } });
      expect(r.body.id).toMatch(/^classify-/);
      expect(r.body.data).toHaveLength(texts.length);
      for (const [i, t] of texts.entries()) {
        const want = await intentRef.classification(tok.encode(t, { maxLength: MAX, truncate: false }).ids);
        const d = r.body.data[i];
        expect(d).toMatchObject({ index: i, num_classes: labels.length });
        expect(maxAbsDiff(d.probs, want.probabilities)).toBeLessThan(TOLERANCE);
        expect(d.label).toBe(labels[want.probabilities.indexOf(Math.max(...want.probabilities))]);
      }
      expect(r.body.usage.prompt_tokens).toBe(texts.reduce((n, t) => n + bare(t).length + 2, 0));
    }
    const ids = Array.from(tok.encode(texts[0]!, { maxLength: MAX, truncate: false }).ids);
    const byIds = await post('/classify', { input: ids });
    const want = await intentRef.classification(ids);
    expect(maxAbsDiff(byIds.body.data[0].probs, want.probabilities)).toBeLessThan(TOLERANCE);
    const logits = await post('/classify', { input: texts[0], use_activation: false });
    expect(maxAbsDiff(logits.body.data[0].probs, want.logits)).toBeLessThan(TOLERANCE);
  });

  it("bad input is a 400 in vLLM's shape: the chat form, an empty input, a reranker, add_special_tokens false, too long without truncate_prompt_tokens", async () => {
    const cases: unknown[] = [
      { model: 'tiny-intent', messages: [{ role: 'user', content: 'hi' }] },
      { model: 'tiny-intent', input: [] },
      { model: 'tiny-intent', input: '' },
      { model: 'tiny-rerank', input: 'hi' },
      { model: 'tiny-intent', input: 'hi', add_special_tokens: false },
      { model: 'tiny-intent', input: 'parcel '.repeat(200) },
    ];
    for (const body of cases) {
      const r = await post('/v1/classify', body);
      expect(r.status, JSON.stringify(body).slice(0, 80)).toBe(400);
      expect(r.body.error, JSON.stringify(body).slice(0, 80)).toMatchObject({ type: 'BadRequestError', code: 400, message: expect.any(String) });
    }
    const cut = await post('/v1/classify', { model: 'tiny-intent', input: 'parcel '.repeat(200), truncate_prompt_tokens: 10 });
    const want = await intentRef.classification(tok.encode('parcel '.repeat(200), { maxLength: 10, truncate: true }).ids);
    expect(maxAbsDiff(cut.body.data[0].probs, want.probabilities)).toBeLessThan(TOLERANCE);
    expect(cut.body.usage.prompt_tokens).toBe(10);
  });

  it('every route counts under its own label', async () => {
    const metrics = parseMetrics(await (await fetch(server.url + '/metrics')).text());
    for (const [route, model] of [['/score', 'tiny-rerank'], ['/v1/score', 'tiny-embed'], ['/classify', 'tiny-intent'], ['/v1/classify', 'tiny-intent']]) {
      expect(metrics.sum('slabserve_request_inputs_total', { model: model!, route: route! }), route).toBeGreaterThan(0);
    }
  });
});
