/**
 * A slot's trace context in shared memory (slab.ts `traces`): the request
 * span a gateway made for the request that owns the slot, so the inference
 * thread can link the batch span to it; and the batch span the slot ran in,
 * written back by the inference thread before the slot completes, so the
 * request span can link to its batch. Ids are W3C's: a trace id of 16 bytes,
 * a span id of 8, as 32 and 16 lowercase hex digits in the OpenTelemetry API
 * and as 4 and 2 uint32 words here.
 *
 *   [0..3]  request trace id    [4..5] request span id    [6] flags (1: a sampled request span; 0: none)
 *   [7..10] batch trace id      [11..12] batch span id     (all zero until a batch span is made)
 */

export const TRACE_I32 = 13;
const FLAGS = 6;
const BATCH = 7;

export interface SpanIds {
  traceId: string;
  spanId: string;
}

/** Hex text and words meet here: Buffer's native hex codec, one string per read. */
const scratch = Buffer.allocUnsafe(16);

/** `hex` (8 digits a word) into words[at..]. */
function writeHex(words: Int32Array, at: number, hex: string, count: number): void {
  scratch.write(hex, 0, count * 4, 'hex');
  for (let i = 0; i < count; i++) words[at + i] = scratch.readInt32BE(i * 4);
}

function readHex(words: Int32Array, at: number, count: number): string {
  for (let i = 0; i < count; i++) scratch.writeInt32BE(words[at + i]!, i * 4);
  return scratch.toString('hex', 0, count * 4);
}

/** Marks slot `i`'s context (its TRACE_I32 words at `base`) with a sampled request span, or none; clears its batch span. */
export function writeRequestSpan(words: Int32Array, base: number, span: SpanIds | null): void {
  words[base + FLAGS] = span ? 1 : 0;
  if (!span) return;
  writeHex(words, base, span.traceId, 4);
  writeHex(words, base + 4, span.spanId, 2);
  words.fill(0, base + BATCH, base + TRACE_I32);
}

/** The sampled request span a slot carries, or null. */
export function readRequestSpan(words: Int32Array, base: number): SpanIds | null {
  if (words[base + FLAGS] !== 1) return null;
  return { traceId: readHex(words, base, 4), spanId: readHex(words, base + 4, 2) };
}

export function writeBatchSpan(words: Int32Array, base: number, span: SpanIds): void {
  writeHex(words, base + BATCH, span.traceId, 4);
  writeHex(words, base + BATCH + 4, span.spanId, 2);
}

/** The batch span a traced slot ran in, or null (not traced, or no batch span made). */
export function readBatchSpan(words: Int32Array, base: number): SpanIds | null {
  if (words[base + FLAGS] !== 1) return null;
  if (words[base + BATCH + 4] === 0 && words[base + BATCH + 5] === 0) return null;
  return { traceId: readHex(words, base + BATCH, 4), spanId: readHex(words, base + BATCH + 4, 2) };
}
