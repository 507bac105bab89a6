/**
 * Model presets: BERT-architecture models with random weights, each written
 * as a Hugging Face style folder the server loads like a real export:
 *
 *   <out>/<name>/model.onnx        from bert-graph.ts (seeded, deterministic)
 *   <out>/<name>/config.json       a BertConfig, plus a "_slabserve" marker
 *   <out>/<name>/tokenizer.json    bert-base-uncased WordPiece (tokenizer-json.ts)
 *   <out>/<name>/tokenizer_config.json
 *   <out>/<name>/serve.json        how to serve it: task, pooling, normalize
 *
 * The weights are random: outputs are meaningless but deterministic, and
 * behave like a real encoder's (the attention mask is honoured, different
 * inputs give clearly different outputs), which is what the server's tests
 * and benchmarks need.
 */
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { buildBertModel, type BertSpec } from './bert-graph.js';
import { POOLINGS, type Pooling } from '../../src/shared/model-format/hf-folder.js';
import { quantizeDynamicInt8, toFloat16Variant } from './quantize.js';
import { Rng } from './rng.js';
import { encodeSafetensors } from '../../src/shared/model-format/safetensors.js';
import { buildBertTokenizerJson, buildByteBpeTokenizerJson, buildModernBertTokenizerJson, buildUnigramTokenizerJson, MODERNBERT_SPECIALS, QWEN_SPECIALS, XLMR_SPECIALS } from './tokenizer-json.js';

/** The 8 intents of the tiny-intent classifier, by class id. */
export const INTENT_LABELS = [
  'billing',
  'cancel_subscription',
  'change_password',
  'delivery_status',
  'greeting',
  'refund_request',
  'technical_support',
  'talk_to_human',
] as const;

export interface ServeJson {
  task: 'embed' | 'classify' | 'rerank';
  pooling?: 'mean' | 'cls';
  normalize?: boolean;
  maxLength?: number;
}

/** What a generated sentence-transformers folder says of itself. */
interface SentenceTransformersLayout {
  pooling: 'cls' | 'mean' | 'lasttoken';
  maxSeqLength: number;
  prompts?: Record<string, string>;
}

export interface Preset {
  name: string;
  description: string;
  spec: BertSpec;
  /**
   * BERT (WordPiece, a serve.json), DistilBERT (WordPiece, no token_type_ids,
   * its own config.json names) or the XLM-RoBERTa layout (Unigram, a
   * sentence-transformers folder: xlmrFiles) or the Qwen3-Embedding decoder
   * layout (byte-level BPE, position_ids, causal, last-token pooling: qwenFiles)
   * or ModernBERT's (byte-level BPE with [CLS]/[SEP], no token_type_ids, a long
   * context: modernbertFiles).
   */
  family?: 'bert' | 'distilbert' | 'xlm-roberta' | 'qwen3' | 'modernbert';
  /**
   * BERT presets written as sentence-transformers folders instead of with a
   * serve.json: their pooling, max_seq_length and prompts (bge's, MiniLM's layouts).
   */
  sentenceTransformers?: SentenceTransformersLayout;
  /** A masked-LM preset written as a sentence-transformers SparseEncoder folder (MLMTransformer, SpladePooling): SPLADE. */
  sparseEncoder?: { poolingStrategy: 'max' | 'sum' };
  /** A PyLate folder (ColBERT): Transformer then Dense to `dim`, its [Q] / [D] markers added to the tokenizer. */
  colbert?: { dim: number };
  /** BGE-M3's heads beside the encoder: colbert_linear and sparse_linear as safetensors, CLS pooling and Normalize. */
  m3?: boolean;
  serve: ServeJson;
  /** classify (and rerank, one label): label names by class id. */
  labels?: readonly string[];
}

const VOCAB = 30522;
/** PyLate's default markers: added to the tokenizer as plain tokens, trailing space included (ids VOCAB, VOCAB + 1). */
const COLBERT_MARKERS = ['[Q] ', '[D] '] as const;
const MAX_POSITIONS = 512;
const TYPE_VOCAB = 2;

function encoder(layers: number, hidden: number, heads: number, intermediate: number) {
  return { layers, hidden, heads, intermediate, vocabSize: VOCAB, maxPositions: MAX_POSITIONS, typeVocabSize: TYPE_VOCAB };
}

export const PRESETS: Readonly<Record<string, Preset>> = {
  'tiny-embed': {
    name: 'tiny-embed',
    description: 'bert-tiny shape (2 layers, hidden 128), sentence embeddings',
    spec: { ...encoder(2, 128, 2, 512), task: 'embed', seed: 20_001 },
    serve: { task: 'embed', pooling: 'mean', normalize: true },
  },
  'tiny-intent': {
    name: 'tiny-intent',
    description: 'bert-tiny shape + classification head over 8 customer-service intents',
    spec: { ...encoder(2, 128, 2, 512), task: 'classify', numLabels: INTENT_LABELS.length, seed: 20_002 },
    serve: { task: 'classify' },
    labels: INTENT_LABELS,
  },
  'tiny-rerank': {
    name: 'tiny-rerank',
    description: 'bert-tiny shape + one-logit head: a cross-encoder reranker of (query, text) pairs',
    spec: { ...encoder(2, 128, 2, 512), task: 'classify', numLabels: 1, seed: 20_005 },
    serve: { task: 'rerank' },
  },
  'tiny-xlmr': {
    name: 'tiny-xlmr',
    description:
      'multilingual-e5 layout: XLM-RoBERTa (Unigram tokenizer, <s> </s>, <pad> = 1, positions from padding_idx + 1, no token_type_ids), ' +
      'a sentence-transformers folder (mean pooling, Normalize, max_seq_length 512, query: / passage: prompts)',
    // vocabSize: the Unigram tokenizer's, filled in when built (presetSpec)
    spec: { ...encoder(2, 128, 2, 512), vocabSize: 0, maxPositions: 514, typeVocabSize: 1, positionPaddingIdx: 1, tokenTypeIds: false, layerNormEps: 1e-5, task: 'embed', seed: 20_006 },
    family: 'xlm-roberta',
    serve: { task: 'embed' },
  },
  'tiny-m3': {
    name: 'tiny-m3',
    description:
      'BGE-M3 layout: XLM-RoBERTa (Unigram tokenizer, <s> </s>), a sentence-transformers folder (CLS pooling, Normalize), and FlagEmbedding\'s two heads ' +
      'beside it as safetensors (colbert_linear [128, 128], sparse_linear [1, 128]): dense, sparse and colbert from one pass',
    // vocabSize: the Unigram tokenizer's, filled in when built (presetSpec)
    spec: { ...encoder(2, 128, 2, 512), vocabSize: 0, maxPositions: 514, typeVocabSize: 1, positionPaddingIdx: 1, tokenTypeIds: false, layerNormEps: 1e-5, task: 'embed', seed: 20_014 },
    family: 'xlm-roberta',
    serve: { task: 'embed' },
    m3: true,
  },
  'tiny-qwen3': {
    name: 'tiny-qwen3',
    description:
      'Qwen3-Embedding layout: a decoder (causal attention, position_ids input, no token_type_ids), byte-level BPE that appends <|endoftext|>, ' +
      'a sentence-transformers folder with last-token pooling, Normalize and an instruction prompt (its layers are BERT-style, not Qwen3\'s)',
    // vocabSize: the BPE tokenizer's, filled in when built (presetSpec)
    spec: { ...encoder(2, 128, 2, 512), vocabSize: 0, maxPositions: 1024, typeVocabSize: 1, tokenTypeIds: false, positionIdsInput: true, causal: true, layerNormEps: 1e-6, task: 'embed', seed: 20_008 },
    family: 'qwen3',
    serve: { task: 'embed' },
  },
  'tiny-modernbert': {
    name: 'tiny-modernbert',
    description:
      'ModernBERT layout (modernbert-embed): byte-level BPE with [CLS] [SEP], no token_type_ids, 2048 positions (buckets past 512), ' +
      'a sentence-transformers folder with mean pooling and search_query: / search_document: prompts (its layers are BERT-style)',
    // vocabSize: the BPE tokenizer's, filled in when built (presetSpec)
    spec: { ...encoder(2, 128, 2, 512), vocabSize: 0, maxPositions: 2048, typeVocabSize: 1, tokenTypeIds: false, layerNormEps: 1e-5, task: 'embed', seed: 20_009 },
    family: 'modernbert',
    serve: { task: 'embed' },
  },
  'tiny-bge': {
    name: 'tiny-bge',
    description: 'bge layout: BERT WordPiece, a sentence-transformers folder with CLS pooling, Normalize, max_seq_length 512 and a query instruction prompt',
    spec: { ...encoder(2, 128, 2, 512), task: 'embed', seed: 20_010 },
    serve: { task: 'embed' },
    sentenceTransformers: { pooling: 'cls', maxSeqLength: 512, prompts: { query: 'Represent this sentence for searching relevant passages: ' } },
  },
  'tiny-splade': {
    name: 'tiny-splade',
    description:
      'SPLADE layout (naver/splade-v3): BERT WordPiece with its masked-LM head (BertForMaskedLM), a sentence-transformers SparseEncoder folder ' +
      '(MLMTransformer, SpladePooling max over log(1 + relu(logits)), max_seq_length 512)',
    spec: { ...encoder(2, 128, 2, 512), task: 'mlm', seed: 20_012 },
    serve: { task: 'embed' },
    sparseEncoder: { poolingStrategy: 'max' },
  },
  'tiny-colbert': {
    name: 'tiny-colbert',
    description:
      'PyLate ColBERT layout (colbertv2 / GTE-ModernColBERT): BERT WordPiece with "[Q] " and "[D] " added, Transformer then a Dense projection to 32 ' +
      '(1_Dense/model.safetensors), query length 32 with [MASK] expansion, document length 180, punctuation skiplist',
    spec: { ...encoder(2, 128, 2, 512), vocabSize: VOCAB + COLBERT_MARKERS.length, task: 'embed', seed: 20_013 },
    serve: { task: 'embed' },
    colbert: { dim: 32 },
  },
  'tiny-minilm': {
    name: 'tiny-minilm',
    description: 'all-MiniLM-L6-v2 layout: BERT WordPiece, a sentence-transformers folder with mean pooling, Normalize, max_seq_length 256',
    spec: { ...encoder(2, 128, 2, 512), task: 'embed', seed: 20_011 },
    serve: { task: 'embed' },
    sentenceTransformers: { pooling: 'mean', maxSeqLength: 256 },
  },
  'tiny-distilbert': {
    name: 'tiny-distilbert',
    description: 'DistilBERT layout: WordPiece, no token_type_ids input, a DistilBertConfig (dim, n_layers, ...), CLS pooling',
    spec: { ...encoder(2, 128, 2, 512), tokenTypeIds: false, task: 'embed', seed: 20_007 },
    family: 'distilbert',
    serve: { task: 'embed', pooling: 'cls', normalize: true },
  },
  'minilm-l6': {
    name: 'minilm-l6',
    description: 'all-MiniLM-L6 shape (6 layers, hidden 384, 12 heads), sentence embeddings',
    spec: { ...encoder(6, 384, 12, 1536), task: 'embed', seed: 20_003 },
    serve: { task: 'embed', pooling: 'mean', normalize: true },
  },
  'bert-base': {
    name: 'bert-base',
    description: 'bert-base shape (12 layers, hidden 768, 12 heads), sentence embeddings',
    spec: { ...encoder(12, 768, 12, 3072), task: 'embed', seed: 20_004 },
    serve: { task: 'embed', pooling: 'mean', normalize: true },
  },
};

/** What `generate` writes when given no names. */
export const DEFAULT_PRESETS: readonly string[] = ['tiny-embed', 'tiny-intent', 'tiny-rerank'];

/** Files whose presence makes a folder complete (`generate --missing` skips it). */
export const REQUIRED_FILES = ['model.onnx', 'config.json', 'tokenizer.json'] as const;

export function presetNames(): string[] {
  return Object.keys(PRESETS);
}

export function getPreset(name: string): Preset {
  const p = Object.hasOwn(PRESETS, name) ? PRESETS[name] : undefined;
  if (!p) throw new Error(`unknown model preset "${name}"; known: ${presetNames().join(', ')}`);
  return p;
}

/** The preset's model spec, with what depends on its tokenizer filled in. */
export function presetSpec(preset: Preset): BertSpec {
  if (preset.family === 'xlm-roberta') return { ...preset.spec, vocabSize: buildUnigramTokenizerJson().vocabSize };
  if (preset.family === 'qwen3') return { ...preset.spec, vocabSize: byteBpe().vocabSize };
  if (preset.family === 'modernbert') return { ...preset.spec, vocabSize: buildModernBertTokenizerJson().vocabSize };
  return preset.spec;
}

let byteBpeCache: ReturnType<typeof buildByteBpeTokenizerJson> | undefined;
/** The byte-level BPE tokenizer (its merges take about a second to learn: once per process). */
function byteBpe(): ReturnType<typeof buildByteBpeTokenizerJson> {
  byteBpeCache ??= buildByteBpeTokenizerJson();
  return byteBpeCache;
}

/** A Hugging Face BertConfig (XLMRobertaConfig for that family) for the preset, with a `_slabserve` marker. */
export function buildConfigJson(preset: Preset): Record<string, unknown> {
  const s = presetSpec(preset);
  if (preset.family === 'xlm-roberta') return xlmrConfigJson(preset.name, s);
  if (preset.family === 'distilbert') return distilbertConfigJson(preset.name, s);
  if (preset.family === 'qwen3') return qwenConfigJson(preset.name, s);
  if (preset.family === 'modernbert') return modernbertConfigJson(preset.name, s);
  const classify = s.task === 'classify';
  const config: Record<string, unknown> = {
    _name_or_path: `slabserve/${preset.name}`,
    architectures: [classify ? 'BertForSequenceClassification' : s.task === 'mlm' ? 'BertForMaskedLM' : 'BertModel'],
    attention_probs_dropout_prob: 0.1,
    classifier_dropout: null,
    gradient_checkpointing: false,
    hidden_act: 'gelu',
    hidden_dropout_prob: 0.1,
    hidden_size: s.hidden,
  };
  if (classify) {
    const labels = preset.labels ?? Array.from({ length: s.numLabels ?? 0 }, (_, i) => `LABEL_${i}`);
    config.id2label = Object.fromEntries(labels.map((l, i) => [String(i), l]));
    config.label2id = Object.fromEntries(labels.map((l, i) => [l, i]));
  }
  Object.assign(config, {
    initializer_range: 0.02,
    intermediate_size: s.intermediate,
    layer_norm_eps: s.layerNormEps ?? 1e-12,
    max_position_embeddings: s.maxPositions,
    model_type: 'bert',
    num_attention_heads: s.heads,
    num_hidden_layers: s.layers,
    pad_token_id: 0,
    position_embedding_type: 'absolute',
    // one label is a regression head (a cross-encoder's relevance logit), as transformers sets it
    ...(classify ? { problem_type: s.numLabels === 1 ? 'regression' : 'single_label_classification' } : {}),
    torch_dtype: 'float32',
    transformers_version: '4.44.2',
    type_vocab_size: s.typeVocabSize,
    use_cache: true,
    vocab_size: s.vocabSize,
    _slabserve: { generated: true, seed: s.seed, note: 'random weights' },
  });
  return config;
}

/** tokenizer_config.json as transformers saves it for bert-base-uncased. */
export function buildTokenizerConfigJson(): Record<string, unknown> {
  return {
    clean_up_tokenization_spaces: true,
    cls_token: '[CLS]',
    do_basic_tokenize: true,
    do_lower_case: true,
    mask_token: '[MASK]',
    model_max_length: MAX_POSITIONS,
    never_split: null,
    pad_token: '[PAD]',
    sep_token: '[SEP]',
    strip_accents: null,
    tokenize_chinese_chars: true,
    tokenizer_class: 'BertTokenizer',
    unk_token: '[UNK]',
  };
}

/** An XLMRobertaConfig, as multilingual-e5's config.json has it. */
function xlmrConfigJson(name: string, s: BertSpec): Record<string, unknown> {
  return {
    _name_or_path: `slabserve/${name}`,
    architectures: ['XLMRobertaModel'],
    attention_probs_dropout_prob: 0.1,
    bos_token_id: 0,
    eos_token_id: 2,
    hidden_act: 'gelu',
    hidden_dropout_prob: 0.1,
    hidden_size: s.hidden,
    initializer_range: 0.02,
    intermediate_size: s.intermediate,
    layer_norm_eps: s.layerNormEps,
    max_position_embeddings: s.maxPositions,
    model_type: 'xlm-roberta',
    num_attention_heads: s.heads,
    num_hidden_layers: s.layers,
    pad_token_id: s.positionPaddingIdx,
    position_embedding_type: 'absolute',
    torch_dtype: 'float32',
    transformers_version: '4.44.2',
    type_vocab_size: s.typeVocabSize,
    use_cache: true,
    vocab_size: s.vocabSize,
    _slabserve: { generated: true, seed: s.seed, note: 'random weights' },
  };
}

/** A DistilBertConfig: its own names for the sizes (dim, hidden_dim, n_heads, n_layers), no token types. */
function distilbertConfigJson(name: string, s: BertSpec): Record<string, unknown> {
  return {
    _name_or_path: `slabserve/${name}`,
    activation: 'gelu',
    architectures: ['DistilBertModel'],
    attention_dropout: 0.1,
    dim: s.hidden,
    dropout: 0.1,
    hidden_dim: s.intermediate,
    initializer_range: 0.02,
    max_position_embeddings: s.maxPositions,
    model_type: 'distilbert',
    n_heads: s.heads,
    n_layers: s.layers,
    pad_token_id: 0,
    sinusoidal_pos_embds: false,
    torch_dtype: 'float32',
    transformers_version: '4.44.2',
    vocab_size: s.vocabSize,
    _slabserve: { generated: true, seed: s.seed, note: 'random weights' },
  };
}

/** A Qwen3Config, as Qwen3-Embedding's config.json has it (no pad_token_id: the tokenizer pads with <|endoftext|>). */
function qwenConfigJson(name: string, s: BertSpec): Record<string, unknown> {
  return {
    _name_or_path: `slabserve/${name}`,
    architectures: ['Qwen3Model'],
    attention_bias: false,
    bos_token_id: s.vocabSize - QWEN_SPECIALS.length,
    eos_token_id: s.vocabSize - QWEN_SPECIALS.length,
    head_dim: s.hidden / s.heads,
    hidden_act: 'silu',
    hidden_size: s.hidden,
    intermediate_size: s.intermediate,
    max_position_embeddings: s.maxPositions,
    model_type: 'qwen3',
    num_attention_heads: s.heads,
    num_hidden_layers: s.layers,
    num_key_value_heads: s.heads,
    rms_norm_eps: s.layerNormEps,
    tie_word_embeddings: true,
    torch_dtype: 'float32',
    transformers_version: '4.51.0',
    use_cache: false,
    vocab_size: s.vocabSize,
    _slabserve: { generated: true, seed: s.seed, note: 'random weights; BERT-style layers with causal attention in the Qwen3-Embedding interface' },
  };
}

/** The files of a Qwen3-Embedding-layout folder. */
function qwenFiles(s: BertSpec): Record<string, string> {
  const json = (o: unknown) => JSON.stringify(o, null, 2) + '\n';
  const eos = QWEN_SPECIALS[0];
  const query = 'Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:';
  return {
    'tokenizer.json': JSON.stringify(byteBpe().json, null, 2),
    'tokenizer_config.json': json({ eos_token: eos, pad_token: eos, model_max_length: s.maxPositions, padding_side: 'left', clean_up_tokenization_spaces: false, tokenizer_class: 'Qwen2Tokenizer' }),
    ...sentenceTransformersFiles(s.hidden, { pooling: 'lasttoken', maxSeqLength: s.maxPositions, prompts: { query, document: '' } }),
  };
}

/** A sentence-transformers folder's own files: Transformer, Pooling (one mode), Normalize; max_seq_length; prompts. */
function sentenceTransformersFiles(hidden: number, st: SentenceTransformersLayout): Record<string, string> {
  const json = (o: unknown) => JSON.stringify(o, null, 2) + '\n';
  const module = (kind: string, idx: number, path: string) => ({ idx, name: String(idx), path, type: `sentence_transformers.models.${kind}` });
  return {
    'modules.json': json([module('Transformer', 0, ''), module('Pooling', 1, '1_Pooling'), module('Normalize', 2, '2_Normalize')]),
    '1_Pooling/config.json': json({
      word_embedding_dimension: hidden,
      pooling_mode_cls_token: st.pooling === 'cls',
      pooling_mode_mean_tokens: st.pooling === 'mean',
      pooling_mode_max_tokens: false,
      pooling_mode_mean_sqrt_len_tokens: false,
      pooling_mode_weightedmean_tokens: false,
      pooling_mode_lasttoken: st.pooling === 'lasttoken',
      include_prompt: true,
    }),
    'sentence_bert_config.json': json({ max_seq_length: st.maxSeqLength, do_lower_case: false }),
    'config_sentence_transformers.json': json({ prompts: st.prompts ?? {}, default_prompt_name: null, similarity_fn_name: 'cosine' }),
  };
}

/** A sentence-transformers SparseEncoder folder's own files (SPLADE): MLMTransformer, then SpladePooling. */
function sparseEncoderFiles(s: BertSpec, poolingStrategy: 'max' | 'sum'): Record<string, string> {
  const json = (o: unknown) => JSON.stringify(o, null, 2) + '\n';
  const module = (kind: string, idx: number, path: string) => ({ idx, name: String(idx), path, type: `sentence_transformers.sparse_encoder.models.${kind}` });
  return {
    'modules.json': json([module('MLMTransformer', 0, ''), module('SpladePooling', 1, '1_SpladePooling')]),
    '1_SpladePooling/config.json': json({ pooling_strategy: poolingStrategy, activation_function: 'relu', word_embedding_dimension: s.vocabSize }),
    'sentence_bert_config.json': json({ max_seq_length: s.maxPositions, do_lower_case: false }),
    'config_sentence_transformers.json': json({ model_type: 'SparseEncoder', prompts: { query: '', document: '' }, default_prompt_name: null, similarity_fn_name: 'dot' }),
  };
}

/**
 * A PyLate folder's own files (pylate.models.ColBERT.save): Transformer, then
 * its Dense (no bias, identity, as PyLate creates it) with seeded weights, the
 * markers as added tokens, and its ColBERT settings (PyLate's defaults).
 */
function pylateFiles(s: BertSpec, dim: number): Record<string, string | Uint8Array> {
  const json = (o: unknown) => JSON.stringify(o, null, 2) + '\n';
  const tokenizer = buildBertTokenizerJson() as { added_tokens: object[] };
  COLBERT_MARKERS.forEach((content, i) =>
    tokenizer.added_tokens.push({ id: VOCAB + i, content, single_word: false, lstrip: false, rstrip: false, normalized: true, special: false }),
  );
  const weight = new Rng(s.seed).fork('colbert dense').normalArray(dim * s.hidden, 1 / Math.sqrt(s.hidden));
  return {
    'tokenizer.json': JSON.stringify(tokenizer, null, 2),
    'modules.json': json([
      { idx: 0, name: '0', path: '', type: 'sentence_transformers.models.Transformer' },
      { idx: 1, name: '1', path: '1_Dense', type: 'pylate.models.Dense.Dense' },
    ]),
    '1_Dense/config.json': json({ in_features: s.hidden, out_features: dim, bias: false, activation_function: 'torch.nn.modules.linear.Identity', use_residual: false }),
    '1_Dense/model.safetensors': encodeSafetensors({ 'linear.weight': { shape: [dim, s.hidden], data: weight } }),
    'sentence_bert_config.json': json({ max_seq_length: 179, do_lower_case: false }),
    'config_sentence_transformers.json': json({
      model_type: 'ColBERT',
      prompts: { query: '', document: '' },
      default_prompt_name: null,
      similarity_fn_name: 'MaxSim',
      query_prefix: COLBERT_MARKERS[0],
      document_prefix: COLBERT_MARKERS[1],
      query_length: 32,
      document_length: 180,
      attend_to_expansion_tokens: false,
      skiplist_words: [...'!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~'],
      do_query_expansion: true,
    }),
  };
}

/** A ModernBertConfig: its special ids are the tokenizer's, after the pieces. */
function modernbertConfigJson(name: string, s: BertSpec): Record<string, unknown> {
  const id = (t: (typeof MODERNBERT_SPECIALS)[number]) => s.vocabSize - MODERNBERT_SPECIALS.length + MODERNBERT_SPECIALS.indexOf(t);
  return {
    _name_or_path: `slabserve/${name}`,
    architectures: ['ModernBertModel'],
    bos_token_id: id('[CLS]'),
    cls_token_id: id('[CLS]'),
    eos_token_id: id('[SEP]'),
    sep_token_id: id('[SEP]'),
    pad_token_id: id('[PAD]'),
    hidden_activation: 'gelu',
    hidden_size: s.hidden,
    intermediate_size: s.intermediate,
    max_position_embeddings: s.maxPositions,
    model_type: 'modernbert',
    norm_eps: s.layerNormEps,
    num_attention_heads: s.heads,
    num_hidden_layers: s.layers,
    torch_dtype: 'float32',
    transformers_version: '4.48.0',
    vocab_size: s.vocabSize,
    _slabserve: { generated: true, seed: s.seed, note: 'random weights; BERT-style layers in the ModernBERT interface' },
  };
}

/** The files of a ModernBERT-layout folder (modernbert-embed's). */
function modernbertFiles(s: BertSpec): Record<string, string> {
  const json = (o: unknown) => JSON.stringify(o, null, 2) + '\n';
  return {
    'tokenizer.json': JSON.stringify(buildModernBertTokenizerJson().json, null, 2),
    'tokenizer_config.json': json({ cls_token: '[CLS]', sep_token: '[SEP]', pad_token: '[PAD]', unk_token: '[UNK]', mask_token: '[MASK]', model_max_length: s.maxPositions, clean_up_tokenization_spaces: true, tokenizer_class: 'PreTrainedTokenizerFast' }),
    ...sentenceTransformersFiles(s.hidden, { pooling: 'mean', maxSeqLength: s.maxPositions, prompts: { query: 'search_query: ', document: 'search_document: ' } }),
  };
}

/** The files of an XLM-RoBERTa-layout folder (multilingual-e5's; with `m3`, BGE-M3's). */
function xlmrFiles(s: BertSpec, m3: boolean): Record<string, string | Uint8Array> {
  const json = (o: unknown) => JSON.stringify(o, null, 2) + '\n';
  return {
    'tokenizer.json': JSON.stringify(buildUnigramTokenizerJson().json, null, 2),
    'tokenizer_config.json': json({
      bos_token: XLMR_SPECIALS[0],
      pad_token: XLMR_SPECIALS[1],
      eos_token: XLMR_SPECIALS[2],
      sep_token: XLMR_SPECIALS[2],
      cls_token: XLMR_SPECIALS[0],
      unk_token: XLMR_SPECIALS[3],
      mask_token: '<mask>',
      model_max_length: s.maxPositions - 2,
      clean_up_tokenization_spaces: true,
      tokenizer_class: 'XLMRobertaTokenizer',
    }),
    ...(m3
      ? { ...sentenceTransformersFiles(s.hidden, { pooling: 'cls', maxSeqLength: s.maxPositions - 2 }), ...m3Heads(s) }
      : sentenceTransformersFiles(s.hidden, { pooling: 'mean', maxSeqLength: s.maxPositions - 2, prompts: { query: 'query: ', passage: 'passage: ' } })),
  };
}

/**
 * BGE-M3's heads as FlagEmbedding saves them (nn.Linear state dicts: weight,
 * bias), here as safetensors: colbert_linear hidden -> hidden, sparse_linear
 * hidden -> 1. Seeded; the sparse bias 0, so about half the tokens weigh > 0.
 */
function m3Heads(s: BertSpec): Record<string, Uint8Array> {
  const rng = new Rng(s.seed);
  const h = s.hidden;
  const tensor = (label: string, shape: number[], std: number) => ({ shape, data: rng.fork(label).normalArray(shape.reduce((a, b) => a * b, 1), std) });
  return {
    'colbert_linear.safetensors': encodeSafetensors({ weight: tensor('colbert weight', [h, h], 1 / Math.sqrt(h)), bias: tensor('colbert bias', [h], 0.02) }),
    'sparse_linear.safetensors': encodeSafetensors({ weight: tensor('sparse weight', [1, h], 1 / Math.sqrt(h)), bias: { shape: [1], data: new Float32Array(1) } }),
  };
}

let tokenizerJsonCache: string | undefined;
/** tokenizer.json text (built once per process; indent 2 like `tokenizers` saves it). */
export function tokenizerJsonString(): string {
  tokenizerJsonCache ??= JSON.stringify(buildBertTokenizerJson(), null, 2);
  return tokenizerJsonCache;
}

/** A preset folder's files by path inside it; model.onnx is always there. */
export type PresetFiles = Record<string, Uint8Array | string> & { 'model.onnx': Uint8Array };

/** Everything in the preset's folder, in memory. */
export function buildPresetFiles(name: string): PresetFiles {
  const preset = getPreset(name);
  const spec = presetSpec(preset);
  const config = JSON.stringify(buildConfigJson(preset), null, 2) + '\n';
  if (preset.family === 'xlm-roberta') return { 'model.onnx': buildBertModel(spec), 'config.json': config, ...xlmrFiles(spec, preset.m3 === true) };
  if (preset.family === 'qwen3') return { 'model.onnx': buildBertModel(spec), 'config.json': config, ...qwenFiles(spec) };
  if (preset.family === 'modernbert') return { 'model.onnx': buildBertModel(spec), 'config.json': config, ...modernbertFiles(spec) };
  const bert = {
    'model.onnx': buildBertModel(spec),
    'config.json': config,
    'tokenizer.json': tokenizerJsonString(),
    'tokenizer_config.json': JSON.stringify(buildTokenizerConfigJson(), null, 2) + '\n',
  };
  if (preset.sentenceTransformers) return { ...bert, ...sentenceTransformersFiles(spec.hidden, preset.sentenceTransformers) };
  if (preset.sparseEncoder) return { ...bert, ...sparseEncoderFiles(spec, preset.sparseEncoder.poolingStrategy) };
  if (preset.colbert) return { ...bert, ...pylateFiles(spec, preset.colbert.dim) };
  return { ...bert, 'serve.json': JSON.stringify(preset.serve, null, 2) + '\n' };
}

/** Whether `dir` holds every file of {@link REQUIRED_FILES}. */
export function isModelFolderComplete(dir: string): boolean {
  return REQUIRED_FILES.every((f) => existsSync(join(dir, f)));
}

/**
 * Whether `dir` holds a config.json we generated (with the `_slabserve`
 * marker); false for a missing folder, a real HF export or unreadable JSON.
 */
export function isGeneratedFolder(dir: string): boolean {
  try {
    const cfg = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as { _slabserve?: { generated?: boolean } };
    return cfg._slabserve?.generated === true;
  } catch {
    return false;
  }
}

/** Writes `data` to `path` atomically: a temp file in the same folder, then rename. */
export function writeFileAtomic(path: string, data: Uint8Array | string): void {
  const tmp = `${path}.tmp-${process.pid}-${Date.now().toString(36)}`;
  try {
    writeFileSync(tmp, data);
    renameSync(tmp, path);
  } catch (err) {
    rmSync(tmp, { force: true });
    throw err;
  }
}

export interface WriteResult {
  dir: string;
  /** Bytes of model.onnx. */
  modelBytes: number;
}

/**
 * Generates the preset into `<outDir>/<name>/`. Each file is written
 * atomically, and model.onnx is removed first and written last, so a run
 * interrupted at any point leaves a folder that {@link isModelFolderComplete}
 * rejects (and `--missing` regenerates), never a mix that looks complete.
 */
/** How a written folder may differ from its preset: its name, and what its serve.json says over the folder's files. */
export interface WriteOptions {
  /** Also write model_int8.onnx / model_fp16.onnx. */
  int8?: boolean;
  fp16?: boolean;
  /** The folder's name under outDir (the model's name when served); default the preset's. */
  folder?: string;
  /** An embedding preset's pooling, written to serve.json (which goes before the folder's own files). */
  pooling?: Pooling;
  /** The longest input in tokens, written to serve.json; at most the graph's positions. */
  maxLength?: number;
}

/** The longest input a preset's graph takes: its positions, less RoBERTa's padding offset. */
export function presetMaxLength(name: string): number {
  const spec = getPreset(name).spec;
  return spec.maxPositions - (spec.positionPaddingIdx !== undefined ? spec.positionPaddingIdx + 1 : 0);
}

/** What is wrong with writing preset `name` with `opts`' pooling and max length, or null. */
export function writeOptionsProblem(name: string, opts: WriteOptions): string | null {
  const task = getPreset(name).serve.task;
  if (opts.pooling !== undefined && !POOLINGS.includes(opts.pooling)) return `pooling "${opts.pooling}" is not one of ${POOLINGS.join(', ')}`;
  if (opts.pooling !== undefined && task !== 'embed') return `${name} is a ${task} model: pooling is an embedding model's`;
  const limit = presetMaxLength(name);
  if (opts.maxLength !== undefined && !(Number.isInteger(opts.maxLength) && opts.maxLength >= 1 && opts.maxLength <= limit)) {
    return `max length ${opts.maxLength} is not a whole number from 1 to ${limit} (${name}'s positions)`;
  }
  return null;
}

/** serve.json with `opts`' pooling and max length over the preset's own (refused where they cannot apply). */
function withServeOverrides(name: string, files: PresetFiles, opts: WriteOptions): void {
  if (opts.pooling === undefined && opts.maxLength === undefined) return;
  const problem = writeOptionsProblem(name, opts);
  if (problem !== null) throw new Error(problem);
  const serve = files['serve.json'] ? (JSON.parse(files['serve.json'] as string) as Record<string, unknown>) : {};
  if (opts.pooling !== undefined) serve.pooling = opts.pooling;
  if (opts.maxLength !== undefined) serve.maxLength = opts.maxLength;
  files['serve.json'] = JSON.stringify(serve, null, 2) + '\n';
}

export function writePreset(name: string, outDir: string, opts: WriteOptions = {}): WriteResult {
  const files = buildPresetFiles(name);
  withServeOverrides(name, files, opts);
  const dir = join(outDir, opts.folder ?? name);
  mkdirSync(dir, { recursive: true });
  // The quantized graph beside the float one (transformers.js's name for it): --dtype int8 serves it.
  if (opts.int8) files['model_int8.onnx'] = quantizeDynamicInt8(files['model.onnx']);
  if (opts.fp16) files['model_fp16.onnx'] = toFloat16Variant(files['model.onnx']);
  const modelPath = join(dir, 'model.onnx');
  if (existsSync(modelPath)) unlinkSync(modelPath);
  for (const [file, data] of Object.entries(files)) {
    if (file === 'model.onnx') continue;
    mkdirSync(join(dir, file, '..'), { recursive: true });
    writeFileAtomic(join(dir, file), data);
  }
  writeFileAtomic(modelPath, files['model.onnx']);
  return { dir, modelBytes: files['model.onnx'].byteLength };
}
