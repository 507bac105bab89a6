/**
 * OpenTelemetry traces (docs/tracing.md) against an OTLP/HTTP receiver in
 * this file (fixtures/otlp-receiver.ts: JSON, and protobuf read by its own
 * wire-format reader): a request span per request with the caller's trace id
 * and parent, its attributes and its tokenize and queue children; a batch
 * span per batch linking every sampled request it carried, and each request
 * linking back; the sampler; a collector that is down.
 */
import * as grpc from '@grpc/grpc-js';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type Server, type ServerConfig } from '../dist/src/main/server.js';
import { resolveTracing } from '../dist/src/shared/telemetry/tracing.js';
import { grpcJsPackages, unaryCall } from './fixtures/grpc-js-client.js';
import { parseMetrics } from './fixtures/http-client.js';
import { startOtlpReceiver, type OtlpReceiver, type ReceivedSpan } from './fixtures/otlp-receiver.js';
import { sentTogether } from './fixtures/queued-together.js';
import { eventually, makeRandom, randomTexts, testServerConfig, wsRequest } from './helpers.js';

process.env.SLABSERVE_TEST_HOOKS = '1';

const TEI_PROTO = fileURLToPath(new URL('../proto/tei.proto', import.meta.url));
const WORDS = ['where', 'is', 'my', 'parcel', 'refund', 'order', 'cancel', 'password', 'account', 'delivery', 'late', 'help', 'please', 'today'];

/** A server traced to `receiver` with these OpenTelemetry variables set while it starts (and cleared after). */
async function tracedServer(receiver: { url: string }, env: Record<string, string>, over: Partial<ServerConfig> = {}): Promise<Server> {
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  Object.assign(process.env, env);
  try {
    const s = await startServer(testServerConfig({ otlpEndpoint: receiver.url, otlpServiceName: 'slabserve-test', slotsPerModel: 64, ...over }));
    await s.ready;
    return s;
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

/** A sampled W3C traceparent with fresh ids. */
function parentIds() {
  const traceId = randomBytes(16).toString('hex');
  const spanId = randomBytes(8).toString('hex');
  return { traceId, spanId, traceparent: `00-${traceId}-${spanId}-01` };
}

async function embed(server: Server, text: string, headers: Record<string, string> = {}): Promise<number> {
  const r = await fetch(`${server.url}/embed`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ inputs: text }) });
  await r.arrayBuffer();
  return r.status;
}

const spansOf = (rx: OtlpReceiver, traceId: string) => rx.spans.filter((s) => s.traceId === traceId);
const batchesLinking = (rx: OtlpReceiver, span: ReceivedSpan) => rx.spans.filter((s) => s.name.startsWith('batch ') && s.links.some((l) => l.spanId === span.spanId));

describe('the tracing configuration (flags and OpenTelemetry variables)', () => {
  it('is off with nothing set, or OTEL_SDK_DISABLED; the flag wins over the variables; a base endpoint gets /v1/traces', () => {
    expect(resolveTracing({}, {})).toBeNull();
    expect(resolveTracing({ otlpEndpoint: 'http://c:4318' }, { OTEL_SDK_DISABLED: 'true' })).toBeNull();
    expect(resolveTracing({ otlpEndpoint: 'http://c:4318' }, {})).toEqual({ url: 'http://c:4318/v1/traces', protocol: 'http/protobuf', serviceName: 'slabserve', sampler: 'parentbased_always_on', ratio: 1 });
    expect(resolveTracing({}, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318/otlp/' })!.url).toBe('http://c:4318/otlp/v1/traces');
    expect(resolveTracing({}, { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://c:9/custom', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://d:4318' })!.url).toBe('http://c:9/custom');
    expect(resolveTracing({ otlpEndpoint: 'http://flag:4318' }, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://env:4318' })!.url).toBe('http://flag:4318/v1/traces');
    const env = { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json', OTEL_SERVICE_NAME: 'svc', OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.25' };
    expect(resolveTracing({}, env)).toMatchObject({ protocol: 'http/json', serviceName: 'svc', sampler: 'parentbased_traceidratio', ratio: 0.25 });
    expect(resolveTracing({ otlpServiceName: 'flagged' }, env)!.serviceName).toBe('flagged');
  });

  it('refuses, naming the variable or flag, what it cannot use', () => {
    const base = { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318' };
    expect(() => resolveTracing({}, { ...base, OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' })).toThrow(/OTEL_EXPORTER_OTLP_PROTOCOL "grpc" is not served: http\/protobuf or http\/json/);
    expect(() => resolveTracing({}, { ...base, OTEL_TRACES_SAMPLER: 'jaeger_remote' })).toThrow(/OTEL_TRACES_SAMPLER "jaeger_remote" is not one of/);
    expect(() => resolveTracing({}, { ...base, OTEL_TRACES_SAMPLER_ARG: '1.5' })).toThrow(/OTEL_TRACES_SAMPLER_ARG "1.5" must be a ratio from 0 to 1/);
    expect(() => resolveTracing({ otlpEndpoint: 'collector:4318' }, {})).toThrow(/--otlp-endpoint "collector:4318"/);
  });
});

describe('spans of requests and batches (http/json)', () => {
  let rx: OtlpReceiver;
  let server: Server;

  beforeAll(async () => {
    rx = await startOtlpReceiver();
    server = await tracedServer(rx, { OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json' });
  }, 60_000);

  afterAll(async () => {
    await server?.close();
    await rx?.close();
  });

  it('a request with a traceparent: its span in that trace under that parent, with its attributes, tokenize and queue children, and a batch span linking it both ways', async () => {
    const p = parentIds();
    expect(await embed(server, 'where is my parcel', { traceparent: p.traceparent, 'x-request-id': 'trace-test-1' })).toBe(200);
    const spans = await eventually('the spans exported', async () => spansOf(rx, p.traceId), (s) => s.length >= 3);
    const request = spans.find((s) => s.kind === 2)!; // SERVER
    expect(request).toMatchObject({ name: 'POST /embed', parentSpanId: p.spanId, serviceName: 'slabserve-test' });
    expect(request.attributes).toMatchObject({ 'slabserve.model': 'tiny-embed', 'slabserve.inputs': 1, 'slabserve.tokens': 6, 'http.response.status_code': 200, 'slabserve.request_id': 'trace-test-1', 'slabserve.transport': 'http', 'http.route': '/embed' });
    const children = spans.filter((s) => s.parentSpanId === request.spanId).map((s) => s.name).sort();
    expect(children).toEqual(['queue', 'tokenize']);
    for (const c of spans.filter((s) => s.parentSpanId === request.spanId)) {
      expect(c.startNs >= request.startNs && c.endNs <= request.endNs, `${c.name} inside the request span`).toBe(true);
    }
    const [batch] = await eventually('its batch span', async () => batchesLinking(rx, request), (b) => b.length === 1);
    expect(batch!.attributes).toMatchObject({ 'slabserve.model': 'tiny-embed', 'slabserve.batch.size': 1, 'slabserve.device': 'cpu' });
    expect(batch!.attributes['slabserve.batch.tokens.real']).toBe(6);
    expect(request.links).toEqual([{ traceId: batch!.traceId, spanId: batch!.spanId }]);
  });

  it('16 requests queued together: one batch span of 16 linking all 16 request spans, each linking it', async () => {
    // At most 3 words of a token or two: every text in the first bucket (8 tokens), so one batch takes them all.
    const texts = randomTexts(makeRandom('tracing batch'), WORDS, 16, 3);
    const parents = texts.map(() => parentIds());
    const statuses = await sentTogether(server.testHooks, { 'tiny-embed': 16 }, () => Promise.all(texts.map((t, i) => embed(server, t, { traceparent: parents[i]!.traceparent }))));
    expect(statuses).toEqual(Array(16).fill(200));
    const requests = await eventually('16 request spans', async () => parents.map((p) => spansOf(rx, p.traceId).find((s) => s.kind === 2)), (r) => r.every(Boolean));
    const batches = await eventually('their batch span', async () => [...new Set(requests.flatMap((r) => batchesLinking(rx, r!)))], (b) => b.length >= 1);
    expect(batches).toHaveLength(1);
    const batch = batches[0]!;
    expect(batch.attributes['slabserve.batch.size']).toBe(16);
    expect(new Set(batch.links.map((l) => l.spanId))).toEqual(new Set(requests.map((r) => r!.spanId)));
    for (const r of requests) expect(r!.links).toEqual([{ traceId: batch.traceId, spanId: batch.spanId }]);
    expect(batch.attributes['slabserve.batch.padding_efficiency']).toBeCloseTo(Number(batch.attributes['slabserve.batch.tokens.real']) / Number(batch.attributes['slabserve.batch.tokens.padded']), 6);
  });

  it('a WebSocket frame\'s traceparent and gRPC traceparent metadata parent their requests\' spans', async () => {
    const ws = parentIds();
    const frame = await wsRequest(server.port, { id: 't', op: 'embed', inputs: ['hello there'], traceparent: ws.traceparent });
    expect(frame.error).toBeUndefined();
    const g = parentIds();
    const client = new (grpcJsPackages(TEI_PROTO).tei.v1.Embed)(`127.0.0.1:${server.grpcPort}`, grpc.credentials.createInsecure());
    try {
      const md = new grpc.Metadata();
      md.set('traceparent', g.traceparent);
      await unaryCall(client, 'Embed', { inputs: 'hello there' }, md);
    } finally {
      client.close();
    }
    const [wsSpan] = await eventually('the WebSocket span', async () => spansOf(rx, ws.traceId).filter((s) => s.kind === 2), (s) => s.length === 1);
    expect(wsSpan).toMatchObject({ name: 'WS embed', parentSpanId: ws.spanId });
    expect(wsSpan!.attributes['slabserve.transport']).toBe('websocket');
    const [grpcSpan] = await eventually('the gRPC span', async () => spansOf(rx, g.traceId).filter((s) => s.kind === 2), (s) => s.length === 1);
    expect(grpcSpan).toMatchObject({ name: 'GRPC /tei.v1.Embed/Embed', parentSpanId: g.spanId });
    expect(await eventually('both batch-linked', async () => [batchesLinking(rx, wsSpan!).length, batchesLinking(rx, grpcSpan!).length], (n) => n.every((x) => x === 1))).toEqual([1, 1]);
  });

  it('without a traceparent (parentbased_always_on): every request a trace of its own, a root span', async () => {
    const before = new Set(rx.spans.map((s) => s.traceId));
    const text = `a request with no parent ${randomBytes(4).toString('hex')}`;
    expect(await embed(server, text)).toBe(200);
    const roots = await eventually('its root span', async () => rx.spans.filter((s) => s.kind === 2 && !before.has(s.traceId)), (r) => r.length >= 1);
    expect(roots).toHaveLength(1);
    expect(roots[0]!.parentSpanId).toBe('');
  });

  it('a failed request ends its span with its status and code, and no batch', async () => {
    const p = parentIds();
    const r = await fetch(`${server.url}/embed`, { method: 'POST', headers: { 'content-type': 'application/json', traceparent: p.traceparent }, body: '{"inputs": []}' });
    expect(r.status).toBe(422);
    const [span] = await eventually('the failed request span', async () => spansOf(rx, p.traceId), (s) => s.length >= 1);
    expect(span!.attributes).toMatchObject({ 'http.response.status_code': 422, 'slabserve.error.code': 'SLABSERVE_INVALID_INPUT' });
    expect(span!.links).toEqual([]);
  });
});

describe('the sampler, protobuf, and a collector that is down', () => {
  it('parentbased_traceidratio 0: a request without a parent exports nothing, one with a sampled parent is traced (over http/protobuf)', async () => {
    const rx = await startOtlpReceiver();
    const server = await tracedServer(rx, { OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '0' });
    try {
      for (let i = 0; i < 20; i++) expect(await embed(server, `unsampled request ${i}`)).toBe(200);
      const p = parentIds();
      expect(await embed(server, 'sampled by its parent', { traceparent: p.traceparent })).toBe(200);
      const spans = await eventually('the sampled request\'s spans', async () => spansOf(rx, p.traceId), (s) => s.length >= 3);
      expect(spans.find((s) => s.kind === 2)).toMatchObject({ name: 'POST /embed', parentSpanId: p.spanId, serviceName: 'slabserve-test' });
      await eventually('its batch', async () => rx.spans.filter((s) => s.name.startsWith('batch ')), (b) => b.length >= 1);
      // Nothing else: every span exported is the sampled request's or its batch's.
      expect(rx.spans.every((s) => s.traceId === p.traceId || s.links.some((l) => l.traceId === p.traceId))).toBe(true);
      expect([...rx.bodies.keys()]).toEqual(['application/x-protobuf']);
    } finally {
      await server.close();
      await rx.close();
    }
  });

  it('parentbased_traceidratio 1: every request without a parent traced, each a trace of its own; an unsampled parent still followed', async () => {
    const rx = await startOtlpReceiver();
    const server = await tracedServer(rx, { OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '1' });
    try {
      const unsampled = parentIds();
      expect(await embed(server, 'an unsampled parent', { traceparent: unsampled.traceparent.replace(/01$/, '00') })).toBe(200);
      const n = 12;
      for (let i = 0; i < n; i++) expect(await embed(server, `request ${i} with no parent ${randomBytes(3).toString('hex')}`)).toBe(200);
      const roots = await eventually('a root span per request', async () => rx.spans.filter((s) => s.kind === 2), (r) => r.length >= n);
      expect(new Set(roots.map((r) => r.traceId)).size).toBe(n);
      expect(roots.every((r) => r.parentSpanId === '' && r.name === 'POST /embed')).toBe(true);
      // Each with its tokenize and queue children in its own trace.
      for (const r of roots) await eventually('its children', async () => spansOf(rx, r.traceId), (t) => t.length >= 3);
      expect(spansOf(rx, unsampled.traceId)).toEqual([]);
    } finally {
      await server.close();
      await rx.close();
    }
  });

  it('a collector that is down: requests answered as ever, the spans counted dropped', async () => {
    const rx = await startOtlpReceiver();
    const dead = { url: rx.url };
    await rx.close(); // nothing listens there now
    const server = await tracedServer(dead, {});
    try {
      const statuses = await Promise.all(Array.from({ length: 20 }, (_, i) => embed(server, `request ${i} to a dead collector`)));
      expect(statuses).toEqual(Array(20).fill(200));
      const dropped = await eventually(
        'the drops counted',
        async () => parseMetrics(await (await fetch(`${server.url}/metrics`)).text()).sum('slabserve_trace_spans_dropped_total'),
        (n) => n >= 20,
        30_000,
      );
      console.log(`dead collector: ${dropped} spans dropped`);
    } finally {
      await server.close();
    }
  });
});
