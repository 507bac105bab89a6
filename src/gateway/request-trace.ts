/**
 * A server span per request (docs/tracing.md), made on the gateway thread
 * that serves it, over every transport: its parent from the caller's W3C
 * `traceparent` / `tracestate` (HTTP headers, a WebSocket frame's fields, gRPC
 * metadata), the configured sampler deciding the rest. A sampled request's ids
 * ride in its slots (shared/trace-context.ts), so the span of each batch it
 * rode in links to it, and it links back to them. Its children, made when it
 * ends from the times its slots recorded: `tokenize` and `queue`.
 *
 * An unsampled request makes a non-recording span and nothing else; with
 * tracing off there is no RequestTracing at all.
 */
import { ROOT_CONTEXT, SpanKind, SpanStatusCode, TraceFlags, trace, type Attributes, type Span, type Tracer } from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import type { InferResult } from '../core/infer.js';
import type { SpanIds } from '../shared/trace-context.js';
import type { ThreadTracing } from '../shared/tracing.js';

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
  private readonly tracer: Tracer;

  constructor(tracing: ThreadTracing) {
    this.tracer = tracing.tracer;
  }

  /** The request's span, or null where the sampler says no. */
  start(s: RequestStart): RequestSpan | null {
    const parent = s.carrier.traceparent ? w3c.extract(ROOT_CONTEXT, s.carrier, carrierGetter) : ROOT_CONTEXT;
    const attributes: Attributes = { 'slabserve.transport': s.transport, 'http.route': s.route };
    if (s.requestId) attributes['slabserve.request_id'] = s.requestId;
    const span = this.tracer.startSpan(s.name, { kind: SpanKind.SERVER, startTime: s.startedAt, attributes }, parent);
    return span.isRecording() ? new RequestSpan(this.tracer, span) : null;
  }
}

export class RequestSpan {
  /** What its slots carry (InferCall.trace). */
  readonly ids: SpanIds;
  private readonly tracer: Tracer;
  private readonly span: Span;

  constructor(tracer: Tracer, span: Span) {
    this.tracer = tracer;
    this.span = span;
    const c = span.spanContext();
    this.ids = { traceId: c.traceId, spanId: c.spanId };
  }

  end(e: RequestEnd): void {
    const span = this.span;
    span.setAttribute('slabserve.model', e.model);
    span.setAttribute('http.response.status_code', e.status);
    if (e.errorCode) span.setAttribute('slabserve.error.code', e.errorCode);
    if (e.status >= 500) span.setStatus({ code: SpanStatusCode.ERROR, message: e.errorCode });
    const r = e.result;
    if (r) {
      span.setAttribute('slabserve.inputs', r.rows.rows.length / r.rows.width);
      span.setAttribute('slabserve.tokens', r.tokens);
      if (r.cache) span.setAttribute('slabserve.cache', r.cache);
      this.children(r);
    }
    span.end();
  }

  /** `tokenize` (ending as its first input was queued) and `queue` (until its first batch started); links to its batches. */
  private children(r: InferResult): void {
    const t = r.rows.trace;
    if (!t || !Number.isFinite(t.enqueuedAt)) return; // answered from the cache: it never queued
    const inside = trace.setSpan(ROOT_CONTEXT, this.span);
    const child = (name: string, from: number, to: number) => this.tracer.startSpan(name, { kind: SpanKind.INTERNAL, startTime: from }, inside).end(to);
    child('tokenize', t.enqueuedAt - r.tokenizeMs, t.enqueuedAt);
    child('queue', t.enqueuedAt, t.startedAt);
    for (const b of t.batches) this.span.addLink({ context: { ...b, traceFlags: TraceFlags.SAMPLED, isRemote: false } });
  }
}
