/**
 * A sampled request's tracing alone, in one thread, with nothing else to
 * disturb it (the suite's tracing case runs it before its servers; it has no command of its own): the
 * gateway's span made from a traceparent, its ids written into a slot, the
 * inference thread's batch span (a batch of 16) reading them and writing its
 * own back, the request's span and its two children made as it ends, and all
 * of it serialized as the OTLP exporter would send it (the HTTP send left
 * out). The modules are the server's own; CPU is the process's, GC included.
 */
import type { InferResult } from '../../src/core/infer.js';
import { RequestTracing } from '../../src/gateway/request-trace.js';
import { batchTracing } from '../../src/gpu-worker/batch-trace.js';
import { serializeSpans } from '../../src/shared/telemetry/otlp-protobuf.js';
import type { Slab } from '../../src/shared/slab.js';
import { readBatchSpan, TRACE_I32, writeRequestSpan } from '../../src/shared/trace-context.js';
import { startThreadTracing, type TracingConfig } from '../../src/shared/telemetry/tracing.js';

export interface TracedPathCost {
  /** Process CPU per sampled request, µs. */
  cpuUs: number;
  spansPerRequest: number;
  bytesPerRequest: number;
}

const BATCH = 16;

/** Spans to the request body the OTLP/HTTP exporter sends. */
export type SpanSerializer = (spans: Parameters<typeof serializeSpans>[0]) => Uint8Array;

export async function measureTracedPath(requests: number, serialize: SpanSerializer = serializeSpans): Promise<TracedPathCost> {
  let bytes = 0;
  let spans = 0;
  const exporter = {
    export: (s: Parameters<typeof serializeSpans>[0], done: (r: { code: number }) => void) => {
      bytes += serialize(s).length;
      spans += s.length;
      done({ code: 0 });
    },
    shutdown: async () => {},
  };
  const config: TracingConfig = { url: 'http://127.0.0.1:1/v1/traces', protocol: 'http/protobuf', serviceName: 'bench', sampler: 'parentbased_always_on', ratio: 1 };
  const gateway = startThreadTracing(config, exporter);
  const inference = startThreadTracing(config, exporter);
  const requestTracing = new RequestTracing(gateway);
  const traceBatch = batchTracing(inference, 'cpu');
  const slab = { traces: new Int32Array(BATCH * TRACE_I32) } as unknown as Slab;
  const slots = Array.from({ length: BATCH }, (_, i) => i);
  const parents = Array.from({ length: 4096 }, () => `00-${hexDigits(32)}-${hexDigits(16)}-01`);
  let next = 0;

  const batch = () => {
    const now = performance.timeOrigin + performance.now();
    const open = slots.map((slot) => {
      const span = requestTracing.start({ name: 'POST /embed', transport: 'http', startedAt: now, carrier: { traceparent: parents[next++ & 4095] }, route: '/embed' })!;
      writeRequestSpan(slab.traces, slot * TRACE_I32, span.ids);
      return span;
    });
    traceBatch(slab, slots, { model: 'tiny-embed', bucketLength: 16, stats: { rows: BATCH, realTokens: 112, paddedTokens: 128, runMs: 1.5 } as never, startedMs: now + 0.2, finishedMs: now + 2 });
    for (const slot of slots) {
      const ran = readBatchSpan(slab.traces, slot * TRACE_I32)!;
      const trace = { enqueuedAt: now + 0.1, startedAt: now + 0.2, finishedAt: now + 2, batches: [ran] };
      const result = { rows: { rows: new Float32Array(32), width: 32, queueMs: 0.1, inferenceMs: 1.5, trace }, tokens: 7, tokenizeMs: 0.05 } as unknown as InferResult;
      open[slot]!.end({ status: 200, model: 'tiny-embed', result });
    }
  };
  // The processor exports from a timer as well as when 512 spans wait: let its timers run between batches
  const run = async (count: number) => {
    for (let i = 0; i < count; i += BATCH * 4) {
      for (let b = 0; b < 4; b++) batch();
      await new Promise((r) => setTimeout(r, 0));
    }
  };
  await run(8000); // warm
  bytes = 0;
  spans = 0;
  const cpu0 = process.cpuUsage();
  await run(requests);
  await Promise.all([gateway.shutdown(), inference.shutdown()]);
  const cpu = process.cpuUsage(cpu0);
  return { cpuUs: (cpu.user + cpu.system) / requests, spansPerRequest: spans / requests, bytesPerRequest: bytes / requests };
}

function hexDigits(n: number): string {
  let s = '';
  for (let i = 0; i < n; i++) s += Math.floor(Math.random() * 16).toString(16);
  return s;
}
