/**
 * The ASCII fast path of the BERT pipeline (src/core/tokenizer/wordpiece-ascii.ts) against
 * the library it stands in for and the Rust tokenizers library, on fresh random
 * texts (seed printed) built to hit its edges: case, every ASCII punctuation
 * character, tabs and newlines, runs of spaces, words past
 * max_input_chars_per_word, words the vocabulary cannot cover, added tokens,
 * and the characters it must hand back (controls, non-ASCII).
 */
import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import { beforeAll, describe, expect, it } from 'vitest';
import { Infer } from '../src/core/infer.js';
import { ModelRegistry } from '../src/core/model-registry.js';
import { type ServedModel } from '../src/core/served-model.js';
import { DEFAULTS } from '../src/shared/options.js';
import { createTokenizer, type EncodeOptions } from '../src/core/tokenizer/tokenizer.js';
import { CONTINUATION_SEED, hashStep, INITIAL_SEED, PieceTable } from '../src/core/tokenizer/piece-table.js';
import { ASCII_PACE, AsciiWordPiece } from '../src/core/tokenizer/wordpiece-ascii.js';
import { buildBertTokenizerJson } from '../models/generator/tokenizer-json.js';
import { makeRandom } from './helpers.js';

type Json = Record<string, unknown>;

const uncased = buildBertTokenizerJson() as Json;
const vocabOf = (json: Json) => (json.model as { vocab: Record<string, number> }).vocab;
const withModel = (json: Json, model: Json): Json => ({ ...json, model: { ...(json.model as Json), ...model } });
/** Cased: the normalizer keeps case, so capitalised words miss the uncased vocabulary (pieces or [UNK]). */
const cased: Json = { ...uncased, normalizer: { ...(uncased.normalizer as Json), lowercase: false } };
/** No normalizer at all. */
const bare: Json = { ...uncased, normalizer: null };
/** No token holds a 'z': every word with one is a single [UNK]. Short words: max_input_chars_per_word 12. */
const holey = withModel(uncased, {
  vocab: Object.fromEntries(Object.entries(vocabOf(uncased)).filter(([t]) => !t.includes('z'))),
  max_input_chars_per_word: 12,
});
const VARIANTS: Record<string, Json> = { uncased, cased, bare, holey };

const WORDS = Object.keys(vocabOf(uncased)).filter((w) => /^[a-z]{2,}$/.test(w));
const PUNCT = '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~';
const ADDED = ['[MASK]', '[SEP]', '[cls]', 'x[PAD]y'];

/** A text the fast path must answer: printable ASCII, tab, newline, return, and no added token. */
function asciiText(r: () => number): string {
  const pick = <T>(xs: ArrayLike<T>) => xs[Math.floor(r() * xs.length)]!;
  const parts: string[] = [];
  const n = Math.floor(r() * 30);
  for (let i = 0; i < n; i++) {
    const roll = r();
    let w = pick(WORDS);
    if (roll < 0.15) w = w[0]!.toUpperCase() + w.slice(1);
    else if (roll < 0.2) w = w.toUpperCase();
    else if (roll < 0.3) w += pick(WORDS) + pick(WORDS); // glued: pieces
    else if (roll < 0.35) w = pick(WORDS).repeat(20); // past any max_input_chars_per_word here
    else if (roll < 0.5) w = Array.from({ length: 1 + Math.floor(r() * 12) }, () => String.fromCharCode(0x21 + Math.floor(r() * 94))).join('');
    else if (roll < 0.6) w = pick(PUNCT) + w + pick(PUNCT);
    else if (roll < 0.65) w = String(Math.floor(r() * 1e6));
    parts.push(w, pick([' ', ' ', '  ', '\t', '\n', '\r\n', '']));
  }
  return parts.join('');
}

/** An ASCII text with something only the library may answer spliced in. */
function handedBack(r: () => number): string {
  const text = asciiText(r) || 'plain';
  const odds = ['\u0000', '\u0007', '\u000b', '\u000c', '\u001f', '\u007f', 'é', 'ß', 'İ', '你好', '😀', '\u00a0', ...ADDED];
  const odd = odds[Math.floor(r() * odds.length)]!;
  const at = Math.floor(r() * (text.length + 1));
  return text.slice(0, at) + odd + text.slice(at);
}

function libraryIds(lib: HfTokenizer, text: string): number[] {
  return lib.encode(text, { add_special_tokens: false }).ids;
}

describe('AsciiWordPiece', () => {
  for (const [name, json] of Object.entries(VARIANTS)) {
    it(`gives the library's ids on every random ASCII text (${name})`, () => {
      const r = makeRandom(`wordpiece-ascii ${name}`);
      const lib = new HfTokenizer(json, {});
      const fast = AsciiWordPiece.forTokenizerJson(json, lib);
      expect(fast).not.toBeNull();
      let unknowns = 0;
      for (let i = 0; i < 600; i++) {
        const text = asciiText(r);
        const ids = fast!.ids(text);
        expect(ids, JSON.stringify(text)).not.toBeNull();
        expect(ids, JSON.stringify(text)).toEqual(libraryIds(lib, text));
        unknowns += ids!.filter((id) => id === 100).length;
      }
      // The unknown-word rule was exercised: long words everywhere, holes in 'holey', capitals in 'cased'.
      expect(unknowns).toBeGreaterThan(0);
    });
  }

  it('hands back texts with control characters, non-ASCII characters or added tokens; the tokenizer still gives the library ids', () => {
    const r = makeRandom('wordpiece-ascii handed back');
    const lib = new HfTokenizer(uncased, {});
    const fast = AsciiWordPiece.forTokenizerJson(uncased, lib)!;
    const tok = createTokenizer(uncased);
    const opts = { maxLength: 100000, truncate: false };
    for (let i = 0; i < 300; i++) {
      const text = handedBack(r);
      expect(fast.ids(text), JSON.stringify(text)).toBeNull();
      expect(Array.from(tok.encode(text, opts).ids).slice(1, -1), JSON.stringify(text)).toEqual(libraryIds(lib, text));
    }
  });

  it('is not used for a pipeline other than the plain BERT one', () => {
    const lib = new HfTokenizer(uncased, {});
    const not = (json: Json) => expect(AsciiWordPiece.forTokenizerJson(json, lib)).toBeNull();
    not({ ...uncased, normalizer: { type: 'Sequence', normalizers: [{ type: 'NFD' }, { type: 'Lowercase' }] } });
    not({ ...uncased, pre_tokenizer: { type: 'Whitespace' } });
    not(withModel(uncased, { type: 'BPE' }));
    not(withModel(uncased, { fuse_unk: true }));
    not(withModel(uncased, { unk_token: '[NOPE]' }));
    not({ ...uncased, added_tokens: [...(uncased.added_tokens as Json[]), { id: 30522, content: '##ing', special: false, normalized: true }] });
  });
});

// The tokenizer as served (fast path and template) against Hugging Face's Rust library (a devDependency).
let rust: typeof import('tokenizers') | undefined;
let rustError: unknown;
try {
  rust = await import('tokenizers');
} catch (err) {
  rustError = err;
}

describe('the served tokenizer on ASCII texts matches the Rust tokenizers library', () => {
  beforeAll(() => {
    if (!rust) throw new Error(`the tokenizers package (Hugging Face's Rust library, a devDependency) does not load here: ${(rustError as Error).message}; run npm ci`);
  });
  for (const [name, json] of Object.entries(VARIANTS)) {
    it(`same ids with special tokens (${name})`, async () => {
      const r = makeRandom(`wordpiece-ascii rust ${name}`);
      const theirs = rust!.Tokenizer.fromString(JSON.stringify(json));
      const ours = createTokenizer(json);
      for (let i = 0; i < 300; i++) {
        const text = r() < 0.8 ? asciiText(r) : handedBack(r);
        expect(Array.from(ours.encode(text, { maxLength: 100000, truncate: false }).ids), JSON.stringify(text)).toEqual((await theirs.encode(text)).getIds());
      }
    }, 60_000);
  }
});

describe('the inline rule counts ASCII the fast path takes at its pace', () => {
  const tok = createTokenizer(uncased);
  const model = { plan: { maxLength: 512 }, tokenizer: tok } as unknown as ServedModel;
  /** Infer's rule with a batch tokenizer that records what reached it (the pool's place). */
  const rig = () => {
    const pooled: string[][] = [];
    const batchTokenizer = async (_m: ServedModel, texts: string[], opts: EncodeOptions) => {
      pooled.push(texts);
      return texts.map((t) => tok.encode(t, opts));
    };
    const infer = new Infer(new ModelRegistry([]), null as never, { requestTimeoutMs: 1000, batchTokenizer });
    return { pooled, encode: (texts: string[]) => infer.encoder.encodeTexts(model, texts, { truncate: true }) };
  };
  const ascii = (chars: number) => 'lorem ipsum dolor sit amet, '.repeat(Math.ceil(chars / 28)).slice(0, chars);

  it('paceChars: an ASCII text weighs 1/ASCII_PACE of its length, one the library tokenizes its whole length', () => {
    expect(tok.paceChars(ascii(4000))).toBe(Math.ceil(4000 / ASCII_PACE));
    expect(tok.paceChars(ascii(3999) + 'é')).toBe(4000);
    expect(tok.paceChars(ascii(3994) + '[MASK]')).toBe(4000);
  });

  it('inline within the bound at that pace; on the pool past it, or at the library pace', async () => {
    expect(DEFAULTS.inlineTokenizeChars).toBe(1024);
    const cases: [string, string[], boolean][] = [
      ['3 ASCII texts, 4000 characters', [ascii(1500), ascii(1500), ascii(1000)], false],
      ['1 ASCII text, 6000 characters', [ascii(6000)], false],
      ['the same 4000 with one é', [ascii(1500), ascii(1499) + 'é', ascii(1000)], true],
      ['3 ASCII texts, 9000 characters', [ascii(3000), ascii(3000), ascii(3000)], true],
      ['one short text with é', ['café au lait'], false],
    ];
    for (const [name, texts, toPool] of cases) {
      const { pooled, encode } = rig();
      const got = await encode(texts);
      expect(pooled.length, name).toBe(toPool ? 1 : 0);
      expect(got.map((e) => Array.from(e.ids)), name).toEqual(texts.map((t) => Array.from(tok.encode(t, { maxLength: 512, truncate: true }).ids)));
    }
  });
});

describe('PieceTable', () => {
  const hashOf = (text: string, seed: number) => [...text].reduce((h, c) => hashStep(h, c.charCodeAt(0)), seed);
  const table = new PieceTable(
    [
      ['ing', 7],
      ['##ing', 8],
      ['play', 9],
      ['##s', 10],
      ['café', 11],
    ],
    '##',
  );
  const find = (text: string, from: number, to: number, continuation: boolean) =>
    table.find(hashOf(text.slice(from, to), continuation ? CONTINUATION_SEED : INITIAL_SEED), text, from, to, continuation);

  it('finds a piece where it lies in the text, word-initial and continuation apart', () => {
    expect(find('playing', 0, 4, false)).toBe(9);
    expect(find('playing', 4, 7, true)).toBe(8); // ##ing
    expect(find('playing', 4, 7, false)).toBe(7); // ing
    expect(find('plays', 4, 5, true)).toBe(10);
    expect(find('plays', 4, 5, false)).toBe(-1); // "s" alone is not a piece
    expect(find('##ing', 0, 5, false)).toBe(8); // the token itself, written out
  });

  it('misses what it does not hold: other lengths, other characters, non-ASCII tokens', () => {
    expect(find('playin', 0, 6, false)).toBe(-1);
    expect(find('plax', 0, 4, false)).toBe(-1);
    expect(find('café', 0, 4, false)).toBe(-1);
    expect(table.maxChars).toBe(5);
  });
});
