/**
 * What every route has, on the Cohere, Jina and vLLM routes: the API key (refused in the route's
 * own error shape), the deadline and priority headers, the result cache (a repeated request
 * answered from it: x-cache hit, the same answer) and a traced request's span (OTLP, to the test's
 * receiver) under its caller's traceparent. On one real server (port 0, CPU).
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type Server } from '../dist/src/main/server.js';
import { startOtlpReceiver, type OtlpReceiver } from './fixtures/otlp-receiver.js';
import { eventually, testServerConfig } from './helpers.js';

const KEY = 'rag-key';

let server: Server;
let rx: OtlpReceiver;

beforeAll(async () => {
  rx = await startOtlpReceiver();
  server = await startServer(
    testServerConfig({ models: ['tiny-embed', 'tiny-rerank', 'tiny-intent'], apiKeys: [KEY], cacheMb: 8, otlpEndpoint: rx.url, batching: { buckets: [8, 16, 32, 64, 128] } }),
  );
  await server.ready;
}, 120_000);

afterAll(async () => {
  await server?.close();
  await rx?.close();
});

/** Each new route, a body it answers, the error shape's check, and what in the answer is the same on a repeat (ids and times differ). */
const ROUTES: { path: string; body: Record<string, unknown>; shape: (b: any) => void; same: (b: any) => unknown }[] = [
  { path: '/v2/rerank', body: { model: 'tiny-rerank', query: 'where is my parcel', documents: ['it is late', 'refund please'] }, shape: cohere, same: (b) => b.results },
  { path: '/v1/rerank', body: { model: 'tiny-rerank', query: 'where is my parcel', documents: ['it is late', 'refund please'] }, shape: cohere, same: (b) => b.results },
  { path: '/v2/embed', body: { model: 'tiny-embed', texts: ['where is my parcel'], input_type: 'search_query', embedding_types: ['float', 'int8'] }, shape: cohere, same: (b) => b.embeddings },
  { path: '/score', body: { model: 'tiny-rerank', text_1: 'where is my parcel', text_2: ['it is late', 'refund please'] }, shape: vllm, same: (b) => b.data },
  { path: '/v1/score', body: { model: 'tiny-embed', queries: 'where is my parcel', documents: ['it is late'] }, shape: vllm, same: (b) => b.data },
  { path: '/classify', body: { model: 'tiny-intent', input: ['where is my parcel', 'cancel my plan'] }, shape: vllm, same: (b) => b.data },
  { path: '/v1/classify', body: { model: 'tiny-intent', input: 'refund please' }, shape: vllm, same: (b) => b.data },
];

function cohere(b: any): void {
  expect(b).toMatchObject({ id: expect.any(String), message: expect.any(String), code: expect.stringMatching(/^SLABSERVE_/) });
}
function vllm(b: any): void {
  expect(b).toEqual({ error: { message: expect.any(String), type: expect.any(String), param: expect.toSatisfy((p: unknown) => p === null || typeof p === 'string'), code: expect.any(Number) } });
}

async function post(path: string, body: unknown, headers: Record<string, string>): Promise<{ status: number; body: any; headers: Headers }> {
  const r = await fetch(server.url + path, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  return { status: r.status, body: JSON.parse(await r.text()), headers: r.headers };
}

describe('the Cohere, Jina and vLLM routes have what every route has', () => {
  it("the API key: none or a wrong one is a 401 in the route's own shape", async () => {
    for (const { path, body, shape } of ROUTES) {
      for (const headers of [{}, { authorization: 'Bearer wrong' }]) {
        const r = await post(path, body, headers);
        expect(r.status, path).toBe(401);
        expect(r.headers.get('www-authenticate'), path).toMatch(/^Bearer/);
        shape(r.body);
      }
    }
  });

  it("a bad x-deadline-ms or x-priority is a 400 in the route's shape; good ones are taken", async () => {
    for (const { path, body, shape } of ROUTES) {
      for (const headers of [{ 'x-deadline-ms': 'soon' }, { 'x-deadline-ms': '-5' }, { 'x-priority': 'urgent' }]) {
        const r = await post(path, body, { authorization: `Bearer ${KEY}`, ...headers });
        expect(r.status, `${path} ${JSON.stringify(headers)}`).toBe(400);
        shape(r.body);
      }
      const ok = await post(path, body, { authorization: `Bearer ${KEY}`, 'x-deadline-ms': '10000', 'x-priority': 'bulk' });
      expect(ok.status, path).toBe(200);
    }
  });

  it('the result cache: a repeated request is answered from it (x-cache: hit) with the same answer', async () => {
    for (const { path, body, same } of ROUTES) {
      // A body of its own (a word no other test sends), so the first is a miss.
      const fresh = JSON.parse(JSON.stringify(body).replace('where is my parcel', `where is my parcel ${path.replace(/\W/g, '')}`).replace('refund please', `refund please ${path.length}`));
      const first = await post(path, fresh, { authorization: `Bearer ${KEY}` });
      expect(first.status, path).toBe(200);
      expect(first.headers.get('x-cache'), path).toBe('miss');
      const again = await post(path, fresh, { authorization: `Bearer ${KEY}` });
      expect(again.headers.get('x-cache'), path).toBe('hit');
      expect(same(again.body), path).toEqual(same(first.body));
    }
  });

  it("a request with a traceparent: its span, named for the route, in the caller's trace", async () => {
    for (const { path, body } of ROUTES) {
      const traceId = randomBytes(16).toString('hex');
      const spanId = randomBytes(8).toString('hex');
      const r = await post(path, body, { authorization: `Bearer ${KEY}`, traceparent: `00-${traceId}-${spanId}-01` });
      expect(r.status, path).toBe(200);
      const [span] = await eventually(`${path}'s span`, async () => rx.spans.filter((s) => s.traceId === traceId && s.kind === 2), (s) => s.length === 1);
      expect(span, path).toMatchObject({ name: `POST ${path}`, parentSpanId: spanId });
      expect(span!.attributes, path).toMatchObject({ 'http.route': path, 'http.response.status_code': 200, 'slabserve.model': body.model });
    }
  });
});
