/**
 * ColBERT inputs as PyLate builds them (pylate/models/colbert.py), for a
 * PyLate folder (spec.colbert, read by shared/model-format/hf-folder.ts):
 *
 *   - the text is tokenized with [CLS] and [SEP] and cut to its length less one
 *     (query_length for a query, document_length for a document), then the
 *     marker ([Q] / [D]: an added token, never tokenized from text) is put
 *     right after [CLS];
 *   - a query with do_query_expansion is padded with [MASK] to query_length;
 *     the [MASK]s get attention mask 0 (real tokens do not attend to them; they
 *     still get vectors) unless attend_to_expansion_tokens;
 *   - a query answers every vector (the [MASK]s' too), a document those of
 *     its tokens not on the skiplist (punctuation by default);
 *   - chunked (long-inputs.ts), a document longer than its length runs as
 *     windows, each marked as PyLate marks one document; queries are always cut.
 *
 * The vectors themselves (the Dense projection, L2-normalised per token) are
 * the graph's: gpu-worker/graph.ts.
 */
import type { ColbertSpec } from '../shared/model-format/model-config.js';
import type { ColbertInputType, Tokens } from './inputs.js';
import type { Windowed } from './long-inputs.js';
import type { Encoding } from './tokenizer/tokenizer.js';

export const COLBERT_INPUT_TYPES: readonly ColbertInputType[] = ['query', 'document'];

/** A ColBERT input as it runs: its ids, and how many of them the attention sees (all but the expansion [MASK]s). */
export interface ColbertTokens {
  ids: Int32Array;
  typeIds: Int32Array;
  /** Leading tokens the attention sees; the rest are expansion [MASK]s. */
  attended: number;
}

const markerOf = (c: ColbertSpec, kind: ColbertInputType) => (kind === 'query' ? c.queryPrefixId : c.documentPrefixId);

/** Tokens of a `kind` input, the marker included: its length in the folder, at most the model's max length. */
export function colbertLength(c: ColbertSpec, kind: ColbertInputType, maxLength: number): number {
  return Math.min(kind === 'query' ? c.queryLength : c.documentLength, maxLength);
}

/** Tokens the tokenizer may give a `kind` text ([CLS] and [SEP] included): its length less the marker. */
export function colbertTextLength(c: ColbertSpec, kind: ColbertInputType, maxLength: number): number {
  return colbertLength(c, kind, maxLength) - (markerOf(c, kind) === null ? 0 : 1);
}

/** One tokenized text (cut to colbertTextLength) as it runs: marked, and a query expanded. */
export function markColbert(e: Pick<Encoding, 'ids' | 'typeIds'>, c: ColbertSpec, kind: ColbertInputType, maxLength: number): ColbertTokens {
  const marker = markerOf(c, kind);
  const real = e.ids.length + (marker === null ? 0 : 1);
  const expand = kind === 'query' && c.doQueryExpansion;
  const length = expand ? Math.max(real, colbertLength(c, kind, maxLength)) : real;
  const ids = new Int32Array(length).fill(c.maskId);
  const typeIds = new Int32Array(length);
  ids[0] = e.ids[0]!; // [CLS]
  const at = marker === null ? 1 : 2;
  if (marker !== null) ids[1] = marker;
  ids.set(e.ids.subarray(1), at);
  typeIds.set(e.typeIds.subarray(1), at);
  return { ids, typeIds, attended: expand && !c.attendToExpansionTokens ? real : length };
}

/**
 * A document's windows, cut from its unmarked tokens (windows of
 * colbertTextLength), as they run: each window marked as one document, the
 * whole marked too (its token vectors are answered), the marker counted
 * among the leading special tokens that only the first window's give.
 */
export function markDocumentWindows(w: Windowed, c: ColbertSpec, maxLength: number): Windowed {
  const mark = (t: Tokens) => markColbert({ ids: t.ids, typeIds: t.typeIds ?? new Int32Array(t.ids.length) }, c, 'document', maxLength);
  const marker = markerOf(c, 'document') === null ? 0 : 1;
  return { ...w, tokens: w.tokens.map(mark), whole: w.whole.map(mark), around: { lead: w.around.lead + marker, trail: w.around.trail } };
}

/** Which of an input's token vectors PyLate answers: a query's all, a document's those not on the skiplist. */
export function keptTokens(ids: ArrayLike<number>, c: ColbertSpec, kind: ColbertInputType): number[] {
  const kept: number[] = [];
  const skip = kind === 'document' ? new Set(c.skiplistIds) : null;
  for (let t = 0; t < ids.length; t++) if (!skip?.has(ids[t]!)) kept.push(t);
  return kept;
}
