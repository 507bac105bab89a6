/**
 * Long inputs (docs/long-inputs.md): an input longer than the model takes is
 * refused (`error`, 413), cut (`truncate`), or `chunk`ed: cut into consecutive
 * windows of the model's length, each run as an input of the batches, and
 * their rows combined into the input's one row.
 *
 *   - a window holds the tokenizer's special tokens around as many of the
 *     text's tokens as fit (a BERT window: max length - 2), the last one
 *     shorter; each repeats the last `overlap` text tokens of the one before;
 *   - embeddings: max and SPLADE pooling take the max over windows; every
 *     other pooling the mean of the windows' rows (before normalising),
 *     weighted by the tokens each window's pooling covers: for mean pooling
 *     without overlap, the mean over every token of every window;
 *   - rerank: the best window's row (Cohere's rule; windows are made by
 *     Encoder.pairWindows, the query whole in each);
 *   - token vectors: the windows' in order, each text token once (the
 *     overlap dropped from the later window), the first window's leading and
 *     the last window's trailing special tokens around them.
 */
import type { ChunkPolicy, Tokens } from './inputs.js';
import { InputTooLongError } from '../shared/errors.js';
import { overlapFor, windowStarts } from './tokenizer/windows.js';

export { LONG_INPUTS, type LongInputs } from '../shared/options.js';

/** The special tokens the tokenizer puts before and after one text ([CLS] and [SEP]: 1 and 1). */
export interface Around {
  lead: number;
  trail: number;
}

/** A request's inputs as the windows that run: input i ran as windows `from[i]` to `from[i + 1]`. */
export interface Windowed {
  tokens: Tokens[];
  from: Int32Array;
  /** Each input's tokens before it was cut, whose token vectors are answered (a pair's: its first window; a reranker answers none). */
  whole: Tokens[];
  /** The special tokens around each window's text, and the text tokens a window repeats of the one before. */
  around: Around;
  overlap: number;
}

/** One input (special tokens included) as windows of at most `maxLength` tokens; itself when it fits. */
export function splitTokens(t: Tokens, maxLength: number, around: Around, policy: ChunkPolicy): Tokens[] {
  const n = t.ids.length;
  if (n <= maxLength) return [t];
  const { lead, trail } = around;
  const body = maxLength - lead - trail;
  const text = n - lead - trail;
  const overlap = overlapFor(policy.overlap, body);
  return windowStarts(text, body, overlap).map((s, w) => {
    const len = Math.min(body, text - s);
    const pick = (a: Int32Array) => {
      const out = new Int32Array(lead + len + trail);
      out.set(a.subarray(0, lead));
      out.set(a.subarray(lead + s, lead + s + len), lead);
      out.set(a.subarray(n - trail), lead + len);
      return out;
    };
    const poolFrom = w === 0 ? t.poolFrom : undefined; // a prompt is the first window's
    return { ids: pick(t.ids), typeIds: t.typeIds ? pick(t.typeIds) : null, ...(poolFrom ? { poolFrom } : {}) };
  });
}

/** A request's inputs as windows (each one that fits, one window). */
export function splitAll(tokens: readonly Tokens[], maxLength: number, around: Around, policy: ChunkPolicy): Windowed {
  const from = new Int32Array(tokens.length + 1);
  const out: Tokens[] = [];
  tokens.forEach((t, i) => {
    for (const w of splitTokens(t, maxLength, around, policy)) out.push(w);
    from[i + 1] = out.length;
  });
  return { tokens: out, from, whole: tokens as Tokens[], around, overlap: overlapFor(policy.overlap, maxLength - around.lead - around.trail) };
}

/** Whether any input took more than one window. */
export function isChunked(w: Windowed): boolean {
  return w.tokens.length > w.from.length - 1;
}

/** An input past --max-input-tokens: the 413 says which bound it passed (other errors as they are). */
export function chunkedTooLong(policy: ChunkPolicy): (err: unknown) => never {
  return (err) => {
    if (err instanceof InputTooLongError && err.maxLength === policy.maxInputTokens) {
      throw new InputTooLongError(err.length, err.maxLength, 'send a shorter one, or "truncate": true to cut it', 'a chunked input may have (--max-input-tokens)');
    }
    throw err;
  };
}

/** `run()`, its 413 past --max-input-tokens naming that bound (chunkedTooLong). */
export function tryChunked<T>(run: () => T, policy: ChunkPolicy): T {
  try {
    return run();
  } catch (err) {
    return chunkedTooLong(policy)(err);
  }
}
