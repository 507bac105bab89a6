/**
 * Sparse rows: a weight per vocabulary id, kept as the non-zero entries only,
 * ids ascending: what /embed_sparse answers (text-embeddings-inference's
 * `[{index, value}]`). A SPLADE row is vocabulary-wide on the slot (the graph
 * pools it, docs/architecture.md); only its non-zeros leave the gateway.
 */

export interface SparseRow {
  /** Vocabulary ids, ascending. */
  indices: Uint32Array;
  /** The weight of each, none zero. */
  values: Float32Array;
}

/** The non-zero entries of a dense row (a SPLADE row: its index is the token id). */
export function sparseOf(row: Float32Array): SparseRow {
  let n = 0;
  for (let i = 0; i < row.length; i++) if (row[i] !== 0) n++;
  const indices = new Uint32Array(n);
  const values = new Float32Array(n);
  for (let i = 0, k = 0; i < row.length; i++) {
    const v = row[i]!;
    if (v !== 0) {
      indices[k] = i;
      values[k++] = v;
    }
  }
  return { indices, values };
}

/** A sparse row as TEI's list of `{index, value}`. */
export function sparseEntries(row: SparseRow): { index: number; value: number }[] {
  return Array.from(row.indices, (index, k) => ({ index, value: row.values[k]! }));
}
