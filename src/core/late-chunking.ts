/**
 * Late chunking (Jina, arXiv 2409.04701): one text runs through the model
 * whole, then each chunk's row is the model's pooling over the token states
 * of the tokens in that chunk, so every chunk's vector has seen the whole
 * document. `/embed` with `chunks` (src/gateway/tei/endpoints.ts) wires these pure
 * functions around one call for the text's token states (tokenRows).
 *
 * The rules:
 *   - a chunk is a half-open span [start, end) of code points of the text as
 *     sent (the unit of /tokenize's start and stop), not of the prompted text;
 *   - a token belongs to the chunk its start offset falls in
 *     (start <= token.start < end): adjacent chunks partition the tokens, and a
 *     token that straddles a boundary counts once, in the chunk it starts in;
 *     special tokens ([CLS], [SEP]) and a prompt's tokens belong to no chunk;
 *   - chunks are ordered by start (overlaps allowed); each must hold a token;
 *   - each chunk is pooled as the model pools a whole input (src/gpu-worker/graph.ts
 *     pool()), restricted to the chunk's tokens: mean, max, mean_sqrt_len
 *     (sum / sqrt(n)), weightedmean (weight: the token's position in the whole
 *     sequence, counted from 1, [CLS] and prompt included, as the graph's running count of the
 *     attention mask), cls (the chunk's first token), lasttoken (its last).
 */
import { FieldValidationError } from '../shared/errors.js';
import type { Pooling } from '../shared/model-format/model-config.js';
import type { TokenSpan, TruncationDirection } from './tokenizer/tokenizer.js';

/** A chunk: [start, end) in code points of the text as sent. */
export type Chunk = readonly [start: number, end: number];

const chunkError = (message: string) => new FieldValidationError(message, 'chunks');
const shown = (x: unknown) => (JSON.stringify(x) ?? String(x)).slice(0, 40);

/**
 * The request's chunks, checked against the text (`chars` code points long):
 * a non-empty list, at most `limit` (the most rows one request answers), each
 * two integers with 0 <= start < end <= chars, starts in order. 422s name the chunk.
 */
export function checkChunks(raw: readonly unknown[], chars: number, limit: number): Chunk[] {
  if (raw.length === 0) throw chunkError('chunks must not be an empty list: give [start, end] spans of the text, or leave chunks out');
  if (raw.length > limit) throw chunkError(`${raw.length} chunks exceed the limit of ${limit} per request (--max-client-batch-size)`);
  const out: Chunk[] = [];
  raw.forEach((c, i) => {
    if (!Array.isArray(c) || c.length !== 2 || !Number.isSafeInteger(c[0]) || !Number.isSafeInteger(c[1])) {
      throw chunkError(`chunk ${i} (${shown(c)}) must be [start, end]: two integers, code points of the text`);
    }
    const [start, end] = c as [number, number];
    const at = `chunk ${i} [${start}, ${end})`;
    if (start < 0) throw chunkError(`${at}: start must not be negative`);
    if (end > chars) throw chunkError(`${at}: end is past the text's end (${chars} code points)`);
    if (start >= end) throw chunkError(`${at}: start must be before end`);
    const before = out[i - 1];
    if (before && start < before[0]) throw chunkError(`${at} is unordered: it starts before chunk ${i - 1} (at ${before[0]}); order chunks by start`);
    out.push([start, end]);
  });
  return out;
}

/** Code points in a string (what chunk offsets count). */
export function codePoints(s: string): number {
  let n = 0;
  for (const _ of s) n++;
  return n;
}

/**
 * Where each token that ran starts in the text as sent (code points), null
 * for special tokens, a prompt's tokens and tokens the tokenizer could not
 * place. `ran` is the run's ids (the tokenizer's encode(), truncated); `spans`
 * is tokenize() of the same prompted text, special tokens added, untruncated;
 * `shift` is the prompt's length in code points. The two are matched id by
 * id: the run keeps the template's special tokens and a slice of the text's
 * tokens (the first ones, or with truncation left the last ones). A mismatch
 * is a bug, not the client's: a plain Error (500).
 */
export function runTokenStarts(ran: ArrayLike<number>, spans: readonly TokenSpan[], direction: TruncationDirection | undefined, shift: number): (number | null)[] {
  let lead = 0;
  while (lead < spans.length && spans[lead]!.special) lead++;
  let body = lead;
  while (body < spans.length && !spans[body]!.special) body++;
  const bodyLen = body - lead;
  const trail = spans.length - body;
  const kept = ran.length - lead - trail;
  if (kept < 0 || kept > bodyLen) throw new Error(`late chunking: ${ran.length} tokens ran, but the text has ${bodyLen} tokens and ${lead + trail} special ones`);
  const from = direction === 'left' ? bodyLen - kept : 0;
  const spanOf = (t: number) => (t < lead ? spans[t]! : t < lead + kept ? spans[lead + from + t - lead]! : spans[body + t - lead - kept]!);
  const out: (number | null)[] = new Array(ran.length);
  for (let t = 0; t < ran.length; t++) {
    const s = spanOf(t);
    if (s.id !== ran[t]) throw new Error(`late chunking: token ${t} ran as id ${ran[t]}, but the offsets are of id ${s.id}`);
    out[t] = startInText(s, shift);
  }
  return out;
}

/** Where each of `spans` starts in the text as sent (`shift`: the prompt's code points), null where it belongs to no chunk. */
export function textTokenStarts(spans: readonly TokenSpan[], shift: number): (number | null)[] {
  return spans.map((s) => startInText(s, shift));
}

/** A token's start in the text as sent: null for a special token, a prompt's token, or one the tokenizer could not place. */
function startInText(s: TokenSpan, shift: number): number | null {
  return s.special || s.start === null || s.start < shift ? null : s.start - shift;
}

/** Whether any of `starts` falls in `c`. */
export function holdsToken(c: Chunk, starts: readonly (number | null)[]): boolean {
  return starts.some((s) => s !== null && s >= c[0] && s < c[1]);
}

/**
 * The tokens of each chunk: the indices (into the run's sequence, ascending)
 * of the tokens whose start falls in it. A chunk with none is a 422 naming
 * it; `cutOff(chunk)` says whether truncation removed its tokens (the message says which).
 */
export function chunkTokens(chunks: readonly Chunk[], starts: readonly (number | null)[], cutOff: (c: Chunk) => boolean): Int32Array[] {
  return chunks.map((c, i) => {
    const rows: number[] = [];
    starts.forEach((s, t) => {
      if (s !== null && s >= c[0] && s < c[1]) rows.push(t);
    });
    if (rows.length === 0) {
      const why = cutOff(c) ? 'truncation cut its tokens off' : 'no token starts in it (only spaces, or inside a token that starts before it)';
      throw chunkError(`chunk ${i} [${c[0]}, ${c[1]}) holds no token: ${why}`);
    }
    return Int32Array.from(rows);
  });
}

/**
 * One chunk's vector from the run's token states (`states`: [tokens x width],
 * flat) over the token indices `rows` (ascending), as graph.ts pool() pools a
 * whole input over its mask, in float64.
 */
export function poolChunk(states: Float32Array, width: number, rows: Int32Array, mode: Pooling): Float32Array {
  const out = new Float64Array(width);
  const n = rows.length;
  if (mode === 'cls' || mode === 'lasttoken') {
    const t = rows[mode === 'cls' ? 0 : n - 1]!;
    return states.slice(t * width, (t + 1) * width);
  }
  if (mode === 'max') out.fill(-Infinity);
  let weights = 0;
  for (const t of rows) {
    // weightedmean: position t (from 0) weighs t + 1, as the graph's running count of the mask
    const w = mode === 'weightedmean' ? t + 1 : 1;
    weights += w;
    const at = t * width;
    if (mode === 'max') for (let h = 0; h < width; h++) out[h] = Math.max(out[h]!, states[at + h]!);
    else for (let h = 0; h < width; h++) out[h]! += w * states[at + h]!;
  }
  const divisor = mode === 'max' ? 1 : mode === 'mean_sqrt_len' ? Math.sqrt(n) : weights;
  return Float32Array.from(out, (v) => v / divisor);
}

/** `row` divided by its L2 norm (at least 1e-12, as the graph's), in place. */
export function normalizeInPlace(row: Float32Array): Float32Array {
  let sum = 0;
  for (const v of row) sum += v * v;
  const norm = Math.max(Math.sqrt(sum), 1e-12);
  for (let h = 0; h < row.length; h++) row[h]! /= norm;
  return row;
}
