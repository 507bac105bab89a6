/**
 * Where the windows of a token sequence too long for the model start: one
 * rule for a text cut alone (long-inputs.ts) and for a pair's document cut
 * beside its query (tokenizer.ts encodePairWindows). Each window holds `body`
 * tokens (the last one fewer) and repeats the last `overlap` of the one before.
 */

/** The overlap a window of `body` tokens takes: the one asked for, at most half of it. */
export function overlapFor(overlap: number, body: number): number {
  return Math.min(overlap, Math.floor(body / 2));
}

/** Where each window starts in a sequence of `n` tokens, `body` to a window, `overlap` repeated: at least one window. */
export function windowStarts(n: number, body: number, overlap: number, maxWindows = Infinity): number[] {
  const starts = [0];
  const step = body - overlap;
  for (let s = step; s + overlap < n && starts.length < maxWindows; s += step) starts.push(s);
  return starts;
}
