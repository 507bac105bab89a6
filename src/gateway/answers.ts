/**
 * Answer bodies of the hot routes, serialised without a general-purpose
 * serialiser where that is cheaper: embedding rows as JSON text straight
 * from the float32 values.
 */
import { pack } from 'msgpackr';
import type { Answer } from './http.js';

/** Embedding rows as JSON: `[[x, ...], ...]`. */
export function embeddingsJson(rows: readonly Float32Array[]): string {
  return JSON.stringify(rows.map((r) => Array.from(r)));
}

/** Rows as number lists (msgpack answers, JSON inside other shapes). */
export function rowLists(rows: readonly Float32Array[]): number[][] {
  return rows.map((r) => Array.from(r));
}

/** An answer of embedding rows: JSON from the float32 values, msgpack as number lists, `value()` for enclosing frames. */
export function rowsAnswer(rows: readonly Float32Array[]): Answer & { value(): unknown } {
  return {
    json: () => embeddingsJson(rows),
    msgpack: () => pack(rowLists(rows)),
    value: () => rowLists(rows),
  };
}
