/**
 * A chunked request's rows: the windows' rows (long-inputs.ts) combined into
 * one row per input, as the answer shapes expect them.
 */
import type { Windowed } from './long-inputs.js';
import type { RequestRows } from './submitter.js';
import type { ServedPooling } from '../shared/model-format/model-config.js';

/** How windows' rows become an input's: an embedding model's pooling, or a reranker's best window. */
export type Combine = { task: 'embed'; pooling: ServedPooling; dimension: number } | { task: 'rerank' };

/** One row per input from the rows of its windows (token vectors too, where they came back). */
export function combineRows(r: RequestRows, w: Windowed, how: Combine): RequestRows {
  const inputs = w.from.length - 1;
  const width = r.width;
  const rows = new Float32Array(inputs * width);
  for (let i = 0; i < inputs; i++) {
    const a = w.from[i]!;
    const b = w.from[i + 1]!;
    const out = rows.subarray(i * width, (i + 1) * width);
    if (b - a === 1) out.set(r.rows.subarray(a * width, (a + 1) * width));
    else if (how.task === 'rerank') out.set(bestWindow(r, a, b));
    else combineEmbedding(r, w, a, b, how, out);
  }
  const combined: RequestRows = { ...r, rows };
  if (r.tokens) combined.tokens = Array.from({ length: inputs }, (_, i) => joinTokens(r, w, i));
  return combined;
}

/** A reranker's row [sigmoid, logit] of the window with the highest logit. */
function bestWindow(r: RequestRows, a: number, b: number): Float32Array {
  let best = a;
  for (let k = a + 1; k < b; k++) if (r.rows[k * r.width + 1]! > r.rows[best * r.width + 1]!) best = k;
  return r.rows.subarray(best * r.width, (best + 1) * r.width);
}

/**
 * Windows a..b's embedding rows ([unit vector, norm] each, as the graph
 * leaves them) into `out`: their vectors scaled back by their norms, then the
 * max (max and SPLADE pooling) or the mean weighted by the tokens each pooled,
 * normalised again with its norm beside it. In float64.
 */
function combineEmbedding(r: RequestRows, w: Windowed, a: number, b: number, how: Extract<Combine, { task: 'embed' }>, out: Float32Array): void {
  const dim = how.dimension;
  const max = how.pooling === 'max' || how.pooling === 'splade';
  const v = new Float64Array(dim).fill(max ? -Infinity : 0);
  let weights = 0;
  for (let k = a; k < b; k++) {
    const row = r.rows.subarray(k * r.width, k * r.width + dim + 1);
    const norm = row[dim]!;
    const t = w.tokens[k]!;
    const weight = t.ids.length - (t.poolFrom ?? 0);
    weights += weight;
    if (max) for (let h = 0; h < dim; h++) v[h] = Math.max(v[h]!, row[h]! * norm);
    else for (let h = 0; h < dim; h++) v[h]! += weight * row[h]! * norm;
  }
  if (!max) for (let h = 0; h < dim; h++) v[h]! /= weights;
  let sum = 0;
  for (let h = 0; h < dim; h++) sum += v[h]! * v[h]!;
  const norm = Math.sqrt(sum);
  const safe = Math.max(norm, 1e-12); // as the graph's
  for (let h = 0; h < dim; h++) out[h] = v[h]! / safe;
  out[dim] = norm;
}

/**
 * Input i's token vectors from its windows': the first window's leading
 * special tokens, each window's text tokens (less those it repeats of the one
 * before), the last window's trailing special tokens: one vector per token of
 * the input as it was before it was cut (Windowed.whole).
 */
function joinTokens(r: RequestRows, w: Windowed, i: number): Float32Array {
  const a = w.from[i]!;
  const b = w.from[i + 1]!;
  if (b - a === 1) return r.tokens![a]!;
  const width = r.tokenWidth!;
  const { lead, trail } = w.around;
  const out = new Float32Array(w.whole[i]!.ids.length * width);
  let at = 0;
  const copy = (k: number, from: number, to: number) => {
    out.set(r.tokens![k]!.subarray(from * width, to * width), at);
    at += (to - from) * width;
  };
  copy(a, 0, lead);
  for (let k = a; k < b; k++) copy(k, lead + (k === a ? 0 : w.overlap), w.tokens[k]!.ids.length - trail);
  const last = w.tokens[b - 1]!.ids.length;
  copy(b - 1, last - trail, last);
  if (at !== out.length) throw new Error(`chunked token vectors: ${at / width} joined for an input of ${out.length / width} tokens`);
  return out;
}
