/**
 * The gateway's tokenizer: a Hugging Face `tokenizer.json` (BERT-style, WordPiece)
 * run by `@huggingface/tokenizers`, the pure-JS port of HF tokenizers.
 *
 * Why the JS library and not the Rust `tokenizers` N-API binding: see
 * docs/tokenizer.md. In short: on short texts (the request path) it is faster,
 * it is synchronous (the Rust binding only has a Promise API, so `encode` could
 * not be synchronous at all), it is 0.6 MB with no native binary instead of 64 MB
 * of prebuilt .node files, and its ids are identical to the Rust library's.
 *
 * The library produces the token ids of each sequence; special tokens, type ids
 * and truncation are done here from the tokenizer.json's post_processor, the way
 * the Rust library does them (TemplateProcessing / BertProcessing /
 * RobertaProcessing, truncation strategy longest_first, direction right, stride 0),
 * because the JS library does not truncate.
 */
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import { InputTooLongError } from '../../shared/errors.js';
import type { ModelSpec } from '../../shared/model-format/model-config.js';
import { TokenAligner } from './token-offsets.js';
import { ASCII_PACE, AsciiWordPiece } from './wordpiece-ascii.js';
import { overlapFor, windowStarts } from './windows.js';

/** One encoded input. Includes the special tokens ([CLS]/[SEP]); `ids.length` is the token count. */
export interface Encoding {
  ids: Int32Array;
  typeIds: Int32Array;
  truncated: boolean;
}

/**
 * One token of a text as TEI's /tokenize reports it: `start`/`stop` are
 * offsets in code points into the text (src/core/tokenizer/token-offsets.ts), null
 * for special tokens the template added (and where no offsets are known).
 */
export interface TokenSpan {
  id: number;
  /** The text the token covers (the token itself for special tokens). */
  text: string;
  special: boolean;
  start: number | null;
  stop: number | null;
}

/** Which end of a too-long input is cut: the end (`right`, the default, as in HF tokenizers) or the start. */
export type TruncationDirection = 'right' | 'left';

/** `maxLength` counts special tokens. Too long and `!truncate` -> InputTooLongError; with it, cut on `direction`'s side. */
export interface EncodeOptions {
  maxLength: number;
  truncate: boolean;
  direction?: TruncationDirection | undefined;
  /** encodePair: the most tokens of the first and of the second text kept (their first ones), before maxLength applies (Cohere's max_tokens_per_doc, vLLM's max_tokens_per_query). */
  maxFirst?: number | undefined;
  maxSecond?: number | undefined;
}

export interface PairWindowOptions {
  maxLength: number;
  maxInputTokens: number;
  overlap: number;
  maxWindows?: number | undefined;
  /** The most tokens of the document kept (its first ones) before it is cut into windows (Cohere's max_tokens_per_doc). */
  maxSecond?: number | undefined;
}

export interface TextTokenizer {
  /** Synchronous: for short single texts on the request path. */
  encode(text: string, opts: EncodeOptions): Encoding;
  /** Same result as `encode` on each text; yields to the event loop every few ms of work. Rejects on the first error. */
  encodeBatch(texts: string[], opts: EncodeOptions): Promise<Encoding[]> | Encoding[];
  /** [CLS] a [SEP] b [SEP], typeIds 0.. then 1..; truncation cuts the longer side first (longest_first). */
  encodePair?(a: string, b: string, opts: EncodeOptions): Encoding;
  /**
   * What tokenizing `text` costs, in characters at the library's pace: its length, or 1/ASCII_PACE
   * of it where the ASCII fast path takes it. The inline rule (--inline-tokenize-chars) counts this.
   */
  paceChars(text: string): number;
  /** Token ids back to text. `skipSpecial` (default false, as in HF) drops special tokens ([CLS], [SEP], [PAD], [UNK], ...). */
  decode(ids: ArrayLike<number>, skipSpecial?: boolean): string;
  /** The special tokens the template puts before and after one text (long inputs' windows repeat them). */
  readonly around?: { lead: number; trail: number };
  /**
   * A (query, document) pair as windows of at most `maxLength` tokens (long-inputs.ts): the query
   * in each (at most half the room), the document's tokens in consecutive windows, each repeating
   * `overlap` of the one before (at most half), at most `maxWindows`. One window when the pair fits.
   * Longer than `maxInputTokens` in all: InputTooLongError.
   */
  encodePairWindows?(first: string, second: string, opts: PairWindowOptions): Encoding[];
  /** Every token of one text with its offsets, the single-sequence template's special tokens around them if `addSpecialTokens`. No truncation. */
  tokenize?(text: string, addSpecialTokens: boolean): TokenSpan[];
  readonly vocabSize: number;
}

// ------------------------------------------------------------ post-processor templates

/** One element of a template: a run of special-token ids, or sequence A/B; each with its type id. */
type Piece = { kind: 'special'; ids: readonly number[]; typeId: number } | { kind: 'seq'; seq: 0 | 1; typeId: number };

interface Template {
  single: Piece[];
  pair: Piece[];
}

type Json = Record<string, unknown>;

function isObj(x: unknown): x is Json {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

function fail(path: string, why: string): never {
  throw new Error(`tokenizer.json (${path}): ${why}`);
}

function parseTemplatePieces(raw: unknown, specials: Map<string, number[]>, path: string): Piece[] {
  if (!Array.isArray(raw)) fail(path, 'template must be an array');
  return raw.map((p: unknown): Piece => {
    if (isObj(p) && isObj(p.SpecialToken)) {
      const id = String(p.SpecialToken.id);
      const ids = specials.get(id);
      if (!ids) fail(path, `special token ${id} is not in special_tokens`);
      return { kind: 'special', ids, typeId: Number(p.SpecialToken.type_id ?? 0) };
    }
    if (isObj(p) && isObj(p.Sequence)) {
      const id = p.Sequence.id;
      if (id !== 'A' && id !== 'B') fail(path, `unknown sequence id ${String(id)}`);
      return { kind: 'seq', seq: id === 'A' ? 0 : 1, typeId: Number(p.Sequence.type_id ?? 0) };
    }
    fail(path, `unknown template piece ${JSON.stringify(p)}`);
  });
}

function specialPair(raw: unknown, path: string): number {
  // BertProcessing / RobertaProcessing store [token, id]
  if (!Array.isArray(raw) || raw.length !== 2 || typeof raw[1] !== 'number') fail(path, 'expected [token, id]');
  return raw[1];
}

/** The special-token template the tokenizer.json's post_processor applies. */
function templateFrom(post: unknown): Template {
  const special = (ids: number[], typeId = 0): Piece => ({ kind: 'special', ids, typeId });
  const A: Piece = { kind: 'seq', seq: 0, typeId: 0 };
  if (post === null || post === undefined) return { single: [A], pair: [A, { kind: 'seq', seq: 1, typeId: 1 }] };
  if (!isObj(post)) fail('post_processor', 'expected an object');
  switch (post.type) {
    case 'TemplateProcessing': {
      const specials = new Map<string, number[]>();
      if (isObj(post.special_tokens)) {
        for (const [k, v] of Object.entries(post.special_tokens)) {
          if (!isObj(v) || !Array.isArray(v.ids)) fail('post_processor.special_tokens', `bad entry ${k}`);
          specials.set(k, v.ids.map(Number));
        }
      }
      return {
        single: parseTemplatePieces(post.single, specials, 'post_processor.single'),
        pair: parseTemplatePieces(post.pair, specials, 'post_processor.pair'),
      };
    }
    case 'BertProcessing': {
      const cls = specialPair(post.cls, 'post_processor.cls');
      const sep = specialPair(post.sep, 'post_processor.sep');
      return {
        single: [special([cls]), A, special([sep])],
        pair: [special([cls]), A, special([sep]), { kind: 'seq', seq: 1, typeId: 1 }, special([sep], 1)],
      };
    }
    case 'RobertaProcessing': {
      const cls = specialPair(post.cls, 'post_processor.cls');
      const sep = specialPair(post.sep, 'post_processor.sep');
      // <s> A </s> </s> B </s>, all type id 0 (checked against the Rust library)
      return {
        single: [special([cls]), A, special([sep])],
        pair: [special([cls]), A, special([sep]), special([sep]), { kind: 'seq', seq: 1, typeId: 0 }, special([sep])],
      };
    }
    case 'ByteLevel':
      // only touches offsets: no special tokens
      return templateFrom(null);
    case 'Sequence': {
      const parts = Array.isArray(post.processors) ? post.processors.filter((p) => !(isObj(p) && p.type === 'ByteLevel')) : [];
      if (parts.length > 1) fail('post_processor', 'Sequence with more than one token-adding processor is not supported');
      return templateFrom(parts[0] ?? null);
    }
    default:
      fail('post_processor', `unsupported type ${String(post.type)}`);
  }
}

function specialCount(pieces: readonly Piece[]): number {
  let n = 0;
  for (const p of pieces) if (p.kind === 'special') n += p.ids.length;
  return n;
}

// ------------------------------------------------------------ truncation

function checkMaxLength(maxLength: number): void {
  if (!Number.isInteger(maxLength) || maxLength < 1) throw new RangeError(`maxLength must be a positive integer, got ${maxLength}`);
}

/**
 * Lengths to keep of a pair (n1 = first, n2 = second) within `budget` tokens
 * (max length less the special tokens): HF tokenizers' longest_first
 * (tokenizers/src/utils/truncation.rs). The shorter side is kept whole when the
 * longer one can absorb the cut; otherwise the budget is halved, the odd token
 * going to the longer side (to the second on a tie).
 *
 * The Rust library (checked: tokenizers 0.23.2 for Node) first caps each sequence
 * at the full maxLength before this split, which changes who gets the odd token
 * when both sides are longer than maxLength; `cap` reproduces that. (Checked
 * exhaustively on plain texts. When a text spells out special tokens, e.g.
 * "[MASK]", the binary's pre-truncation can give that odd token to the other side.)
 */
function longestFirst(len1: number, len2: number, budget: number, cap: number): [number, number] {
  let n1 = Math.min(len1, cap);
  let n2 = Math.min(len2, cap);
  if (n1 + n2 <= budget) return [n1, n2];
  const swap = n1 > n2;
  if (swap) [n1, n2] = [n2, n1];
  // n1 is the shorter; keep it whole when the longer one can absorb the cut
  n2 = n1 > budget ? n1 : Math.max(n1, budget - n1);
  if (n1 + n2 > budget) {
    n1 = Math.floor(budget / 2);
    n2 = n1 + (budget % 2);
  }
  return swap ? [n2, n1] : [n1, n2];
}

function assemble(pieces: readonly Piece[], seqs: readonly number[][], keep: readonly number[], truncated: boolean): Encoding {
  let n = 0;
  for (const p of pieces) n += p.kind === 'special' ? p.ids.length : keep[p.seq]!;
  const ids = new Int32Array(n);
  const typeIds = new Int32Array(n);
  let o = 0;
  for (const p of pieces) {
    if (p.kind === 'special') {
      for (const id of p.ids) {
        ids[o] = id;
        typeIds[o++] = p.typeId;
      }
    } else {
      const s = seqs[p.seq]!;
      const k = keep[p.seq]!;
      for (let i = 0; i < k; i++) {
        ids[o] = s[i]!;
        typeIds[o++] = p.typeId;
      }
    }
  }
  return { ids, typeIds, truncated };
}

// ------------------------------------------------------------ the tokenizer

const YIELD_EVERY_MS = 4;

class HfJsTokenizer implements TextTokenizer {
  readonly vocabSize: number;
  readonly #tok: HfTokenizer;
  readonly #template: Template;
  readonly #singleSpecials: number;
  readonly #pairSpecials: number;
  readonly #cleanUpSpaces: boolean;
  readonly #aligner: TokenAligner | null;
  /** The BERT pipeline on ASCII texts, where this tokenizer.json is one (wordpiece-ascii.ts); null: the library always. */
  readonly #ascii: AsciiWordPiece | null;
  /** sentence_bert_config.json's do_lower_case: every text lowercased before the tokenizer, as sentence-transformers does. */
  readonly #lowercase: boolean;

  constructor(json: Json, cleanUpSpaces: boolean, lowercase: boolean, asciiFastPath: boolean) {
    // config {}: encoding then depends only on tokenizer.json (as with the Rust library)
    this.#tok = new HfTokenizer(json, {});
    this.#template = templateFrom(json.post_processor);
    this.#singleSpecials = specialCount(this.#template.single);
    this.#pairSpecials = specialCount(this.#template.pair);
    this.#cleanUpSpaces = cleanUpSpaces;
    this.vocabSize = this.#tok.get_vocab(true).size;
    this.#aligner = TokenAligner.forTokenizerJson(json);
    this.#ascii = asciiFastPath ? AsciiWordPiece.forTokenizerJson(json, this.#tok) : null;
    this.#lowercase = lowercase;
  }

  tokenize(text: string, addSpecialTokens: boolean): TokenSpan[] {
    if (typeof text !== 'string') throw new TypeError('text must be a string');
    const seen = this.#lowercase ? text.toLowerCase() : text;
    const enc = this.#tok.encode(seen, { add_special_tokens: false }) as { ids: number[]; tokens: string[] };
    const { ids, tokens } = enc;
    const spans = this.#aligner?.align(seen, tokens) ?? tokens.map(() => null);
    // Offsets are into the text as the tokenizer saw it; lowercasing keeps them (and the text a
    // token covers is shown as sent) unless it changed the length (İ -> i̇: then as seen).
    const chars = Array.from(text);
    const seenChars = seen === text ? chars : Array.from(seen);
    const shown = seenChars.length === chars.length ? chars : seenChars;
    const body: TokenSpan[] = ids.map((id, i) => {
      const span = spans[i] ?? null;
      return span
        ? { id, text: shown.slice(span[0], span[1]).join(''), special: false, start: span[0], stop: span[1] }
        : { id, text: tokens[i]!, special: false, start: null, stop: null };
    });
    if (!addSpecialTokens) return body;
    const out: TokenSpan[] = [];
    for (const p of this.#template.single) {
      if (p.kind === 'seq') for (const t of body) out.push(t); // not push(...body): a long text overflows the stack
      else for (const id of p.ids) out.push({ id, text: this.#tok.id_to_token(id) ?? '', special: true, start: null, stop: null });
    }
    return out;
  }

  /** Ids of one sequence, no special tokens. */
  #ids(text: string): number[] {
    if (typeof text !== 'string') throw new TypeError('text must be a string');
    const seen = this.#lowercase ? text.toLowerCase() : text;
    return this.#ascii?.ids(seen) ?? this.#tok.encode(seen, { add_special_tokens: false }).ids;
  }

  paceChars(text: string): number {
    return this.#ascii?.takes(this.#lowercase ? text.toLowerCase() : text) ? Math.ceil(text.length / ASCII_PACE) : text.length;
  }

  encode(text: string, opts: EncodeOptions): Encoding {
    checkMaxLength(opts.maxLength);
    const a = this.#ids(text);
    const total = a.length + this.#singleSpecials;
    if (total <= opts.maxLength) return assemble(this.#template.single, [a], [a.length], false);
    if (!opts.truncate) throw new InputTooLongError(total, opts.maxLength);
    const budget = opts.maxLength - this.#singleSpecials;
    if (budget < 0) throw new RangeError(`maxLength ${opts.maxLength} is shorter than the ${this.#singleSpecials} special tokens`);
    // Cut from the left: the last tokens stay, the special tokens go around them as ever.
    return assemble(this.#template.single, [opts.direction === 'left' ? a.slice(a.length - budget) : a], [budget], true);
  }

  encodePair(first: string, second: string, opts: EncodeOptions): Encoding {
    checkMaxLength(opts.maxLength);
    const a = this.#ids(first);
    const b = this.#ids(second);
    const la = Math.min(a.length, opts.maxFirst ?? Infinity);
    const lb = Math.min(b.length, opts.maxSecond ?? Infinity);
    const total = la + lb + this.#pairSpecials;
    if (total <= opts.maxLength) return assemble(this.#template.pair, [a, b], [la, lb], la < a.length || lb < b.length);
    if (!opts.truncate) throw new InputTooLongError(total, opts.maxLength);
    const budget = opts.maxLength - this.#pairSpecials;
    if (budget < 0) throw new RangeError(`maxLength ${opts.maxLength} is shorter than the ${this.#pairSpecials} special tokens`);
    return assemble(this.#template.pair, [a, b], longestFirst(la, lb, budget, opts.maxLength), true);
  }

  get around(): { lead: number; trail: number } {
    const pieces = this.#template.single;
    const at = pieces.findIndex((p) => p.kind === 'seq');
    return { lead: specialCount(pieces.slice(0, at)), trail: specialCount(pieces.slice(at + 1)) };
  }

  encodePairWindows(first: string, second: string, opts: PairWindowOptions): Encoding[] {
    checkMaxLength(opts.maxLength);
    const a = this.#ids(first);
    const b = this.#ids(second);
    const lb = Math.min(b.length, opts.maxSecond ?? Infinity);
    const budget = opts.maxLength - this.#pairSpecials;
    if (a.length + lb <= budget) return [assemble(this.#template.pair, [a, b], [a.length, lb], lb < b.length)];
    const total = a.length + lb + this.#pairSpecials;
    if (total > opts.maxInputTokens) throw new InputTooLongError(total, opts.maxInputTokens);
    const la = Math.min(a.length, Math.floor(budget / 2));
    const body = budget - la;
    return windowStarts(lb, body, overlapFor(opts.overlap, body), opts.maxWindows).map((s) => {
      const len = Math.min(body, lb - s);
      return assemble(this.#template.pair, [a, b.slice(s, s + len)], [la, len], la < a.length);
    });
  }

  async encodeBatch(texts: string[], opts: EncodeOptions): Promise<Encoding[]> {
    const out: Encoding[] = new Array(texts.length);
    let slice = performance.now();
    for (let i = 0; i < texts.length; i++) {
      out[i] = this.encode(texts[i]!, opts);
      // long batches would hold the event loop for tens of ms: give it back every few ms
      if (performance.now() - slice > YIELD_EVERY_MS && i + 1 < texts.length) {
        await new Promise<void>((resolve) => setImmediate(resolve));
        slice = performance.now();
      }
    }
    return out;
  }

  decode(ids: ArrayLike<number>, skipSpecial = false): string {
    const list = Array.from(ids, Number);
    if (list.length === 0) return '';
    return this.#tok.decode(list, { skip_special_tokens: skipSpecial, clean_up_tokenization_spaces: this.#cleanUpSpaces });
  }
}

export interface TokenizerOptions {
  /** decode: transformers' clean-up of spaces before punctuation (tokenizer_config.json's clean_up_tokenization_spaces). */
  cleanUpTokenizationSpaces?: boolean;
  /** Lowercase every text first (sentence_bert_config.json's do_lower_case, over a tokenizer that does not itself). */
  lowercase?: boolean;
  /** false: every text through the library, never wordpiece-ascii.ts (the bench's comparison). Default true. */
  asciiFastPath?: boolean;
}

/** Build a tokenizer from tokenizer.json content already in memory. */
export function createTokenizer(tokenizerJson: object, options: TokenizerOptions = {}): TextTokenizer {
  if (!isObj(tokenizerJson) || !isObj(tokenizerJson.model)) throw new Error('tokenizer.json: no model');
  return new HfJsTokenizer(tokenizerJson, options.cleanUpTokenizationSpaces ?? false, options.lowercase ?? false, options.asciiFastPath ?? true);
}

/** A model's tokenizer, as its folder asks for it (lowercasing with do_lower_case). */
export function loadModelTokenizer(spec: Pick<ModelSpec, 'tokenizerPath' | 'lowercase'>): Promise<TextTokenizer> {
  return loadTokenizer(spec.tokenizerPath, { lowercase: spec.lowercase });
}

/**
 * Tokenizers loaded in this thread, by what they are built from: the tokenizer.json's content
 * (its hash) and the clean-up and lowercase flags. Models that ship the same tokenizer.json (fine-tunes of one
 * base model: the three default models do) share one instance instead of a copy each; a copy of
 * the default 30522-token WordPiece vocabulary costs megabytes of RSS in each thread that loads it
 * (docs/tuning.md, Memory, has the figures). Sharing is safe: encoding depends on the tokenizer alone, the max
 * length is each call's. Held weakly, so a tokenizer nobody uses any more (a closed engine) is
 * still collected.
 */
const loaded = new Map<string, WeakRef<TextTokenizer>>();
const unloaded = new FinalizationRegistry<string>((key) => {
  if (loaded.get(key)?.deref() === undefined) loaded.delete(key);
});

/**
 * Load a Hugging Face tokenizer.json. A tokenizer_config.json next to it is read
 * for `clean_up_tokenization_spaces` only (decode: "don ' t" -> "don't", as
 * transformers does); without one, decode matches the Rust library (no clean-up
 * beyond the decoder's own). A tokenizer.json identical to one already loaded
 * in this thread (with the same clean-up and lowercase flags) gives that same instance.
 */
export async function loadTokenizer(tokenizerJsonPath: string, options: Pick<TokenizerOptions, 'lowercase'> = {}): Promise<TextTokenizer> {
  const lowercase = options.lowercase ?? false;
  const text = await readFile(tokenizerJsonPath, 'utf8');
  let cleanUp = false;
  const configPath = join(dirname(tokenizerJsonPath), 'tokenizer_config.json');
  if (existsSync(configPath)) {
    try {
      const config: unknown = JSON.parse(readFileSync(configPath, 'utf8'));
      if (isObj(config) && typeof config.clean_up_tokenization_spaces === 'boolean') cleanUp = config.clean_up_tokenization_spaces;
    } catch {
      // a broken config only affects decode spacing: ignore it
    }
  }
  const key = `${createHash('sha256').update(text).digest('hex')} ${cleanUp} ${lowercase}`;
  const shared = loaded.get(key)?.deref();
  if (shared) return shared;
  const json: unknown = JSON.parse(text);
  if (!isObj(json)) throw new Error(`${tokenizerJsonPath}: not a tokenizer.json object`);
  let tokenizer: TextTokenizer;
  try {
    tokenizer = createTokenizer(json, { cleanUpTokenizationSpaces: cleanUp, lowercase });
  } catch (err) {
    throw new Error(`${tokenizerJsonPath}: ${(err as Error).message}`, { cause: err });
  }
  loaded.set(key, new WeakRef(tokenizer));
  unloaded.register(tokenizer, key);
  return tokenizer;
}
