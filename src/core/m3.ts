/**
 * BGE-M3's sparse and colbert outputs of one input, from its token vectors
 * (the token area: per token, its normalised colbert vector then its sparse
 * weight: graph.ts m3Heads) and its ids, as FlagEmbedding's M3Embedder
 * post-processes them:
 *
 *   sparse   per token id, the largest weight of its tokens; the tokenizer's
 *            cls, eos, pad and unk ids and weights <= 0 left out
 *            (_process_token_weights); here ids ascending, /embed_sparse's form
 *   colbert  the vectors of every token after the first ([CLS] / <s>), the
 *            last ([SEP] / </s>) included (_process_colbert_vecs)
 *
 * The dense row is the pooled one every embedding model has.
 */
import type { M3Spec } from '../shared/model-format/model-config.js';
import type { SparseRow } from './sparse.js';

/** The sparse weights of one input: `vectors` is [length x (dim + 1)], the weight last in each. */
export function m3Sparse(ids: ArrayLike<number>, vectors: Float32Array, m3: M3Spec): SparseRow {
  const width = m3.colbert.dim + 1;
  const unused = new Set(m3.unusedIds);
  const best = new Map<number, number>();
  for (let t = 0; t < ids.length; t++) {
    const id = ids[t]!;
    const w = vectors[t * width + width - 1]!;
    if (w > 0 && !unused.has(id) && w > (best.get(id) ?? 0)) best.set(id, w);
  }
  const indices = Uint32Array.from([...best.keys()].sort((a, b) => a - b));
  return { indices, values: Float32Array.from(indices, (id) => best.get(id)!) };
}

/** The colbert vectors of one input (views): every token's but the first. */
export function m3Colbert(length: number, vectors: Float32Array, m3: M3Spec): Float32Array[] {
  const { dim } = m3.colbert;
  const width = dim + 1;
  return Array.from({ length: Math.max(0, length - 1) }, (_, k) => vectors.subarray((k + 1) * width, (k + 1) * width + dim));
}
