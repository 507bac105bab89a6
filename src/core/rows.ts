/**
 * What a request's rows mean, per task: embeddings, class scores, rerank
 * scores, token vectors. Answer shapes are the dialects' business.
 */
import type { ServedModel } from './served-model.js';
import type { RequestRows } from './submitter.js';

export interface Classification {
  /** Most likely label and its probability. */
  label: string;
  score: number;
  /** Probability of every label, by class id. */
  probabilities: Float32Array;
  /** Raw logits, by class id. */
  logits: Float32Array;
}

export interface RerankScore {
  /** Position of the text in the request. */
  index: number;
  score: number;
}

/** Row i of a request's rows (a view). */
export function rowOf(r: RequestRows, i: number): Float32Array {
  return r.rows.subarray(i * r.width, (i + 1) * r.width);
}

/**
 * The embeddings of an embed model's rows (views into them): L2-normalised as
 * the graph leaves them, or scaled back by the norm the graph keeps beside
 * each row (`normalize` false; default: the model's own setting).
 */
export function embeddings(model: ServedModel, r: RequestRows, normalize?: boolean): Float32Array[] {
  const dim = model.plan.spec.dimension;
  const keep = normalize ?? model.plan.spec.normalize;
  const out: Float32Array[] = new Array(r.rows.length / r.width);
  for (let i = 0; i < out.length; i++) {
    const row = rowOf(r, i);
    const v = row.subarray(0, dim);
    if (!keep) {
      const norm = row[dim]!; // the graph's second output: undo the normalisation
      for (let k = 0; k < dim; k++) v[k]! *= norm;
    }
    out[i] = v;
  }
  return out;
}

/** The classes of a classifier's rows: probabilities then logits, side by side in each row. */
export function classifications(model: ServedModel, r: RequestRows): Classification[] {
  const labels = model.plan.spec.labels;
  const n = labels.length;
  const out: Classification[] = new Array(r.rows.length / r.width);
  for (let i = 0; i < out.length; i++) {
    const row = rowOf(r, i);
    const probabilities = row.subarray(0, n);
    let best = 0;
    for (let k = 1; k < n; k++) if (probabilities[k]! > probabilities[best]!) best = k;
    out[i] = { label: labels[best]!, score: probabilities[best]!, probabilities, logits: row.subarray(n, 2 * n) };
  }
  return out;
}

/** A reranker's score of each pair, in input order: the sigmoid of its logit, or the logit (`raw`). The row is [sigmoid(logit), logit]. */
export function rerankScores(r: RequestRows, raw: boolean): RerankScore[] {
  const column = raw ? 1 : 0;
  const out: RerankScore[] = new Array(r.rows.length / r.width);
  for (let i = 0; i < out.length; i++) out[i] = { index: i, score: r.rows[i * r.width + column]! };
  return out;
}

/** Input i's token vectors (views of its copy): one Float32Array of tokenWidth floats per token. Needs a call with tokenRows. */
export function tokenVectors(r: RequestRows, i: number): Float32Array[] {
  const flat = r.tokens?.[i];
  const width = r.tokenWidth ?? 0;
  if (!flat || width === 0) throw new Error(`input ${i} has no token vectors: its call did not ask for them (tokenRows)`);
  return Array.from({ length: flat.length / width }, (_, t) => flat.subarray(t * width, (t + 1) * width));
}
