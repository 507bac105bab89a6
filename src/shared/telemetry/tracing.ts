/**
 * OpenTelemetry traces (docs/tracing.md): the configuration, read once in the
 * main thread from the flags and OpenTelemetry's own variables, and the
 * sampler and export each thread that makes spans starts from it (gateway
 * threads: a span per request; the inference thread: a span per batch; both
 * made as finished spans, span-record.ts). Spans leave each
 * thread through a batch span processor and an OTLP/HTTP exporter, so a
 * collector that is slow or down costs a request nothing: the processor's
 * queue is bounded, and every span it drops (queue full, export failed) is
 * counted in slabserve_trace_spans_dropped_total.
 *
 *   --otlp-endpoint URL           or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the traces URL as given),
 *                                 or OTEL_EXPORTER_OTLP_ENDPOINT (its base: /v1/traces appended).
 *                                 None set: tracing is off, and costs one test per request.
 *   --otlp-service-name NAME      or OTEL_SERVICE_NAME; default slabserve
 *   OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL   http/protobuf (default) or http/json
 *   OTEL_TRACES_SAMPLER(_ARG)     always_on, always_off, traceidratio, parentbased_always_on
 *                                 (default), parentbased_always_off, parentbased_traceidratio;
 *                                 the ratio in [0, 1] (default 1)
 *   OTEL_SDK_DISABLED=true        off, whatever else is set
 */
import { ExportResultCode, type ExportResult } from '@opentelemetry/core';
import { OTLPTraceExporter as JsonExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { OTLPExporterBase } from '@opentelemetry/otlp-exporter-base';
import { convertLegacyHttpOptions, createOtlpHttpExportDelegate } from '@opentelemetry/otlp-exporter-base/node-http';
import { ProtobufTraceSerializer, TraceExporterMetricsHelper } from '@opentelemetry/otlp-transformer';
import { resourceFromAttributes } from '@opentelemetry/resources';
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BatchSpanProcessor,
  ParentBasedSampler,
  TraceIdRatioBasedSampler,
  type ReadableSpan,
  type Sampler,
  type SpanExporter,
  type SpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import { serializeSpans } from './otlp-protobuf.js';
import type { SpanOrigin } from './span-record.js';

export const OTLP_PROTOCOLS = ['http/protobuf', 'http/json'] as const;
export const TRACE_SAMPLERS = ['always_on', 'always_off', 'traceidratio', 'parentbased_always_on', 'parentbased_always_off', 'parentbased_traceidratio'] as const;
export type TraceSampler = (typeof TRACE_SAMPLERS)[number];

/** What every thread's tracing is made from (plain data: it crosses to the threads in workerData). */
export interface TracingConfig {
  /** The OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces. */
  url: string;
  protocol: (typeof OTLP_PROTOCOLS)[number];
  serviceName: string;
  sampler: TraceSampler;
  /** traceidratio's ratio, in [0, 1]. */
  ratio: number;
}

/** The flags that say where traces go (the variables are read from `env`). */
export interface TracingOptions {
  otlpEndpoint?: string | undefined;
  otlpServiceName?: string | undefined;
}

/** How long a thread that ends waits for its last spans to be exported. */
const SHUTDOWN_GRACE_MS = 2000;

/** The processor's bounds: spans waiting for export, spans per export, ms between exports, ms an export may take. */
const QUEUE = { maxQueueSize: 2048, maxExportBatchSize: 512, scheduledDelayMillis: 1000, exportTimeoutMillis: 5000 } as const;

/** Tracing as the flags and the variables ask, or null (off); throws naming the variable or flag for a value it cannot use. */
export function resolveTracing(o: TracingOptions, env: NodeJS.ProcessEnv): TracingConfig | null {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === 'true') return null;
  const url = tracesUrl(o, env);
  if (url === null) return null;
  const protocol = (env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL ?? env.OTEL_EXPORTER_OTLP_PROTOCOL ?? 'http/protobuf').trim();
  if (!(OTLP_PROTOCOLS as readonly string[]).includes(protocol)) {
    throw new Error(`OTEL_EXPORTER_OTLP_PROTOCOL "${protocol}" is not served: ${OTLP_PROTOCOLS.join(' or ')} (a collector takes both on its OTLP/HTTP port, 4318)`);
  }
  const sampler = (env.OTEL_TRACES_SAMPLER ?? 'parentbased_always_on').trim().toLowerCase();
  if (!(TRACE_SAMPLERS as readonly string[]).includes(sampler)) throw new Error(`OTEL_TRACES_SAMPLER "${sampler}" is not one of ${TRACE_SAMPLERS.join(', ')}`);
  const arg = env.OTEL_TRACES_SAMPLER_ARG?.trim();
  const ratio = arg === undefined || arg === '' ? 1 : Number(arg);
  if (!(ratio >= 0 && ratio <= 1)) throw new Error(`OTEL_TRACES_SAMPLER_ARG "${arg}" must be a ratio from 0 to 1`);
  const serviceName = o.otlpServiceName ?? env.OTEL_SERVICE_NAME ?? 'slabserve';
  return { url, protocol: protocol as TracingConfig['protocol'], serviceName, sampler: sampler as TraceSampler, ratio };
}

/** The traces URL: the flag or OTEL_EXPORTER_OTLP_ENDPOINT as a base (/v1/traces appended), OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is. */
function tracesUrl(o: TracingOptions, env: NodeJS.ProcessEnv): string | null {
  const [given, what, base] =
    o.otlpEndpoint !== undefined ? [o.otlpEndpoint, '--otlp-endpoint', true]
    : env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ? [env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, 'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT', false]
    : env.OTEL_EXPORTER_OTLP_ENDPOINT ? [env.OTEL_EXPORTER_OTLP_ENDPOINT, 'OTEL_EXPORTER_OTLP_ENDPOINT', true]
    : [null, '', false];
  if (given === null || given.trim() === '') return null;
  let url: URL;
  try {
    url = new URL(given.trim());
  } catch {
    throw new Error(`${what} "${given}" is not a URL (e.g. http://localhost:4318)`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new Error(`${what} "${given}": OTLP/HTTP takes an http:// or https:// URL`);
  if (base && !url.pathname.endsWith('/v1/traces')) url.pathname = `${url.pathname.replace(/\/+$/, '')}/v1/traces`;
  return url.href;
}

/** One thread's sampler and export: its spans are SpanRecords (span-record.ts), made where the work was done. */
export interface ThreadTracing {
  /** Decides a request span, after its parent: the configured sampler. Batch spans are not sampled (made only for a batch carrying a sampled request). */
  sampler: Sampler;
  /** What every span of this thread shares (service.name, the scope). */
  origin: SpanOrigin;
  /** Queues a finished span for export; a span that finds the queue full is dropped, and counted. */
  export(span: ReadableSpan): void;
  /** Spans dropped so far: the queue full, or an export that failed. */
  dropped(): number;
  /** Exports what is queued, waiting at most SHUTDOWN_GRACE_MS (a dead collector must not hold a drain), then stops. */
  shutdown(): Promise<void>;
}

/** This thread's tracing, from the config the main thread resolved. */
export function startThreadTracing(config: TracingConfig, exporter: SpanExporter = exporterOf(config)): ThreadTracing {
  const counted = new DropCountingProcessor(exporter);
  const origin: SpanOrigin = { resource: resourceFromAttributes({ 'service.name': config.serviceName }), scope: { name: 'slabserve' } };
  return {
    sampler: samplerOf(config),
    origin,
    export: (span) => counted.onEnd(span),
    dropped: () => counted.dropped,
    shutdown: async () => {
      let timer: NodeJS.Timeout | undefined;
      const grace = new Promise<void>((resolve) => (timer = setTimeout(resolve, SHUTDOWN_GRACE_MS)));
      await Promise.race([counted.shutdown(), grace]).finally(() => clearTimeout(timer));
    },
  };
}

function exporterOf(c: TracingConfig): SpanExporter {
  const options = { url: c.url, timeoutMillis: QUEUE.exportTimeoutMillis };
  return c.protocol === 'http/json' ? new JsonExporter(options) : new ProtobufExporter(options);
}

/**
 * OTLP/HTTP in protobuf: the OpenTelemetry exporter's own parts (the HTTP
 * delegate: retries, the timeout, OTEL_EXPORTER_OTLP_HEADERS, compression),
 * as @opentelemetry/exporter-trace-otlp-proto assembles them, with the
 * serializer of otlp-protobuf.ts (why: there).
 */
class ProtobufExporter extends OTLPExporterBase<ReadableSpan[]> implements SpanExporter {
  constructor(options: { url: string; timeoutMillis: number }) {
    const http = convertLegacyHttpOptions(options, 'TRACES', 'v1/traces', { 'Content-Type': 'application/x-protobuf' });
    const serializer = { serializeRequest: serializeSpans, deserializeResponse: ProtobufTraceSerializer.deserializeResponse };
    super(createOtlpHttpExportDelegate(http, serializer, 'otlp_http_span_exporter', TraceExporterMetricsHelper, undefined));
  }
}

function samplerOf(c: TracingConfig): Sampler {
  const ratio = new TraceIdRatioBasedSampler(c.ratio);
  switch (c.sampler) {
    case 'always_on':
      return new AlwaysOnSampler();
    case 'always_off':
      return new AlwaysOffSampler();
    case 'traceidratio':
      return ratio;
    case 'parentbased_always_on':
      return new ParentBasedSampler({ root: new AlwaysOnSampler() });
    case 'parentbased_always_off':
      return new ParentBasedSampler({ root: new AlwaysOffSampler() });
    case 'parentbased_traceidratio':
      return new ParentBasedSampler({ root: ratio });
  }
}

/**
 * The SDK's BatchSpanProcessor, its drops counted: it drops a span when its
 * queue holds maxQueueSize spans not yet handed to the exporter (counted here
 * by the same rule: sampled spans ended, less those handed over), and an
 * export that fails loses its spans.
 */
class DropCountingProcessor implements SpanProcessor {
  dropped = 0;
  private waiting = 0;
  private readonly inner: BatchSpanProcessor;

  constructor(exporter: SpanExporter) {
    const counting: SpanExporter = {
      export: (spans, done) => {
        this.waiting -= spans.length;
        exporter.export(spans, (r: ExportResult) => {
          if (r.code !== ExportResultCode.SUCCESS) this.dropped += spans.length;
          done(r);
        });
      },
      shutdown: () => exporter.shutdown(),
      ...(exporter.forceFlush ? { forceFlush: () => exporter.forceFlush!() } : {}),
    };
    this.inner = new BatchSpanProcessor(counting, QUEUE);
  }

  onStart(): void {}

  onEnd(span: ReadableSpan): void {
    if ((span.spanContext().traceFlags & 1) === 0) return; // not sampled: the processor ignores it too
    if (this.waiting >= QUEUE.maxQueueSize) {
      this.dropped++;
      return;
    }
    this.waiting++;
    this.inner.onEnd(span);
  }

  forceFlush(): Promise<void> {
    return this.inner.forceFlush();
  }

  shutdown(): Promise<void> {
    return this.inner.shutdown();
  }
}
