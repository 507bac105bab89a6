/**
 * Character offsets of tokens in the text they came from: what TEI's
 * /tokenize answers (`start`, `stop`). `@huggingface/tokenizers` gives token
 * strings but no offsets, so they are recovered here: the text is normalised
 * a character at a time (with the marks after it where NFC/NFKC compose) as
 * the tokenizer.json's normalizer does, remembering which input character
 * each normalised one came from, then the tokens are matched one after the
 * other against it. Why not the Rust library's own offsets: docs/tokenizer.md.
 *
 * Offsets count Unicode code points (as Python's `str` and the Rust library's
 * do), not UTF-16 units and not bytes: `Array.from(text).slice(start, stop)`
 * is a token's text, not `text.slice(start, stop)`.
 *
 * Limits: a normalizer other than BertNormalizer, Lowercase, StripAccents,
 * NFD/NFKD/NFC/NFKC, Strip and a Sequence of those (Precompiled, Replace, ...)
 * is not modelled: such a tokenizer gets null offsets. Context-dependent case
 * rules (a final Greek sigma) are not seen a character at a time; a token
 * that cannot be matched gets null offsets and the alignment picks up again
 * at the next one.
 */

type Json = Record<string, unknown>;

const isObj = (x: unknown): x is Json => typeof x === 'object' && x !== null && !Array.isArray(x);

/**
 * A normalizer, one character (code point) in, zero or more out; `composes`
 * when it also joins a character with the combining marks after it (NFC,
 * NFKC: e + U+0301 is é), so it must see them together (`form`: which one;
 * `stages`: a Sequence's parts, in order).
 */
type CharMap = ((c: string) => string) & { composes?: boolean; form?: 'NFC' | 'NFKC'; stages?: CharMap[] };

/** What NFC/NFKC may join to the character before: marks, Hangul vowel and final jamo (and, for NFKC, their compatibility and halfwidth forms), halfwidth sound marks. */
const COMBINING = /^[\p{M}\u1161-\u1175\u11a8-\u11c2\u3131-\u318e\uff9e-\uffdc]$/u;

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
      return (c) => c.normalize(normalizer.type as string);
    case 'NFC':
    case 'NFKC': {
      const form = normalizer.type;
      return Object.assign((c: string) => c.normalize(form), { composes: true, form });
    }
    case 'Strip':
      return (c) => c; // only trims the ends, which no token covers
    case 'Sequence': {
      const parts = Array.isArray(normalizer.normalizers) ? normalizer.normalizers.map(charMapOf) : [null];
      if (parts.some((p) => p === null)) return null;
      const maps = parts as CharMap[];
      const composes = maps.some((m) => m.composes);
      // A composing sequence maps whole clusters: each part must take more than one character then.
      if (composes && (normalizer.normalizers as unknown[]).some((n) => isObj(n) && n.type === 'BertNormalizer')) return null;
      return Object.assign((c: string) => mapUnit(maps, [c]).chars.join(''), { composes, stages: maps });
    }
    default:
      return null;
  }
}

/** The normalised text, one entry per normalised code point, with the input code point it came from. */
interface Normalized {
  chars: string[];
  /** For each normalised character, the code point of the text it came from. */
  from: Int32Array;
}

/** Some characters' normalisation: for each normalised character, the index of the one it came from. */
interface Mapped {
  chars: string[];
  from: number[];
}

/** `unit` through a normalizer's stages, each normalised character traced back to its character of `unit`. */
function mapUnit(stages: readonly CharMap[], unit: readonly string[]): Mapped {
  let cur: Mapped = { chars: [...unit], from: unit.map((_, i) => i) };
  for (const stage of stages) {
    const next = stage.stages ? mapUnit(stage.stages, cur.chars) : stage.form ? composed(cur.chars, stage.form) : perChar(stage, cur.chars);
    const before = cur.from;
    cur = { chars: next.chars, from: next.from.map((f) => before[f]!) };
  }
  return cur;
}

/** A normalizer that takes one character at a time: what each gives comes from it. */
function perChar(map: CharMap, unit: readonly string[]): Mapped {
  const out: Mapped = { chars: [], from: [] };
  unit.forEach((c, i) => {
    for (const o of map(c)) {
      out.chars.push(o);
      out.from.push(i);
    }
  });
  return out;
}

/**
 * NFC or NFKC of `unit`, placed the way the Rust library places it: by
 * position, each normalised character taking as many characters of `unit` as
 * it holds first parts of their decompositions (é from e + U+0301: one; ো
 * from ে + া: one, the ে; a mark left apart: its own), one holding none (the
 * "i" of ﬁ) sharing the place of the character before.
 */
function composed(unit: readonly string[], form: 'NFC' | 'NFKC'): Mapped {
  const decompose = form === 'NFC' ? 'NFD' : 'NFKD';
  const pool: { cp: string; first: boolean }[] = [];
  for (const c of unit) Array.from(c.normalize(decompose), (cp, k) => pool.push({ cp, first: k === 0 }));
  const chars = Array.from(unit.join('').normalize(form));
  const from: number[] = [];
  let at = 0;
  for (const c of chars) {
    let firsts = 0;
    for (const cp of c.normalize(decompose)) {
      const k = pool.findIndex((p) => p.cp === cp);
      if (k >= 0 && pool.splice(k, 1)[0]!.first) firsts++;
    }
    from.push(Math.min(unit.length - 1, firsts > 0 ? at : Math.max(0, at - 1)));
    at += firsts;
  }
  return { chars, from };
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
  readonly #cache = new Map<string, Mapped>();

  /** Metaspace pre-tokenizers (SentencePiece layouts: XLM-RoBERTa's Unigram): the character that stands for a space. */
  readonly #metaspace: string | null;
  /** ByteLevel pre-tokenizers (byte-level BPE): each piece's characters stand for bytes of the UTF-8 text. */
  readonly #byteLevel: boolean;

  private constructor(map: CharMap, prefix: string, unk: string, added: string[], metaspace: string | null, byteLevel: boolean) {
    this.#map = map;
    this.#prefix = prefix;
    this.#unk = unk;
    this.#metaspace = metaspace;
    this.#byteLevel = byteLevel;
    for (const a of added) this.#added.set(a, this.#normalize(a).chars);
  }

  /** An aligner for a tokenizer.json, or null when its normalizer is not one we model. */
  static forTokenizerJson(json: Json): TokenAligner | null {
    const map = charMapOf(json.normalizer);
    if (!map) return null;
    const model = isObj(json.model) ? json.model : {};
    const prefix = typeof model.continuing_subword_prefix === 'string' ? model.continuing_subword_prefix : '##';
    const added = Array.isArray(json.added_tokens) ? json.added_tokens.filter(isObj).map((t) => String(t.content)) : [];
    const byteLevel = usesByteLevel(json.pre_tokenizer);
    const metaspace = byteLevel ? null : metaspaceOf(json.pre_tokenizer);
    if (metaspace === undefined) return null;
    return new TokenAligner(map, prefix, unkTokenOf(model), added, metaspace, byteLevel);
  }

  #normalize(text: string): Normalized {
    const chars: string[] = [];
    const from: number[] = [];
    const source = Array.from(text);
    for (let i = 0; i < source.length; ) {
      // One character, with the combining marks after it when the normalizer composes.
      let j = i + 1;
      if (this.#map.composes) while (j < source.length && COMBINING.test(source[j]!)) j++;
      const unit = j === i + 1 ? source[i]! : source.slice(i, j).join('');
      let out = this.#cache.get(unit);
      if (out === undefined) {
        out = mapUnit([this.#map], source.slice(i, j));
        if (this.#cache.size < CACHE_LIMIT) this.#cache.set(unit, out);
      }
      for (let k = 0; k < out.chars.length; k++) {
        chars.push(out.chars[k]!);
        from.push(i + out.from[k]!);
      }
      i = j;
    }
    return { chars, from: Int32Array.from(from) };
  }

  /** Where each token of `tokens` (the tokenizer's output for `text`, no special tokens) lies in `text`. */
  align(text: string, tokens: readonly string[]): Span[] {
    if (this.#byteLevel) return this.#alignBytes(text, tokens);
    if (this.#metaspace !== null) return this.#alignMetaspace(text, tokens, this.#metaspace);
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

  /**
   * A byte-level tokenizer's pieces: their characters are, in order, the
   * bytes of the normalised text's UTF-8 (GPT-2's byte-to-character table), so
   * each piece covers the characters its bytes belong to (a piece holding part
   * of a character covers that whole character, as the Rust library says).
   */
  #alignBytes(text: string, tokens: readonly string[]): Span[] {
    const norm = this.#normalize(text);
    const owner: number[] = []; // the source character of each byte
    norm.chars.forEach((c, k) => {
      for (let b = Buffer.byteLength(c, 'utf8'); b > 0; b--) owner.push(norm.from[k]!);
    });
    const spans: Span[] = [];
    let at = 0;
    for (const token of tokens) {
      const bytes = Array.from(token).length; // one character per byte
      if (bytes === 0 || at + bytes > owner.length) {
        spans.push(null);
        continue;
      }
      spans.push([owner[at]!, owner[at + bytes - 1]! + 1]);
      at += bytes;
    }
    return spans;
  }

  /**
   * A SentencePiece-layout tokenizer's pieces: a space is a piece's leading
   * `space` character, which covers the space it replaced (as the Rust
   * library's offsets do) or nothing where it was prepended to the text; every
   * other character is covered by exactly one piece. An unknown piece covers
   * what lies before the next piece.
   */
  #alignMetaspace(text: string, tokens: readonly string[], space: string): Span[] {
    const norm = this.#normalize(text);
    const { chars } = norm;
    const n = chars.length;
    const span = (p: number, len: number): Span => (len > 0 ? [norm.from[p]!, norm.from[p + len - 1]! + 1] : null);
    // Metaspace replaces the space character only (tabs and newlines stay text, often unknown).
    const isSpace = (p: number) => chars[p] === ' ';
    /** Where `token` matches at `p`: the characters it covers, or -1. */
    const coverAt = (p: number, token: string): number => {
      const piece = Array.from(token);
      let at = p;
      let k = 0;
      if (piece[0] === space) {
        if (isSpace(at)) at++;
        k = 1;
      }
      for (; k < piece.length; k++, at++) if (at >= n || !sameChar(chars[at]!, piece[k]!)) return -1;
      return at - p;
    };
    const spans: Span[] = [];
    let pos = 0;
    for (let t = 0; t < tokens.length; t++) {
      const token = tokens[t]!;
      if (token === this.#unk) {
        // Up to where the next known piece matches (or the end).
        const next = tokens.slice(t + 1).find((x) => x !== this.#unk);
        let end = pos + 1;
        if (next === undefined) end = n;
        else while (end < n && coverAt(end, next) < 0) end++;
        spans.push(span(pos, Math.min(end, n) - pos));
        pos = Math.min(end, n);
        continue;
      }
      const len = coverAt(pos, token);
      if (len < 0) {
        spans.push(null);
        continue;
      }
      // A lone prepended space covers nothing: the Rust library gives it the next character's start.
      spans.push(len === 0 ? span(pos, 1) : span(pos, len));
      pos += len;
    }
    return spans;
  }
}

/** Whether a pre-tokenizer (or one of a Sequence's) is ByteLevel. */
function usesByteLevel(pre: unknown): boolean {
  if (!isObj(pre)) return false;
  if (pre.type === 'ByteLevel') return true;
  return pre.type === 'Sequence' && Array.isArray(pre.pretokenizers) && pre.pretokenizers.some(usesByteLevel);
}

/** A Metaspace pre-tokenizer's replacement character; null without one; undefined for one we do not model. */
function metaspaceOf(pre: unknown): string | null | undefined {
  if (pre === null || pre === undefined || !isObj(pre)) return null;
  if (pre.type === 'Metaspace') return typeof pre.replacement === 'string' ? pre.replacement : '\u2581';
  if (pre.type === 'Sequence' && Array.isArray(pre.pretokenizers)) {
    const found = pre.pretokenizers.map(metaspaceOf);
    if (found.includes(undefined)) return undefined;
    return found.find((m) => typeof m === 'string') ?? null;
  }
  return null;
}

/** The unknown token's text: WordPiece's unk_token, Unigram's vocab[unk_id]. */
function unkTokenOf(model: Json): string {
  if (typeof model.unk_token === 'string') return model.unk_token;
  if (typeof model.unk_id === 'number' && Array.isArray(model.vocab)) {
    const entry: unknown = model.vocab[model.unk_id];
    if (Array.isArray(entry) && typeof entry[0] === 'string') return entry[0];
  }
  return '[UNK]';
}

/** Equal, or the two lowercase sigmas (whole-text lowercasing picks the final form by context). */
function sameChar(a: string, b: string): boolean {
  return a === b || ((a === 'σ' || a === 'ς') && (b === 'σ' || b === 'ς'));
}
