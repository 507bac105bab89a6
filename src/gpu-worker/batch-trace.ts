/**
 * A span per batch, made on the inference thread when a batch that carried at
 * least one sampled request has run (docs/tracing.md): what the batch was
 * (model, bucket, rows, real and padded tokens, padding efficiency, device,
 * run time), a link to every sampled request span it carried, read from its
 * slots' trace context (shared/trace-context.ts), and its own ids written back
 * into those slots, so each request span links to the batch it rode in. A
 * batch of untraced requests costs one read per slot.
 */
import { SpanKind, TraceFlags, type Link } from '@opentelemetry/api';
import type { Slab } from '../shared/slab.js';
import { readRequestSpan, TRACE_I32, writeBatchSpan } from '../shared/trace-context.js';
import type { ThreadTracing } from '../shared/tracing.js';
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
  return (slab, slots, b) => {
    let links: Link[] | null = null;
    let traced: number[] | null = null;
    for (const slot of slots) {
      const request = readRequestSpan(slab.traces, slot * TRACE_I32);
      if (!request) continue;
      (links ??= []).push({ context: { ...request, traceFlags: TraceFlags.SAMPLED, isRemote: true } });
      (traced ??= []).push(slot);
    }
    if (!links || !traced) return;
    const { rows, realTokens, paddedTokens, runMs } = b.stats;
    const span = tracing.batchTracer.startSpan(`batch ${b.model}`, {
      kind: SpanKind.INTERNAL,
      startTime: b.startedMs,
      links,
      attributes: {
        'slabserve.model': b.model,
        'slabserve.batch.size': rows,
        'slabserve.batch.bucket': b.bucketLength,
        'slabserve.batch.tokens.real': realTokens,
        'slabserve.batch.tokens.padded': paddedTokens,
        'slabserve.batch.padding_efficiency': paddedTokens > 0 ? realTokens / paddedTokens : 1,
        'slabserve.batch.run_ms': runMs,
        'slabserve.device': device,
      },
    });
    span.end(b.finishedMs);
    const ids = span.spanContext();
    for (const slot of traced) writeBatchSpan(slab.traces, slot * TRACE_I32, ids);
  };
}
