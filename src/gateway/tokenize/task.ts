/**
 * A piscina task: tokenizes a client batch on a pool thread, so a request
 * carrying many long texts never blocks the gateway's event loop (a long
 * text takes about a millisecond to tokenize, so a batch of them would stall
 * every other request on that gateway for tens of ms). Returns flat typed arrays.
 */
import { InputTooLongError } from '../../shared/errors.js';
import { nameThread } from '../../shared/threads.js';
import { loadModelTokenizer, type TextTokenizer } from '../../core/tokenizer/tokenizer.js';

nameThread('tokenizer'); // for top -H: it would otherwise show its gateway's name, inherited

export interface TokenizeTask {
  tokenizerPath: string;
  /** Lowercase the texts first (the model's do_lower_case). */
  lowercase: boolean;
  texts: string[];
  maxLength: number;
  truncate: boolean;
  direction?: 'right' | 'left' | undefined;
}

export type TokenizeResult =
  | { ids: Int32Array; typeIds: Int32Array; lengths: Int32Array; truncated: Uint8Array }
  | { tooLong: { length: number; maxLength: number } };

const tokenizers = new Map<string, Promise<TextTokenizer>>();

export default async function tokenize(task: TokenizeTask): Promise<TokenizeResult> {
  const key = `${task.lowercase} ${task.tokenizerPath}`;
  let tok = tokenizers.get(key);
  if (!tok) {
    tok = loadModelTokenizer(task);
    tokenizers.set(key, tok);
  }
  const tokenizer = await tok;
  const lengths = new Int32Array(task.texts.length);
  const truncated = new Uint8Array(task.texts.length);
  const parts = [];
  let total = 0;
  try {
    for (let i = 0; i < task.texts.length; i++) {
      const e = tokenizer.encode(task.texts[i]!, { maxLength: task.maxLength, truncate: task.truncate, direction: task.direction });
      parts.push(e);
      lengths[i] = e.ids.length;
      truncated[i] = e.truncated ? 1 : 0;
      total += e.ids.length;
    }
  } catch (err) {
    // Error classes do not survive the trip between threads: send the facts instead.
    if (err instanceof InputTooLongError) return { tooLong: { length: err.length, maxLength: err.maxLength } };
    throw err;
  }
  const ids = new Int32Array(total);
  const typeIds = new Int32Array(total);
  let at = 0;
  for (const e of parts) {
    ids.set(e.ids, at);
    typeIds.set(e.typeIds, at);
    at += e.ids.length;
  }
  return { ids, typeIds, lengths, truncated };
}
