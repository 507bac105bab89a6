/**
 * A server span per request (docs/tracing.md), made on the gateway thread
 * that serves it, over every transport: its parent from the caller's W3C
 * `traceparent` / `tracestate` (HTTP headers, a WebSocket frame's fields, gRPC
 * metadata), the configured sampler deciding the rest. A sampled request's ids
 * ride in its slots (shared/trace-context.ts), so the span of each batch it
 * rode in links to it, and it links back to them. Its children, from the
 * times its slots recorded: `tokenize` and `queue`. All three are made when it
 * ends, as SpanRecords (shared/telemetry/span-record.ts: why not the SDK's Tracer).
 *
 * An unsampled request costs the sampler's decision and nothing else; with
 * tracing off there is no RequestTracing at all.
 */
import { isSpanContextValid, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, type Attributes, type Link, type SpanContext } from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { SamplingDecision } from '@opentelemetry/sdk-trace-base';
import type { InferResult } from '../core/infer.js';
import { nowMs } from '../shared/clock.js';
import { newSpanId, newTraceId, sampledContext, SpanRecord } from '../shared/telemetry/span-record.js';
import type { SpanIds } from '../shared/trace-context.js';
import type { ThreadTracing } from '../shared/telemetry/tracing.js';

/** W3C trace context as the caller sent it ('' or absent: none). */
export interface TraceCarrier {
  traceparent?: string | undefined;
  tracestate?: string | undefined;
}

const w3c = new W3CTraceContextPropagator();
const carrierGetter = {
  get: (c: TraceCarrier, key: string) => (key === 'traceparent' ? c.traceparent : key === 'tracestate' ? c.tracestate : undefined) || undefined,
  keys: () => ['traceparent', 'tracestate'],
};

/** What a request span starts with. */
export interface RequestStart {
  /** The span's name: `POST /embed`, `WS embed`, `GRPC /tei.v1.Embed/Embed`. */
  name: string;
  transport: 'http' | 'websocket' | 'grpc';
  /** Epoch ms it arrived. */
  startedAt: number;
  carrier: TraceCarrier;
  requestId?: string | undefined;
  /** The route label (http.route), or the op or method. */
  route: string;
}

/** How a request ended. */
export interface RequestEnd {
  /** The status answered (HTTP's; WebSocket and gRPC: 200 or the HTTP status of the error). */
  status: number;
  /** The SLABSERVE_ code of an error. */
  errorCode?: string | undefined;
  model: string;
  result?: InferResult | undefined;
}

export class RequestTracing {
  private readonly tracing: ThreadTracing;

  constructor(tracing: ThreadTracing) {
    this.tracing = tracing;
  }

  /** The request's span, or null where the sampler says no. */
  start(s: RequestStart): RequestSpan | null {
    const context = s.carrier.traceparent ? w3c.extract(ROOT_CONTEXT, s.carrier, carrierGetter) : ROOT_CONTEXT;
    const given = trace.getSpanContext(context);
    const parent = given && isSpanContextValid(given) ? sampledContext(given.traceId, given.spanId, given.traceState, true) : undefined;
    const traceId = parent?.traceId ?? newTraceId();
    const attributes: Attributes = { 'slabserve.transport': s.transport, 'http.route': s.route };
    if (s.requestId) attributes['slabserve.request_id'] = s.requestId;
    const sampled = this.tracing.sampler.shouldSample(context, traceId, s.name, SpanKind.SERVER, attributes, []);
    if (sampled.decision !== SamplingDecision.RECORD_AND_SAMPLED) return null;
    const own = sampledContext(traceId, newSpanId(), sampled.traceState ?? parent?.traceState);
    return new RequestSpan(this.tracing, s, own, parent, attributes);
  }
}

export class RequestSpan {
  /** What its slots carry (InferCall.trace). */
  readonly ids: SpanIds;
  private readonly tracing: ThreadTracing;
  private readonly name: string;
  private readonly startMs: number;
  private readonly context: SpanContext;
  private readonly parent: SpanContext | undefined;
  private readonly attributes: Attributes;

  constructor(tracing: ThreadTracing, s: RequestStart, context: SpanContext, parent: SpanContext | undefined, attributes: Attributes) {
    this.tracing = tracing;
    this.name = s.name;
    this.startMs = s.startedAt;
    this.context = context;
    this.parent = parent;
    this.attributes = attributes;
    this.ids = { traceId: context.traceId, spanId: context.spanId };
  }

  /** Exports its span, and its children when it was queued. */
  end(e: RequestEnd): void {
    const a = this.attributes;
    a['slabserve.model'] = e.model;
    a['http.response.status_code'] = e.status;
    if (e.errorCode) a['slabserve.error.code'] = e.errorCode;
    const r = e.result;
    if (r) {
      a['slabserve.inputs'] = r.rows.rows.length / r.rows.width;
      a['slabserve.tokens'] = r.tokens;
      if (r.cache) a['slabserve.cache'] = r.cache;
    }
    const t = r?.rows.trace;
    const links: Link[] = t ? t.batches.map((b) => ({ context: sampledContext(b.traceId, b.spanId) })) : [];
    const status = e.status >= 500 ? { code: SpanStatusCode.ERROR, message: e.errorCode } : undefined;
    const { origin } = this.tracing;
    this.tracing.export(new SpanRecord(origin, this.name, SpanKind.SERVER, this.context, this.parent, this.startMs, nowMs(), a, links, status));
    // `tokenize` ends as its first input was queued, `queue` as its first batch started; a cache hit never queued
    if (!t || !Number.isFinite(t.enqueuedAt) || !r) return;
    const child = (name: string, from: number, to: number) =>
      this.tracing.export(new SpanRecord(origin, name, SpanKind.INTERNAL, sampledContext(this.ids.traceId, newSpanId(), this.context.traceState), this.context, from, to));
    child('tokenize', t.enqueuedAt - r.tokenizeMs, t.enqueuedAt);
    child('queue', t.enqueuedAt, t.startedAt);
  }
}
