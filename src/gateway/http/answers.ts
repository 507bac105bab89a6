/**
 * Answer bodies of the hot routes, serialised without a general-purpose
 * serialiser where that is cheaper: embedding rows as JSON bytes straight
 * from the float32 values, each the shortest decimal that reads back to the
 * same float32 (float-json.ts: cheaper than JSON.stringify of the doubles
 * they widen to, and fewer bytes).
 */
import { pack } from 'msgpackr';
import { rowBytes, type QuantizedRow } from '../../core/quantized-embeddings.js';
import { float32RowsJsonView } from './float-json.js';
import type { Answer } from './request-context.js';

/** Rows as number lists (msgpack answers, and frames that enclose them). */
export function rowLists(rows: readonly Float32Array[]): number[][] {
  return rows.map((r) => Array.from(r));
}

/**
 * An answer whose JSON is written by `json` (float rows from their float32
 * values) and whose msgpack, and `value()` for enclosing frames, come from the
 * plain value: every hot answer's shape.
 */
export function floatAnswer(value: () => unknown, json: () => string | Uint8Array): Answer & { value(): unknown } {
  return { json, msgpack: () => pack(value()), value };
}

/**
 * An answer of embedding rows: JSON from the float32 values (a view of a
 * scratch buffer, written out at once by RequestContext.answer), msgpack as
 * number lists.
 */
export function rowsAnswer(rows: readonly Float32Array[]): Answer & { value(): unknown } {
  return floatAnswer(() => rowLists(rows), () => float32RowsJsonView(rows));
}

/** One quantized row as a JSON integer list (TypedArray#join writes each integer as JSON does). */
export function integerRowJson(row: QuantizedRow): string {
  return `[${row.join(',')}]`;
}

/**
 * An answer of quantized rows (core/quantized-embeddings.ts): JSON integer lists;
 * msgpack, and `value()` for WebSocket frames, one `bin` of each row's bytes
 * (an int8 row's two's complement).
 */
export function quantizedRowsAnswer(rows: readonly QuantizedRow[]): Answer & { value(): unknown } {
  return floatAnswer(
    () => rows.map(rowBytes),
    () => `[${rows.map(integerRowJson).join(',')}]`,
  );
}
