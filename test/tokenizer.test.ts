import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTokenizer, loadTokenizer, type TextTokenizer } from '../src/core/tokenizer/tokenizer.js';
import { bertUncasedVocab, buildBertTokenizerJson } from '../models/generator/tokenizer-json.js';
import { InputTooLongError } from '../src/shared/errors.js';
import { mulberry32 as rng } from '../models/generator/rng.js';


const vocab = bertUncasedVocab();
const idOf = new Map(vocab.map((t, i) => [t, i]));
const WORDS = vocab.filter((t) => /^[a-z]{2,}$/.test(t));

function words(r: () => number, n: number): string {
  const out: string[] = [];
  for (let i = 0; i < n; i++) out.push(WORDS[Math.floor(r() * WORDS.length)]!);
  return out.join(' ');
}

/** Reference WordPiece (greedy longest-match-first) for one lowercase ASCII word. */
function wordPiece(word: string): string[] {
  const out: string[] = [];
  let start = 0;
  while (start < word.length) {
    let end = word.length;
    let found: string | undefined;
    while (end > start) {
      const piece = (start > 0 ? '##' : '') + word.slice(start, end);
      if (idOf.has(piece)) {
        found = piece;
        break;
      }
      end--;
    }
    if (!found) return ['[UNK]'];
    out.push(found);
    start = end;
  }
  return out;
}

let dir: string;
let tok: TextTokenizer;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'slabserve-tokenizer-'));
  const path = join(dir, 'tokenizer.json');
  writeFileSync(path, JSON.stringify(buildBertTokenizerJson()));
  tok = await loadTokenizer(path);
});

afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

const long = { maxLength: 512, truncate: false };

describe('bert-base-uncased vocabulary reconstruction', () => {
  it('has 30522 unique tokens', () => {
    expect(vocab).toHaveLength(30522);
    expect(new Set(vocab).size).toBe(30522);
  });

  it('puts the specials at the bert-base-uncased ids', () => {
    expect(idOf.get('[PAD]')).toBe(0);
    expect(idOf.get('[unused0]')).toBe(1);
    expect(idOf.get('[UNK]')).toBe(100);
    expect(idOf.get('[CLS]')).toBe(101);
    expect(idOf.get('[SEP]')).toBe(102);
    expect(idOf.get('[MASK]')).toBe(103);
    expect(vocab.filter((t) => /^\[unused\d+\]$/.test(t))).toHaveLength(994); // [unused0]..[unused993]
  });

  it('restores word-initial tokens and ## continuation pieces', () => {
    expect(idOf.get('the')).toBe(1996);
    expect(idOf.has('##s')).toBe(true);
    expect(vocab.some((t) => t.includes('\u2581'))).toBe(false);
    expect(vocab.every((t) => t !== '' && t !== '##')).toBe(true);
    expect(idOf.get('#')).toBe(1001);
    expect(idOf.get('###')).toBe(29614); // continuation "#"
  });

  it('builds a tokenizer.json in the HF layout', () => {
    const json = buildBertTokenizerJson() as Record<string, any>;
    expect(json.version).toBe('1.0');
    expect(json.truncation).toBeNull();
    expect(json.padding).toBeNull();
    expect(json.added_tokens.map((t: any) => [t.id, t.content, t.special])).toEqual([
      [0, '[PAD]', true],
      [100, '[UNK]', true],
      [101, '[CLS]', true],
      [102, '[SEP]', true],
      [103, '[MASK]', true],
    ]);
    expect(json.normalizer).toEqual({ type: 'BertNormalizer', clean_text: true, handle_chinese_chars: true, strip_accents: null, lowercase: true });
    expect(json.pre_tokenizer).toEqual({ type: 'BertPreTokenizer' });
    expect(json.decoder).toEqual({ type: 'WordPiece', prefix: '##', cleanup: true });
    expect(json.model.type).toBe('WordPiece');
    expect(json.model.unk_token).toBe('[UNK]');
    expect(json.model.continuing_subword_prefix).toBe('##');
    expect(json.model.max_input_chars_per_word).toBe(100);
    expect(Object.keys(json.model.vocab)).toHaveLength(30522);
    expect(json.model.vocab['the']).toBe(1996);
    expect(json.post_processor.special_tokens['[CLS]'].ids).toEqual([101]);
    expect(json.post_processor.special_tokens['[SEP]'].ids).toEqual([102]);
  });
});

describe('encode', () => {
  it('encodes "Hello, world!" as bert-base-uncased does', () => {
    // lowercased, split on punctuation; each piece is a whole-word vocab entry
    expect(['hello', ',', 'world', '!'].map((t) => idOf.get(t))).toEqual([7592, 1010, 2088, 999]);
    const e = tok.encode('Hello, world!', long);
    expect(Array.from(e.ids)).toEqual([101, 7592, 1010, 2088, 999, 102]);
    expect(Array.from(e.typeIds)).toEqual([0, 0, 0, 0, 0, 0]);
    expect(e.truncated).toBe(false);
  });

  it('splits "unaffable" greedily, longest match first', () => {
    // The BERT README's "un ##aff ##able" is only illustrative: this vocabulary has no
    // "##aff"; the longest prefix in the vocab is "una", then "##ffa", then "##ble".
    expect(idOf.has('##aff')).toBe(false);
    expect(['unaffable', 'unaffabl', 'unaffab', 'unaffa', 'unaff', 'unaf'].some((p) => idOf.has(p))).toBe(false);
    expect(wordPiece('unaffable')).toEqual(['una', '##ffa', '##ble']);
    const e = tok.encode('unaffable', long);
    expect(Array.from(e.ids).map((i) => vocab[i])).toEqual(['[CLS]', 'una', '##ffa', '##ble', '[SEP]']);
  });

  it('agrees with a reference WordPiece on random vocabulary words with pieces glued on', () => {
    const r = rng(7);
    const pieces = vocab.filter((t) => /^##[a-z]{2,}$/.test(t)).map((t) => t.slice(2));
    for (let i = 0; i < 300; i++) {
      let w = WORDS[Math.floor(r() * WORDS.length)]!;
      if (r() < 0.7) w += pieces[Math.floor(r() * pieces.length)]!;
      const ids = Array.from(tok.encode(w, long).ids);
      expect(ids.slice(1, -1).map((id) => vocab[id])).toEqual(wordPiece(w));
    }
  });

  it('lowercases, strips accents, isolates CJK characters, and maps overlong words to [UNK]', () => {
    const e = tok.encode('CAFÉ Naïve', long);
    expect(Array.from(e.ids)).toEqual([101, idOf.get('cafe'), idOf.get('naive'), 102]);
    expect(Array.from(tok.encode('世世', long).ids)).toEqual([101, idOf.get('世'), idOf.get('世'), 102]);
    expect(Array.from(tok.encode('a'.repeat(101), long).ids)).toEqual([101, 100, 102]);
  });

  it('encodes the empty string as [CLS] [SEP]', () => {
    const e = tok.encode('', long);
    expect(Array.from(e.ids)).toEqual([101, 102]);
    expect(e.truncated).toBe(false);
  });

  it('reports the vocabulary size', () => {
    expect(tok.vocabSize).toBe(30522);
  });
});

describe('truncation', () => {
  const text = words(rng(1), 40);

  it('cuts to exactly maxLength, keeps [CLS] first and [SEP] last', () => {
    const all = tok.encode(text, long);
    expect(all.ids.length).toBeGreaterThan(20);
    const e = tok.encode(text, { maxLength: 16, truncate: true });
    expect(e.ids).toHaveLength(16);
    expect(e.typeIds).toHaveLength(16);
    expect(e.ids[0]).toBe(101);
    expect(e.ids[15]).toBe(102);
    expect(e.truncated).toBe(true);
    expect(Array.from(e.ids.subarray(0, 15))).toEqual(Array.from(all.ids.subarray(0, 15)));
  });

  it('does not flag an input that fits exactly', () => {
    const n = tok.encode(text, long).ids.length;
    const e = tok.encode(text, { maxLength: n, truncate: true });
    expect(e.ids).toHaveLength(n);
    expect(e.truncated).toBe(false);
    expect(tok.encode(text, { maxLength: n, truncate: false }).truncated).toBe(false);
  });

  it('truncates to [CLS] [SEP] at maxLength 2', () => {
    expect(Array.from(tok.encode(text, { maxLength: 2, truncate: true }).ids)).toEqual([101, 102]);
  });

  it('throws InputTooLongError without truncate', () => {
    const n = tok.encode(text, long).ids.length;
    let caught: unknown;
    try {
      tok.encode(text, { maxLength: 16, truncate: false });
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(InputTooLongError);
    const e = caught as InputTooLongError;
    expect(e.code).toBe('SLABSERVE_INPUT_TOO_LONG');
    expect(e.type).toBe('too_long');
    expect(e.length).toBe(n);
    expect(e.maxLength).toBe(16);
  });

  it('rejects a bad maxLength', () => {
    expect(() => tok.encode('x', { maxLength: 0, truncate: true })).toThrow(RangeError);
  });
});

describe('pairs', () => {
  it('encodes [CLS] a [SEP] b [SEP] with type ids 0 then 1', () => {
    const e = tok.encodePair!('first part', 'second', long);
    expect(Array.from(e.ids)).toEqual([101, idOf.get('first'), idOf.get('part'), 102, idOf.get('second'), 102]);
    expect(Array.from(e.typeIds)).toEqual([0, 0, 0, 0, 1, 1]);
    expect(e.truncated).toBe(false);
  });

  it('truncates the longer side first (longest_first)', () => {
    const a = words(rng(2), 20); // 20+ tokens
    const b = 'one two three'; // 3 tokens
    const ea = tok.encode(a, long);
    // budget 12 - 3 specials = 9: b keeps its 3, a gets 6
    const e = tok.encodePair!(a, b, { maxLength: 12, truncate: true });
    expect(e.ids).toHaveLength(12);
    expect(e.truncated).toBe(true);
    expect(Array.from(e.ids)).toEqual([...Array.from(ea.ids.subarray(0, 7)), 102, idOf.get('one'), idOf.get('two'), idOf.get('three'), 102]);
    expect(Array.from(e.typeIds)).toEqual([0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]);
    // both long: split the budget evenly, the odd token to the second
    const both = tok.encodePair!(a, words(rng(3), 20), { maxLength: 10, truncate: true });
    expect(Array.from(both.typeIds)).toEqual([0, 0, 0, 0, 0, 1, 1, 1, 1, 1]);
    expect(both.ids[4]).toBe(102);
    expect(both.ids[9]).toBe(102);
  });

  it('throws InputTooLongError for a pair without truncate', () => {
    expect(() => tok.encodePair!(words(rng(4), 30), words(rng(5), 30), { maxLength: 20, truncate: false })).toThrow(InputTooLongError);
  });
});

describe('decode', () => {
  it('round-trips text through ids', () => {
    const e = tok.encode('Hello, world! The quick brown fox.', long);
    expect(tok.decode(e.ids, true)).toBe('hello, world! the quick brown fox.');
    expect(tok.decode(e.ids)).toBe('[CLS] hello, world! the quick brown fox. [SEP]');
    expect(tok.decode(Array.from(tok.encode('unaffable', long).ids), true)).toBe('unaffable');
    expect(tok.decode([], true)).toBe('');
  });

  it('round-trips random vocabulary words', () => {
    const text = words(rng(6), 50);
    expect(tok.decode(tok.encode(text, long).ids, true)).toBe(text);
  });
});

describe('encodeBatch', () => {
  it('equals encoding one by one', async () => {
    const r = rng(8);
    const texts = Array.from({ length: 64 }, (_, i) => (i % 7 === 0 ? '' : words(r, 5 + Math.floor(r() * 400))));
    const opts = { maxLength: 128, truncate: true };
    const batch = await tok.encodeBatch(texts, opts);
    expect(batch).toHaveLength(64);
    texts.forEach((t, i) => {
      const one = tok.encode(t, opts);
      expect(Array.from(batch[i]!.ids)).toEqual(Array.from(one.ids));
      expect(Array.from(batch[i]!.typeIds)).toEqual(Array.from(one.typeIds));
      expect(batch[i]!.truncated).toBe(one.truncated);
    });
  });

  it('rejects with InputTooLongError when one text is too long and truncate is off', async () => {
    await expect(Promise.resolve(tok.encodeBatch(['short', words(rng(9), 100)], { maxLength: 32, truncate: false }))).rejects.toBeInstanceOf(InputTooLongError);
  });
});

/** A toy WordPiece tokenizer with its own special ids and the older BertProcessing post-processor. */
function toyTokenizer(post: 'bert' | 'template'): object {
  const tokens = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'hello', 'world', 'un', '##believ', '##able', ',', '!'];
  const v = Object.fromEntries(tokens.map((t, i) => [t, i]));
  const special = (id: number, content: string) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  return {
    version: '1.0',
    truncation: { direction: 'Right', max_length: 512, strategy: 'LongestFirst', stride: 0 }, // ignored: we truncate per call
    padding: null,
    added_tokens: tokens.slice(0, 5).map((t, i) => special(i, t)),
    normalizer: { type: 'BertNormalizer', clean_text: true, handle_chinese_chars: true, strip_accents: null, lowercase: false },
    pre_tokenizer: { type: 'BertPreTokenizer' },
    post_processor:
      post === 'bert'
        ? { type: 'BertProcessing', sep: ['[SEP]', 3], cls: ['[CLS]', 2] }
        : {
            type: 'TemplateProcessing',
            single: [{ SpecialToken: { id: '[CLS]', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '[SEP]', type_id: 0 } }],
            pair: [
              { SpecialToken: { id: '[CLS]', type_id: 0 } },
              { Sequence: { id: 'A', type_id: 0 } },
              { SpecialToken: { id: '[SEP]', type_id: 0 } },
              { Sequence: { id: 'B', type_id: 1 } },
              { SpecialToken: { id: '[SEP]', type_id: 1 } },
            ],
            special_tokens: { '[CLS]': { id: '[CLS]', ids: [2], tokens: ['[CLS]'] }, '[SEP]': { id: '[SEP]', ids: [3], tokens: ['[SEP]'] } },
          },
    decoder: { type: 'WordPiece', prefix: '##', cleanup: true },
    model: { type: 'WordPiece', unk_token: '[UNK]', continuing_subword_prefix: '##', max_input_chars_per_word: 100, vocab: v },
  };
}


describe('other BERT-style tokenizer.json files', () => {
  for (const post of ['bert', 'template'] as const) {
    it(`uses the file's own special ids (${post} post-processor), cased`, () => {
      const t = createTokenizer(toyTokenizer(post));
      expect(t.vocabSize).toBe(12);
      expect(Array.from(t.encode('hello, unbelievable world!', long).ids)).toEqual([2, 5, 10, 7, 8, 9, 6, 11, 3]);
      expect(Array.from(t.encode('Hello', long).ids)).toEqual([2, 1, 3]); // cased: "Hello" is unknown
      const cut = t.encode('hello hello hello hello', { maxLength: 4, truncate: true });
      expect(Array.from(cut.ids)).toEqual([2, 5, 5, 3]);
      const p = t.encodePair!('hello', 'world', long);
      expect(Array.from(p.ids)).toEqual([2, 5, 3, 6, 3]);
      expect(Array.from(p.typeIds)).toEqual([0, 0, 0, 1, 1]);
      expect(t.decode(t.encode('hello unbelievable', long).ids, true)).toBe('hello unbelievable');
    });
  }
});

describe('loadTokenizer shares one instance per tokenizer', () => {
  it('the same tokenizer.json in two folders gives one instance; another file or another clean-up flag gives its own', async () => {
    const root = mkdtempSync(join(tmpdir(), 'slabserve-tok-share-'));
    try {
      const write = (dir: string, json: object, cleanUp?: boolean) => {
        const path = join(root, dir);
        mkdirSync(path);
        writeFileSync(join(path, 'tokenizer.json'), JSON.stringify(json));
        if (cleanUp !== undefined) writeFileSync(join(path, 'tokenizer_config.json'), JSON.stringify({ clean_up_tokenization_spaces: cleanUp }));
        return join(path, 'tokenizer.json');
      };
      const [a, b, other, cleaned] = [write('a', toyTokenizer('bert')), write('b', toyTokenizer('bert')), write('c', toyTokenizer('template')), write('d', toyTokenizer('bert'), true)];
      const [ta, tb, tOther, tCleaned] = await Promise.all([a, b, other, cleaned].map((p) => loadTokenizer(p)));
      expect(tb).toBe(ta);
      expect(tOther).not.toBe(ta);
      expect(tCleaned).not.toBe(ta);
      // A shared instance encodes as its own copy would: the max length is each call's.
      const fresh = createTokenizer(toyTokenizer('bert'));
      for (const opts of [long, { maxLength: 4, truncate: true }]) {
        expect(Array.from(tb.encode('hello hello world unbelievable', opts).ids)).toEqual(Array.from(fresh.encode('hello hello world unbelievable', opts).ids));
      }
      // Loaded again later, from a folder not seen before: still the one instance.
      expect(await loadTokenizer(write('e', toyTokenizer('bert')))).toBe(ta);
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});

// Cross-check against Hugging Face's Rust library (the tokenizers package, a devDependency).
type RustModule = typeof import('tokenizers');
let rust: RustModule | undefined;
let rustError: unknown;
try {
  rust = await import('tokenizers');
} catch (err) {
  rustError = err;
}

describe('matches the Rust tokenizers library', () => {
  beforeAll(() => {
    if (!rust) throw new Error(`the tokenizers package (Hugging Face's Rust library, a devDependency) does not load here: ${(rustError as Error).message}; run npm ci`);
  });
  it('gives identical ids, type ids and truncation on random texts and pairs', async () => {
    const json = JSON.stringify(buildBertTokenizerJson());
    const plain = rust!.Tokenizer.fromString(json);
    const truncating = rust!.Tokenizer.fromString(json);
    const r = rng(10);
    const extras = ['Ünïcödé', 'naïve café', '你好，世界。', "don't!", 'x'.repeat(120), '😀 🇫🇷', '\t\n', '[MASK] and [SEP]', '$5.00 / 50%'];
    const text = () => {
      const parts: string[] = [];
      const n = Math.floor(r() * 40);
      for (let i = 0; i < n; i++) parts.push(r() < 0.15 ? extras[Math.floor(r() * extras.length)]! : words(r, 1));
      return parts.join(r() < 0.5 ? ' ' : '  ');
    };
    for (let i = 0; i < 300; i++) {
      const a = text();
      const b = text();
      const maxLength = 3 + Math.floor(r() * 40);
      truncating.setTruncation(maxLength); // LongestFirst, Right, stride 0 by default
      const single = await truncating.encode(a);
      const mine = tok.encode(a, { maxLength, truncate: true });
      expect(Array.from(mine.ids)).toEqual(single.getIds());
      // Pair truncation: when the texts spell out special tokens ("[MASK]") and both
      // sides must be cut, the Rust binary can hand the odd token to the other side
      // (an internal of its pre-truncation); plain texts must match exactly.
      const pa = a.replace(/\[(MASK|SEP)\]/g, 'mask');
      const pb = b.replace(/\[(MASK|SEP)\]/g, 'mask');
      const pair = await truncating.encode(pa, pb);
      const minePair = tok.encodePair!(pa, pb, { maxLength, truncate: true });
      expect(Array.from(minePair.ids)).toEqual(pair.getIds());
      expect(Array.from(minePair.typeIds)).toEqual(pair.getTypeIds());
      const untruncated = await plain.encode(a);
      expect(Array.from(tok.encode(a, { maxLength: 100000, truncate: false }).ids)).toEqual(untruncated.getIds());
    }
  }, 60_000);

  it('splits a truncated pair exactly as the Rust library does, on every small length combination', async () => {
    const json = JSON.stringify(buildBertTokenizerJson());
    const seq = (n: number, w: string) => Array(n).fill(w).join(' '); // one token per word
    const got: string[] = [];
    const want: string[] = [];
    for (let maxLength = 3; maxLength <= 14; maxLength++) {
      const rs = rust!.Tokenizer.fromString(json);
      rs.setTruncation(maxLength);
      for (let la = 0; la <= 16; la++) {
        for (let lb = 0; lb <= 16; lb++) {
          const [a, b] = [seq(la, 'a'), seq(lb, 'b')];
          want.push(`${maxLength}:${la},${lb}:${(await rs.encode(a, b)).getIds().join(',')}`);
          got.push(`${maxLength}:${la},${lb}:${Array.from(tok.encodePair!(a, b, { maxLength, truncate: true }).ids).join(',')}`);
        }
      }
    }
    expect(got).toEqual(want);
  }, 60_000);
});
