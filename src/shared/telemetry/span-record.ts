/**
 * A finished span, made in one step where its work was done (a request when
 * it is answered, a batch when it has run) and handed straight to the
 * thread's span processor (tracing.ts). It is the SDK's ReadableSpan, so the
 * batch span processor and the OTLP exporters take it as they take their own.
 *
 * Why not the SDK's Tracer and Span: every time and attribute of our spans is
 * known when they end, and the Tracer's work per span (a context, clock
 * anchoring, attribute limits, a live Span with its methods) would be most of
 * what a traced request costs, and is mostly left out here (docs/tracing.md
 * has the figures, bench/suite/tracing.ts measures them).
 */
import { SpanStatusCode, TraceFlags, type Attributes, type HrTime, type Link, type SpanContext, type SpanKind, type SpanStatus } from '@opentelemetry/api';
import { millisToHrTime, type InstrumentationScope } from '@opentelemetry/core';
import type { Resource } from '@opentelemetry/resources';
import { RandomIdGenerator, type ReadableSpan, type TimedEvent } from '@opentelemetry/sdk-trace-base';

const ids = new RandomIdGenerator();
/** 32 hex digits, never all zero (the SDK's generator: Math.random into a shared buffer). */
export const newTraceId: () => string = ids.generateTraceId;
/** 16 hex digits, never all zero. */
export const newSpanId: () => string = ids.generateSpanId;

/** What every span a thread makes shares: its resource (service.name) and instrumentation scope. */
export interface SpanOrigin {
  resource: Resource;
  scope: InstrumentationScope;
}

/**
 * A span context, always of one shape (the serializer reads thousands a
 * second, and a property read that meets many shapes is slower): sampled,
 * `traceState` the parent's if it had one.
 */
export function sampledContext(traceId: string, spanId: string, traceState?: SpanContext['traceState'], isRemote = false): SpanContext {
  return { traceId, spanId, traceFlags: TraceFlags.SAMPLED, isRemote, traceState };
}

const UNSET: SpanStatus = { code: SpanStatusCode.UNSET };
const NO_ATTRIBUTES: Attributes = Object.freeze({});
const NO_LINKS: Link[] = [];
const NO_EVENTS: TimedEvent[] = [];

export class SpanRecord implements ReadableSpan {
  readonly resource: Resource;
  readonly instrumentationScope: InstrumentationScope;
  readonly events = NO_EVENTS;
  readonly ended = true;
  readonly droppedAttributesCount = 0;
  readonly droppedEventsCount = 0;
  readonly droppedLinksCount = 0;
  /** Epoch ms, never before the start. */
  readonly endMs: number;
  private readonly context: SpanContext;

  constructor(
    origin: SpanOrigin,
    readonly name: string,
    readonly kind: SpanKind,
    context: SpanContext,
    readonly parentSpanContext: SpanContext | undefined,
    /** Epoch ms. */
    readonly startMs: number,
    endMs: number,
    readonly attributes: Attributes = NO_ATTRIBUTES,
    readonly links: Link[] = NO_LINKS,
    readonly status: SpanStatus = UNSET,
  ) {
    this.resource = origin.resource;
    this.instrumentationScope = origin.scope;
    this.context = context;
    this.endMs = Math.max(startMs, endMs);
  }

  spanContext(): SpanContext {
    return this.context;
  }

  // The times as HrTimes, made when asked: the protobuf serializer reads the ms
  get startTime(): HrTime {
    return millisToHrTime(this.startMs);
  }

  get endTime(): HrTime {
    return millisToHrTime(this.endMs);
  }

  get duration(): HrTime {
    return millisToHrTime(Math.max(0, this.endMs - this.startMs));
  }
}
