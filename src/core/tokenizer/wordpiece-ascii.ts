/**
 * The BERT tokenizer pipeline (BertNormalizer, BertPreTokenizer, WordPiece) on
 * ASCII text, without the allocations of `@huggingface/tokenizers`.
 *
 * Why: the library builds an array of one-character strings per text, tests a
 * regular expression per character and joins a fresh substring per WordPiece
 * attempt: tens of kilobytes of garbage for a short text, which under load
 * makes the gateway scavenge many times a second. This path gives the same ids
 * in a fraction of the time and garbage, its pieces looked up in a table keyed
 * by their characters (piece-table.ts) (docs/tokenizer.md has the figures).
 *
 * It answers only where the result is plainly the library's: every character
 * printable ASCII or tab/newline/return (so cleaning, CJK spacing and accent
 * stripping change nothing), and no added token's text inside (so the
 * library's added-token split changes nothing). Anything else returns null and
 * the caller runs the library. The vocabulary is the library's own
 * (`token_to_id`), added tokens included, as its WordPiece sees it.
 */

import { CONTINUATION_SEED, hashStep, INITIAL_SEED, PieceTable } from './piece-table.js';

type Json = Record<string, unknown>;

/** The library's vocabulary lookup (Tokenizer.token_to_id): the ids the piece table is built with. */
export interface TokenLookup {
  token_to_id(token: string): number | undefined;
}

const WORD = 1;
const SPACE = 2;
const PUNCT = 3;

/** Class of each ASCII code: 0 (not handled here: control characters), WORD, SPACE or PUNCT. */
const ASCII_CLASS = (() => {
  const cls = new Uint8Array(128);
  for (let c = 0x21; c < 0x7f; c++) cls[c] = WORD;
  for (const c of [0x09, 0x0a, 0x0d, 0x20]) cls[c] = SPACE;
  // BertPreTokenizer's ASCII punctuation: every non-alphanumeric printable, symbols included (as Rust's is_ascii_punctuation)
  for (const [from, to] of [[0x21, 0x2f], [0x3a, 0x40], [0x5b, 0x60], [0x7b, 0x7e]] as const) {
    for (let c = from; c <= to; c++) cls[c] = PUNCT;
  }
  return cls;
})();

/** A character this path hands back (the complement of ASCII_CLASS's non-zero codes). */
const HANDED_BACK = /[^\t\n\r\x20-\x7e]/;

/**
 * How many times faster per character this path tokenizes than the library, kept below what
 * bench/micro/tokenizers.ts measures on short and long texts (docs/tokenizer.md). The inline rule
 * (--inline-tokenize-chars) counts a text it takes at 1/ASCII_PACE of its length.
 */
export const ASCII_PACE = 8;

function isObj(x: unknown): x is Json {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

export class AsciiWordPiece {
  /** The library's vocabulary (token_to_id), its ASCII pieces keyed by their characters. */
  readonly #pieces: PieceTable;
  readonly #lowercase: boolean;
  readonly #unkId: number;
  readonly #maxWordChars: number;
  /** Added tokens' texts, lowercased: a text holding one goes to the library. */
  readonly #added: string[];
  /** The hash of each prefix of the piece being looked up (#word), reused. */
  readonly #prefixHashes: Int32Array;

  private constructor(pieces: PieceTable, lowercase: boolean, unkId: number, maxWordChars: number, added: string[]) {
    this.#pieces = pieces;
    this.#lowercase = lowercase;
    this.#unkId = unkId;
    this.#maxWordChars = maxWordChars;
    this.#added = added;
    this.#prefixHashes = new Int32Array(Math.max(1, pieces.maxChars));
  }

  /** The fast path for this tokenizer.json, or null where its pipeline is not the plain BERT one. */
  static forTokenizerJson(json: Json, vocab: TokenLookup): AsciiWordPiece | null {
    const { normalizer, pre_tokenizer: pre, model } = json;
    if (!isObj(pre) || pre.type !== 'BertPreTokenizer') return null;
    if (!isObj(model) || model.type !== 'WordPiece' || !isObj(model.vocab) || model.fuse_unk === true) return null;
    let lowercase = false;
    if (normalizer !== null && normalizer !== undefined) {
      if (!isObj(normalizer) || normalizer.type !== 'BertNormalizer') return null;
      lowercase = Boolean(normalizer.lowercase); // as the library reads it (truthy)
    }
    const { unk_token: unk, continuing_subword_prefix: prefix, max_input_chars_per_word: maxWordChars = 100 } = model;
    const unkId = typeof unk === 'string' ? vocab.token_to_id(unk) : undefined;
    if (unkId === undefined || typeof prefix !== 'string' || typeof maxWordChars !== 'number') return null;
    const added = Array.isArray(json.added_tokens) ? json.added_tokens.map((t: unknown) => (isObj(t) ? String(t.content) : '')) : [];
    // An added token written as a continuation piece could map a piece to another id than the vocabulary's.
    if (added.some((t) => t === '' || t.toLowerCase().startsWith(prefix))) return null;
    const tokens = function* (): Generator<[string, number]> {
      for (const token of [...Object.keys(model.vocab as Json), ...added]) {
        const id = vocab.token_to_id(token); // the library's id: an added token's where it overrides
        if (id !== undefined) yield [token, id];
      }
    };
    return new AsciiWordPiece(new PieceTable(tokens(), prefix), lowercase, unkId, maxWordChars, added.map((t) => t.toLowerCase()));
  }

  /** Whether ids(text) answers (not null): the inline rule weighs such a text at ASCII_PACE. */
  takes(text: string): boolean {
    return !HANDED_BACK.test(text) && !this.#holdsAddedToken(text.toLowerCase());
  }

  /** Ids of one text, no special tokens; null where the library must answer (see the header). */
  ids(text: string): number[] | null {
    const seen = this.#lowercase ? text.toLowerCase() : text;
    if (this.#holdsAddedToken(this.#lowercase ? seen : text.toLowerCase())) return null;
    const out: number[] = [];
    let wordStart = -1;
    for (let i = 0; i < seen.length; i++) {
      const c = seen.charCodeAt(i);
      const cls = c < 128 ? ASCII_CLASS[c]! : 0;
      if (cls === WORD) {
        if (wordStart < 0) wordStart = i;
        continue;
      }
      if (wordStart >= 0) this.#word(seen, wordStart, i, out);
      wordStart = -1;
      if (cls === PUNCT) this.#word(seen, i, i + 1, out);
      else if (cls === 0) return null;
    }
    if (wordStart >= 0) this.#word(seen, wordStart, seen.length, out);
    return out;
  }

  #holdsAddedToken(lower: string): boolean {
    for (const token of this.#added) if (lower.includes(token)) return true;
    return false;
  }

  /** WordPiece on text[from, to): greedy longest match first; a word it cannot cover whole is one [UNK]. */
  #word(text: string, from: number, to: number, out: number[]): void {
    if (to - from > this.#maxWordChars) {
      out.push(this.#unkId);
      return;
    }
    const mark = out.length;
    const hashes = this.#prefixHashes;
    for (let start = from; start < to; ) {
      // The hash of every prefix of text[start, limit), then the longest that is a piece.
      const limit = Math.min(to, start + this.#pieces.maxChars);
      const continuation = start !== from;
      let hash = continuation ? CONTINUATION_SEED : INITIAL_SEED;
      for (let i = start; i < limit; i++) hashes[i - start] = hash = hashStep(hash, text.charCodeAt(i));
      let end = limit;
      let id = -1;
      for (; end > start; end--) {
        id = this.#pieces.find(hashes[end - start - 1]!, text, start, end, continuation);
        if (id >= 0) break;
      }
      if (id < 0) {
        out.length = mark;
        out.push(this.#unkId);
        return;
      }
      out.push(id);
      start = end;
    }
  }
}
