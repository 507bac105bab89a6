/**
 * A span per batch, made on the inference thread when a batch that carried at
 * least one sampled request has run (docs/tracing.md): what the batch was
 * (model, bucket, rows, real and padded tokens, padding efficiency, device,
 * run time), a link to every sampled request span it carried, read from its
 * slots' trace context (shared/trace-context.ts), and its own ids written back
 * into those slots, so each request span links to the batch it rode in. A
 * batch of untraced requests costs one read per slot.
 */
import { SpanKind, type Link } from '@opentelemetry/api';
import type { Slab } from '../shared/slab.js';
import { newSpanId, newTraceId, sampledContext, SpanRecord } from '../shared/telemetry/span-record.js';
import { readRequestSpan, TRACE_I32, writeBatchSpan } from '../shared/trace-context.js';
import type { ThreadTracing } from '../shared/telemetry/tracing.js';
import type { BatchStats } from './runner.js';

/** What the loop knows of a batch that ran. */
export interface BatchRun {
  model: string;
  /** The bucket's padded length. */
  bucketLength: number;
  stats: BatchStats;
  /** Epoch ms: the batch was formed, its last run ended. */
  startedMs: number;
  finishedMs: number;
}

export type TraceBatch = (slab: Slab, slots: readonly number[], batch: BatchRun) => void;

/** LoopOptions.traceBatch over this thread's tracing, on `device` (cpu, cuda:0). */
export function batchTracing(tracing: ThreadTracing, device: string): TraceBatch {
  return function traceBatch(slab, slots, b) {
    let links: Link[] | null = null;
    let traced: number[] | null = null;
    for (const slot of slots) {
      const request = readRequestSpan(slab.traces, slot * TRACE_I32);
      if (!request) continue;
      (links ??= []).push({ context: sampledContext(request.traceId, request.spanId, undefined, true) });
      (traced ??= []).push(slot);
    }
    if (!links || !traced) return;
    const { rows, realTokens, paddedTokens, runMs } = b.stats;
    const ids = { traceId: newTraceId(), spanId: newSpanId() };
    const attributes = {
      'slabserve.model': b.model,
      'slabserve.batch.size': rows,
      'slabserve.batch.bucket': b.bucketLength,
      'slabserve.batch.tokens.real': realTokens,
      'slabserve.batch.tokens.padded': paddedTokens,
      'slabserve.batch.padding_efficiency': paddedTokens > 0 ? realTokens / paddedTokens : 1,
      'slabserve.batch.run_ms': runMs,
      'slabserve.device': device,
    };
    const context = sampledContext(ids.traceId, ids.spanId);
    tracing.export(new SpanRecord(tracing.origin, `batch ${b.model}`, SpanKind.INTERNAL, context, undefined, b.startedMs, b.finishedMs, attributes, links));
    for (const slot of traced) writeBatchSpan(slab.traces, slot * TRACE_I32, ids);
  };
}
