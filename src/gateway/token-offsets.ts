/**
 * Character offsets of tokens in the text they came from: what TEI's
 * /tokenize answers (`start`, `stop`). `@huggingface/tokenizers` gives token
 * strings but no offsets, so they are recovered here by aligning the tokens
 * with the text: each character of the input is normalised on its own the
 * way the tokenizer.json's normalizer does (BERT: control characters
 * dropped, whitespace to a space, CJK characters spaced, lowercased, accents
 * stripped), remembering which input character every normalised character
 * came from, then the tokens are matched one after the other against the
 * normalised text (a `##` piece continues the word; `[UNK]` spans the rest
 * of its word, as WordPiece gives one `[UNK]` per word).
 *
 * Offsets count Unicode code points (as Python's `str` and HF tokenizers'
 * char offsets do), not UTF-16 units and not bytes: for text outside the
 * Basic Multilingual Plane (emoji), `Array.from(text).slice(start, stop)` is
 * the token's text, not `text.slice(start, stop)`.
 *
 * Limits: normalizers other than BertNormalizer, Lowercase, StripAccents,
 * NFD/NFKD/NFC/NFKC, Strip and a Sequence of those are not modelled: such a
 * tokenizer gets no offsets (null). Normalising one character at a time
 * differs from normalising the whole text only in context-dependent case
 * rules (a final Greek sigma); a token that cannot be matched gets null
 * offsets and the alignment picks up again at the next one.
 */

type Json = Record<string, unknown>;

const isObj = (x: unknown): x is Json => typeof x === 'object' && x !== null && !Array.isArray(x);

/** One character (code point) of input in, zero or more characters out. */
type CharMap = (c: string) => string;

// The tests the JS library's BertNormalizer and BertPreTokenizer use, so the alignment sees what it saw.
const CONTROL = /^(?:\p{Cc}|\p{Cf}|\p{Co}|\p{Cs})$/u;
const WHITESPACE = /^\s$/u;
const PUNCTUATION = /^[\p{P}\u0021-\u002F\u003A-\u0040\u005B-\u0060\u007B-\u007E]$/u;
const MARK_MN = /\p{Mn}/gu;
const MARK_M = /\p{M}/gu;

function isChinese(cp: number): boolean {
  return (
    (cp >= 0x4e00 && cp <= 0x9fff) ||
    (cp >= 0x3400 && cp <= 0x4dbf) ||
    (cp >= 0x20000 && cp <= 0x2a6df) ||
    (cp >= 0x2a700 && cp <= 0x2b73f) ||
    (cp >= 0x2b740 && cp <= 0x2b81f) ||
    (cp >= 0x2b820 && cp <= 0x2ceaf) ||
    (cp >= 0xf900 && cp <= 0xfaff) ||
    (cp >= 0x2f800 && cp <= 0x2fa1f)
  );
}

function bertNormalizer(cfg: Json): CharMap {
  const clean = cfg.clean_text !== false;
  const chinese = cfg.handle_chinese_chars !== false;
  const lowercase = cfg.lowercase !== false;
  const strip = lowercase ? cfg.strip_accents !== false : cfg.strip_accents === true;
  return (c) => {
    if (clean) {
      const cp = c.charCodeAt(0);
      if (cp === 0 || cp === 0xfffd || (c !== '\t' && c !== '\n' && c !== '\r' && CONTROL.test(c))) return '';
      if (WHITESPACE.test(c)) return ' ';
    }
    // the JS library tests each UTF-16 unit: characters outside the BMP are never spaced
    if (chinese && c.length === 1 && isChinese(c.charCodeAt(0))) return ` ${c} `;
    let out = c;
    if (lowercase) out = out.toLowerCase();
    if (strip) out = out.normalize('NFD').replace(MARK_MN, '');
    return out;
  };
}

/** The normalizer as a per-character map, or null when it is not one we model. */
function charMapOf(normalizer: unknown): CharMap | null {
  if (normalizer === null || normalizer === undefined) return (c) => c;
  if (!isObj(normalizer)) return null;
  switch (normalizer.type) {
    case 'BertNormalizer':
      return bertNormalizer(normalizer);
    case 'Lowercase':
      return (c) => c.toLowerCase();
    case 'StripAccents':
      return (c) => c.replace(MARK_M, '');
    case 'NFD':
    case 'NFKD':
    case 'NFC':
    case 'NFKC': {
      const form = normalizer.type;
      return (c) => c.normalize(form);
    }
    case 'Strip':
      return (c) => c; // only trims the ends, which no token covers
    case 'Sequence': {
      const parts = Array.isArray(normalizer.normalizers) ? normalizer.normalizers.map(charMapOf) : [null];
      if (parts.some((p) => p === null)) return null;
      const maps = parts as CharMap[];
      return (c) => {
        let chars = [c];
        for (const m of maps) chars = chars.flatMap((x) => Array.from(m(x)));
        return chars.join('');
      };
    }
    default:
      return null;
  }
}

/** The normalised text, one entry per normalised code point, with the input code point it came from. */
interface Normalized {
  chars: string[];
  from: Int32Array;
}

/** Distinct characters whose normalisation an aligner remembers. */
const CACHE_LIMIT = 4096;

/** Offsets in code points of each token, null where a token could not be placed. */
export type Span = [number, number] | null;

export class TokenAligner {
  readonly #map: CharMap;
  readonly #prefix: string;
  readonly #unk: string;
  /** Added tokens (e.g. [MASK]) as the normalised text spells them. */
  readonly #added = new Map<string, string[]>();
  /** Normalisation of characters seen before: a text repeats few distinct characters. */
  readonly #cache = new Map<string, string[]>();

  private constructor(map: CharMap, prefix: string, unk: string, added: string[]) {
    this.#map = map;
    this.#prefix = prefix;
    this.#unk = unk;
    for (const a of added) this.#added.set(a, this.#normalize(a).chars);
  }

  /** An aligner for a tokenizer.json, or null when its normalizer is not one we model. */
  static forTokenizerJson(json: Json): TokenAligner | null {
    const map = charMapOf(json.normalizer);
    if (!map) return null;
    const model = isObj(json.model) ? json.model : {};
    const prefix = typeof model.continuing_subword_prefix === 'string' ? model.continuing_subword_prefix : '##';
    const unk = typeof model.unk_token === 'string' ? model.unk_token : '[UNK]';
    const added = Array.isArray(json.added_tokens) ? json.added_tokens.filter(isObj).map((t) => String(t.content)) : [];
    return new TokenAligner(map, prefix, unk, added);
  }

  #normalize(text: string): Normalized {
    const chars: string[] = [];
    const from: number[] = [];
    let i = 0;
    for (const c of text) {
      let out = this.#cache.get(c);
      if (out === undefined) {
        out = Array.from(this.#map(c));
        if (this.#cache.size < CACHE_LIMIT) this.#cache.set(c, out);
      }
      for (const n of out) {
        chars.push(n);
        from.push(i);
      }
      i++;
    }
    return { chars, from: Int32Array.from(from) };
  }

  /** Where each token of `tokens` (the tokenizer's output for `text`, no special tokens) lies in `text`. */
  align(text: string, tokens: readonly string[]): Span[] {
    const norm = this.#normalize(text);
    const { chars } = norm;
    const n = chars.length;
    const spans: Span[] = [];
    let pos = 0;
    const skipSpace = (p: number) => {
      while (p < n && (chars[p] === ' ' || WHITESPACE.test(chars[p]!))) p++;
      return p;
    };
    const matchesAt = (p: number, piece: readonly string[]) => {
      if (piece.length === 0 || p + piece.length > n) return false;
      for (let k = 0; k < piece.length; k++) if (!sameChar(chars[p + k]!, piece[k]!)) return false;
      return true;
    };
    const span = (p: number, len: number): Span => [norm.from[p]!, norm.from[p + len - 1]! + 1];

    for (const token of tokens) {
      if (token === this.#unk && !matchesAt(skipSpace(pos), this.#added.get(token) ?? [])) {
        // one [UNK] per word (not "[UNK]" spelt out in the text): the rest of the word, or one punctuation mark
        const p = skipSpace(pos);
        if (p >= n) {
          spans.push(null);
          continue;
        }
        let end = p + 1;
        if (!PUNCTUATION.test(chars[p]!)) while (end < n && !WHITESPACE.test(chars[end]!) && !PUNCTUATION.test(chars[end]!)) end++;
        spans.push(span(p, end - p));
        pos = end;
        continue;
      }
      const continuing = token.length > this.#prefix.length && token.startsWith(this.#prefix);
      const candidates: string[][] = [];
      const added = this.#added.get(token);
      if (added) candidates.push(added);
      if (continuing) candidates.push(Array.from(token.slice(this.#prefix.length)));
      candidates.push(Array.from(token));
      let placed = false;
      // a continuing piece follows the previous one directly; anything else may follow spaces
      for (const piece of candidates) {
        const p = continuing && piece !== candidates[candidates.length - 1] ? pos : skipSpace(pos);
        if (matchesAt(p, piece)) {
          spans.push(span(p, piece.length));
          pos = p + piece.length;
          placed = true;
          break;
        }
      }
      if (placed) continue;
      // out of step (a character normalised differently in context): look ahead for the token
      const piece = candidates[0]!;
      let found = -1;
      for (let p = pos; p + piece.length <= n && p < pos + 64; p++) {
        if (matchesAt(p, piece)) {
          found = p;
          break;
        }
      }
      if (found >= 0) {
        spans.push(span(found, piece.length));
        pos = found + piece.length;
      } else {
        spans.push(null);
      }
    }
    return spans;
  }
}

/** Equal, or the two lowercase sigmas (whole-text lowercasing picks the final form by context). */
function sameChar(a: string, b: string): boolean {
  return a === b || ((a === 'σ' || a === 'ς') && (b === 'σ' || b === 'ς'));
}
