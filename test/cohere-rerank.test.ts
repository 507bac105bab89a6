/**
 * Cohere's and Jina's rerank APIs on a real server (port 0, CPU), through the official clients
 * unchanged: cohere-ai's CohereClientV2 (POST /v2/rerank), LangChain's CohereRerank (which calls
 * POST /v1/rerank through its own cohere-ai 7 CohereClient), and Jina's rerank API through fetch,
 * as its published definition reads (documents as strings or {text}, `top_n`,
 * `return_documents`; answer `{model, usage: {total_tokens}, results: [{index, document: {text},
 * relevance_score}]}`). Every relevance score is checked against the reference: the sigmoid of the
 * cross-encoder's logit from a plain onnxruntime session of the unmodified models/tiny-rerank graph,
 * one pair at a time, the pair's ids built by this test ([CLS] query [SEP] document [SEP]).
 */
import { createRequire } from 'node:module';
import { Document } from '@langchain/core/documents';
import { CohereRerank } from '@langchain/cohere';
import { CohereClientV2 } from 'cohere-ai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { parseMetrics } from './fixtures/http-client.js';
import { makeRandom, PlainReference, randomTexts, testServerConfig, vocabularyWords } from './helpers.js';

const TOLERANCE = 1e-5;
/** The server's buckets end at 128: the model takes 128 tokens a pair. */
const MAX = 128;
const KEY = 'test-key';

/** The cohere-ai CohereClient that @langchain/cohere itself depends on (its major, 7), as a LangChain user builds it. */
const LangChainCohereClient = createRequire(createRequire(import.meta.url).resolve('@langchain/cohere'))('cohere-ai').CohereClient as new (o: { token: string; environment: string }) => any;

let server: Server;
let ref: PlainReference;
let tok: TextTokenizer;
let words: string[];

beforeAll(async () => {
  server = await startServer(testServerConfig({ models: ['tiny-rerank', 'tiny-embed'], apiKeys: [KEY], batching: { buckets: [8, 16, 32, 64, MAX] } }));
  await server.ready;
  ref = await PlainReference.open('tiny-rerank');
  tok = await loadTokenizer(ref.spec.tokenizerPath);
  words = vocabularyWords(ref.spec);
}, 120_000);

afterAll(async () => {
  await ref?.close();
  await server?.close();
});

/** A text's ids without [CLS] and [SEP]. */
const bare = (text: string) => Array.from(tok.encode(text, { maxLength: 100_000, truncate: false }).ids).slice(1, -1);

/**
 * The reference score of (query, document): [CLS] q [SEP] d [SEP], types 0 then 1, the document
 * cut to `perDoc` tokens, then the longer side cut first until the pair fits the model (as
 * transformers' longest_first does).
 */
async function expected(query: string, doc: string, perDoc = Infinity): Promise<number> {
  const q = bare(query);
  let d = bare(doc).slice(0, perDoc);
  let qs = q;
  while (qs.length + d.length + 3 > MAX) {
    if (d.length >= qs.length) d = d.slice(0, -1);
    else qs = qs.slice(0, -1);
  }
  const ids = [101, ...qs, 102, ...d, 102];
  const types = ids.map((_, i) => (i < qs.length + 2 ? 0 : 1));
  return (await ref.rerank(ids, types)).score;
}

async function post(path: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: any; headers: Headers }> {
  const r = await fetch(server.url + path, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}`, ...headers }, body: JSON.stringify(body) });
  const text = await r.text();
  return { status: r.status, body: JSON.parse(text), headers: r.headers };
}

/** Checks results best first, each score the reference's for its document. */
async function expectRanked(results: { index: number; relevanceScore?: number; relevance_score?: number }[], query: string, docs: string[], count: number, perDoc?: number): Promise<void> {
  expect(results).toHaveLength(count);
  const want = await Promise.all(docs.map((d) => expected(query, d, perDoc)));
  const order = want.map((s, i) => ({ s, i })).sort((a, b) => b.s - a.s || a.i - b.i);
  // best first: the same order as the reference's, the scores within tolerance
  const got = results.map((r) => ({ index: r.index, score: r.relevanceScore ?? r.relevance_score! }));
  for (let k = 1; k < got.length; k++) expect(got[k - 1]!.score).toBeGreaterThanOrEqual(got[k]!.score);
  for (const g of got) expect(Math.abs(g.score - want[g.index]!), `document ${g.index}`).toBeLessThan(TOLERANCE);
  expect(new Set(got.map((g) => g.index)).size).toBe(count);
  // the top `count` of the reference (scores closer than the tolerance may swap)
  for (const g of got) expect(want[g.index]!).toBeGreaterThanOrEqual(order[count - 1]!.s - TOLERANCE);
}

describe('Cohere Rerank v2 (cohere-ai CohereClientV2)', () => {
  it('relevance scores are the sigmoid of the unmodified graph\'s logit, best first, cut to top_n; meta says v2 and its search units', async () => {
    const rand = makeRandom('cohere v2 rerank');
    const query = randomTexts(rand, words, 1, 8)[0]!;
    const docs = randomTexts(rand, words, 7, 30);
    const cohere = new CohereClientV2({ token: KEY, environment: server.url });
    const r = await cohere.rerank({ model: 'tiny-rerank', query, documents: docs, topN: 3 });
    await expectRanked(r.results, query, docs, 3);
    expect(typeof r.id).toBe('string');
    expect(r.meta?.apiVersion?.version).toBe('2');
    expect(r.meta?.billedUnits?.searchUnits).toBe(1);
    // no top_n, and a top_n above the number of documents: all of them
    await expectRanked((await cohere.rerank({ model: 'tiny-rerank', query, documents: docs })).results, query, docs, docs.length);
    await expectRanked((await cohere.rerank({ model: 'tiny-rerank', query, documents: docs, topN: 50 })).results, query, docs, docs.length);
  });

  it('a document longer than the model takes is cut (Cohere\'s default); max_tokens_per_doc cuts each document to that many tokens first', async () => {
    const rand = makeRandom('cohere v2 long');
    const query = randomTexts(rand, words, 1, 6)[0]!;
    const long = Array.from({ length: 200 }, () => words[Math.floor(rand() * words.length)]).join(' ');
    const docs = [long, ...randomTexts(rand, words, 3, 40)];
    expect(bare(long).length).toBeGreaterThan(MAX);
    const cohere = new CohereClientV2({ token: KEY, environment: server.url });
    await expectRanked((await cohere.rerank({ model: 'tiny-rerank', query, documents: docs })).results, query, docs, docs.length);
    const cut = await cohere.rerank({ model: 'tiny-rerank', query, documents: docs, maxTokensPerDoc: 5 });
    await expectRanked(cut.results, query, docs, docs.length, 5);
    // documents as {text} objects, as the clients also send them
    const asObjects = await post('/v2/rerank', { model: 'tiny-rerank', query, documents: docs.map((text) => ({ text })), max_tokens_per_doc: 5 });
    expect(asObjects.status).toBe(200);
    await expectRanked(asObjects.body.results, query, docs, docs.length, 5);
  });

  it('bad input is a 400 (unknown model 404) in Cohere\'s shape {id, message}: missing query, empty documents, top_n of 0, no model', async () => {
    const cases: [unknown, number][] = [
      [{ model: 'tiny-rerank', documents: ['a'] }, 400],
      [{ model: 'tiny-rerank', query: 'q', documents: [] }, 400],
      [{ model: 'tiny-rerank', query: 'q', documents: ['a'], top_n: 0 }, 400],
      [{ model: 'tiny-rerank', query: 'q', documents: [''] }, 400],
      [{ model: 'tiny-rerank', query: 'q', documents: [{ title: 'no text' }] }, 400],
      [{ query: 'q', documents: ['a'] }, 400],
      [{ model: 'tiny-embed', query: 'q', documents: ['a'] }, 400],
      [{ model: 'nope', query: 'q', documents: ['a'] }, 404],
    ];
    for (const [body, status] of cases) {
      const r = await post('/v2/rerank', body);
      expect(r.status, JSON.stringify(body)).toBe(status);
      expect(r.body, JSON.stringify(body)).toEqual({ id: expect.any(String), message: expect.any(String), code: expect.stringMatching(/^SLABSERVE_/) });
    }
    // through the client: its typed error with the status and our body
    const err = await new CohereClientV2({ token: KEY, environment: server.url }).rerank({ model: 'nope', query: 'q', documents: ['a'] }).catch((e: unknown) => e);
    expect((err as { statusCode?: number }).statusCode).toBe(404);
  });
});

describe("LangChain's CohereRerank (cohere-ai 7, POST /v1/rerank)", () => {
  it('rerank() and compressDocuments(): its default top 3 of fewer documents returns them all; scores are the reference\'s', async () => {
    const rand = makeRandom('langchain rerank');
    const query = randomTexts(rand, words, 1, 8)[0]!;
    const docs = randomTexts(rand, words, 2, 25);
    const reranker = new CohereRerank({ client: new LangChainCohereClient({ token: KEY, environment: server.url }), model: 'tiny-rerank' });
    const ranked = await reranker.rerank(docs, query);
    await expectRanked(ranked, query, docs, 2); // topN 3 by default, 2 documents: both

    const five = randomTexts(rand, words, 5, 25);
    const compressed = await reranker.compressDocuments(five.map((pageContent, i) => new Document({ pageContent, metadata: { i } })), query);
    expect(compressed).toHaveLength(3);
    await expectRanked(
      compressed.map((d) => ({ index: d.metadata.i as number, relevanceScore: d.metadata.relevanceScore as number })),
      query,
      five,
      3,
    );
  });
});

describe("Jina's rerank API and Cohere v1 on POST /v1/rerank", () => {
  it('one answer both read: results with document {text} (Jina\'s default), model and usage.total_tokens (Jina\'s), id and meta (Cohere\'s)', async () => {
    const rand = makeRandom('jina rerank');
    const query = randomTexts(rand, words, 1, 8)[0]!;
    const docs = randomTexts(rand, words, 6, 25);
    const r = await post('/v1/rerank', { model: 'tiny-rerank', query, documents: docs, top_n: 4 });
    expect(r.status).toBe(200);
    await expectRanked(r.body.results, query, docs, 4);
    for (const x of r.body.results) expect(x.document).toEqual({ text: docs[x.index] });
    expect(r.body.model).toBe('tiny-rerank');
    const tokens = docs.reduce((n, d) => n + bare(query).length + bare(d).length + 3, 0);
    expect(r.body.usage).toEqual({ prompt_tokens: tokens, total_tokens: tokens });
    expect(r.body.meta).toEqual({ api_version: { version: '1' }, billed_units: { search_units: 1 } });
    expect(typeof r.body.id).toBe('string');

    // documents as {text} objects (Jina's and Cohere's), other fields echoed; return_documents false leaves them out
    const objects = docs.map((text, i) => ({ text, source: `doc-${i}` }));
    const withObjects = await post('/v1/rerank', { model: 'tiny-rerank', query, documents: objects, return_documents: true });
    await expectRanked(withObjects.body.results, query, docs, docs.length);
    for (const x of withObjects.body.results) expect(x.document).toEqual(objects[x.index]);
    const bareResults = await post('/v1/rerank', { query, documents: docs, return_documents: false, top_n: 100, rank_fields: ['text'], max_chunks_per_doc: null });
    await expectRanked(bareResults.body.results, query, docs, docs.length);
    for (const x of bareResults.body.results) expect(Object.keys(x).sort()).toEqual(['index', 'relevance_score']);
  });

  it("a document past the model's length is cut by default; truncate: false (our extension) refuses it", async () => {
    const rand = makeRandom('v1 truncation');
    const long = Array.from({ length: 200 }, () => words[Math.floor(rand() * words.length)]).join(' ');
    const cut = await post('/v1/rerank', { model: 'tiny-rerank', query: 'parcel', documents: [long, 'where is my parcel'] });
    expect(cut.status).toBe(200);
    await expectRanked(cut.body.results, 'parcel', [long, 'where is my parcel'], 2);
    const refused = await post('/v1/rerank', { model: 'tiny-rerank', query: 'parcel', documents: [long], truncate: false });
    expect(refused.status).toBe(400);
    expect(refused.body).toMatchObject({ message: expect.stringMatching(/"truncate": true/), detail: expect.any(String), code: 'SLABSERVE_INPUT_TOO_LONG' });
  });

  it('bad input is a 400 with Cohere\'s message and Jina\'s detail: missing query, empty documents, top_n of 0', async () => {
    for (const body of [{ documents: ['a'] }, { query: 'q', documents: [] }, { query: 'q', documents: ['a'], top_n: 0 }, { query: 'q' }, { query: 'q', documents: [{ text: 'a', title: 't' }], rank_fields: ['title', 'text'] }]) {
      const r = await post('/v1/rerank', body);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(r.body, JSON.stringify(body)).toEqual({ id: expect.any(String), message: expect.any(String), detail: r.body.message, code: 'SLABSERVE_INVALID_INPUT' });
    }
  });
});

describe('what every route has, on the rerank routes', () => {
  it('the API key (401 in Cohere\'s shape), a deadline header (x-deadline-ms), priority, and metrics by route', async () => {
    for (const path of ['/v2/rerank', '/v1/rerank']) {
      const r = await post(path, { model: 'tiny-rerank', query: 'q', documents: ['a'] }, { authorization: 'Bearer wrong' });
      expect(r.status, path).toBe(401);
      expect(r.body, path).toMatchObject({ message: expect.any(String), code: 'SLABSERVE_UNAUTHORIZED' });
      const bad = await post(path, { model: 'tiny-rerank', query: 'q', documents: ['a'] }, { 'x-deadline-ms': 'soon' });
      expect(bad.status, path).toBe(400);
      const ok = await post(path, { model: 'tiny-rerank', query: 'q', documents: ['a'], priority: 1 }, { 'x-deadline-ms': '5000', 'x-priority': 'bulk' });
      expect(ok.status, path).toBe(200);
      expect(ok.headers.get('x-inference-time')).toMatch(/^\d+\.\d{3}$/);
    }
    const metrics = parseMetrics(await (await fetch(server.url + '/metrics')).text());
    for (const route of ['/v2/rerank', '/v1/rerank']) expect(metrics.sum('slabserve_request_inputs_total', { model: 'tiny-rerank', route }), route).toBeGreaterThan(0);
  });
});
