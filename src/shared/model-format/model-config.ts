/**
 * The model repository: one folder per model, laid out as a Hugging Face
 * export (optimum's, a sentence-transformers folder, or ours from
 * `npm run models`):
 *
 *   <dir>/config.json       Hugging Face config (architectures, hidden_size, id2label, ...)
 *   <dir>/tokenizer.json    Hugging Face tokenizer
 *   <dir>/model.onnx        or <dir>/onnx/model.onnx (optimum's layout)
 *   <dir>/modules.json, 1_Pooling/config.json, sentence_bert_config.json, tokenizer_config.json
 *                           what a sentence-transformers folder says (hf-folder.ts)
 *   <dir>/serve.json        optional: { task, pooling, normalize, maxLength }
 *
 * Tasks: `embed` (a BertModel: pooled, normalised vectors), `classify` (a
 * ForSequenceClassification head: softmax over its labels), `rerank` (a
 * cross-encoder: a ForSequenceClassification head with ONE logit, scored
 * with a sigmoid, fed (query, text) pairs). Without serve.json the task is
 * inferred: a ForSequenceClassification config with one label is a
 * reranker, with more a classifier, anything else an embedding model.
 *
 * Precedence, for pooling, normalize and the max input length: the server's
 * flags (ModelOverrides), then serve.json, then the folder's own files, then
 * the defaults (mean pooling, with a warning; normalised; the model's
 * positions). `sources` says which one decided each.
 *
 * This module turns a folder into a ModelSpec: everything the threads need to
 * agree on (task, lengths, the width of a result row), read once at start.
 */
import { existsSync, readdirSync } from 'node:fs';
import { basename, join } from 'node:path';
import { InvalidModelNameError } from '../errors.js';
import { onnxInputNames } from './onnx-inputs.js';
import { safetensorsShapes } from './safetensors.js';
import { CHECKPOINT_FILES, checkpointFile, POOLINGS, readFolderSettings, readJsonFile, type ColbertFolder, type FolderSettings, type Pooling, type Sourced, type SpladeSettings } from './hf-folder.js';

export { POOLINGS, type Pooling, type SpladeSettings } from './hf-folder.js';

/**
 * What an embedding model can answer with: `dense` pooled rows (/embed),
 * `sparse` weights by token id (/embed_sparse: SPLADE), `tokens` a vector per
 * token (/embed_all: the token states). A classifier or
 * reranker has none of these.
 */
export type ModelOutput = 'dense' | 'sparse' | 'tokens' | 'colbert';

/**
 * BGE-M3's two heads beside its dense row (FlagEmbedding's layout:
 * colbert_linear and sparse_linear in the folder's root, here as safetensors):
 * the token output is each token's normalised colbert vector and its sparse
 * weight, relu(sparse_linear(h)), one column after it (graph.ts, core/m3.ts).
 */
export interface M3Spec {
  colbert: { weightsPath: string; dim: number };
  sparse: { weightsPath: string };
  /** The tokenizer's cls, eos, pad and unk ids: sparse weights leave them out, as FlagEmbedding does. */
  unusedIds: number[];
}

/**
 * A ColBERT model (a PyLate folder) as served: its token vectors are the
 * Dense projection of the token states, L2-normalised (graph.ts); queries and
 * documents get their marker token after [CLS] (core/colbert.ts).
 */
export interface ColbertSpec {
  /** Token ids of the markers; null where the prefix is '' (none inserted). */
  queryPrefixId: number | null;
  documentPrefixId: number | null;
  queryLength: number;
  documentLength: number;
  doQueryExpansion: boolean;
  attendToExpansionTokens: boolean;
  /** The tokenizer's mask token: what an expanded query is padded with. */
  maskId: number;
  /** Token ids whose vectors a document leaves out. */
  skiplistIds: number[];
  /** The projection: weights in `weightsPath` (safetensors: linear.weight [out, in], linear.bias). */
  dense: { weightsPath: string; inFeatures: number; outFeatures: number; bias: boolean; activation: 'identity' | 'tanh' };
}

/** How an embedding model's rows are made: one of sentence-transformers' poolings of the token states, or SPLADE's of the masked-LM logits. */
export type ServedPooling = Pooling | 'splade';

export type Task = 'embed' | 'classify' | 'rerank';
export const TASKS: readonly Task[] = ['embed', 'classify', 'rerank'];

/** Which of a folder's graphs to serve (transformers.js's names): `auto` picks fp16 on CUDA when the folder has one, else fp32. */
export const DTYPES = ['auto', 'fp32', 'fp16', 'int8'] as const;
export type Dtype = (typeof DTYPES)[number];

/** Graph files by dtype, first found wins, in the folder and in onnx/ (optimum's and transformers.js's layout). */
const DTYPE_FILES: Record<Exclude<Dtype, 'auto'>, string[]> = {
  fp32: ['model.onnx'],
  fp16: ['model_fp16.onnx'],
  int8: ['model_int8.onnx', 'model_quantized.onnx'],
};

/** Settings the server's flags impose on every model it serves (pooling on embedding models only). */
export interface ModelOverrides {
  /** Which graph; default auto. */
  dtype?: Dtype;
  /** Whether the device is CUDA (for dtype auto). */
  onCuda?: boolean;
  pooling?: Pooling;
  maxLength?: number;
  /** The prompt put before every text that names none: one of the model's prompts by name, or a literal text. */
  defaultPromptName?: string;
  defaultPrompt?: string;
  /** Where the graph comes from: auto, the folder's graph or else its checkpoint; graph; checkpoint, even beside a graph. */
  weights?: WeightsSource;
}

export const WEIGHTS_SOURCES = ['auto', 'graph', 'checkpoint'] as const;
export type WeightsSource = (typeof WEIGHTS_SOURCES)[number];

/**
 * Builds a graph from the folder's checkpoint (src/main/checkpoint/) with the
 * head the model is served with: the token states, a classifier's logits, or
 * the masked-LM logits (SPLADE). undefined: the folder has no checkpoint.
 */
/** A checkpoint's graph with `head`, computing in `dtype` (float32 in and out either way); undefined where the folder has no checkpoint. */
export type GraphFromCheckpoint = (head: 'hidden' | 'classify' | 'mlm', dtype: BuiltDtype) => { path: string; source: string } | undefined;

/** What a graph built from a checkpoint computes in. */
export type BuiltDtype = 'fp32' | 'fp16';

/** Where each served setting came from: 'flag', 'serve.json', a file of the folder, or 'default'. */
export interface SettingSources {
  task: string;
  dtype: string;
  pooling: string;
  normalize: string;
  maxLength: string;
  /** Absent when there is no default prompt. */
  defaultPrompt?: string;
}

/** Where a model fetched by its Hub id came from (src/main/hub/). */
export interface HubSource {
  /** "ORG/NAME": the model answers to it as well as to its name. */
  repo: string;
  /** The branch, tag or commit asked for. */
  revision: string;
  /** The commit it resolved to, served. */
  commit: string;
}

export interface ModelSpec {
  name: string;
  dir: string;
  /** A model served by its Hub id: which repository and commit. */
  hub?: HubSource;
  onnxPath: string;
  /** Which of the folder's graphs onnxPath is. */
  dtype: Exclude<Dtype, 'auto'>;
  tokenizerPath: string;
  task: Task;
  /** embed only: how token states become one vector ('splade': the masked-LM logits, as {@link splade} says). */
  pooling: ServedPooling;
  /** pooling 'splade' only: SpladePooling's strategy and activation. */
  splade?: SpladeSettings;
  /** A ColBERT model only (outputs ['tokens']): its projection and markers. */
  colbert?: ColbertSpec;
  /** A BGE-M3 model only (outputs dense, sparse and colbert from one pass). */
  m3?: M3Spec;
  /**
   * Floats in an embedding row: the hidden size, or for SPLADE the vocabulary
   * (the row is a weight per token id). classify and rerank: the hidden size.
   */
  dimension: number;
  /** The outputs it serves (embed only; empty for classify and rerank). */
  outputs: readonly ModelOutput[];
  /** Floats per token vector (/embed_all): the hidden size; 0 for a model without token vectors (SPLADE, classify, rerank). */
  tokenWidth: number;
  /** embed only: whether results are L2-normalised unless the caller says otherwise. */
  normalize: boolean;
  /** Longest input in tokens, [CLS] and [SEP] included. */
  maxLength: number;
  hiddenSize: number;
  /** classify: label names by class id; rerank: the one label of its logit; embed: empty. */
  labels: string[];
  /** The graph's token inputs, in its order (input_ids, attention_mask, and token_type_ids / position_ids where it takes them). */
  graphInputs: string[];
  /** Token type ids the model knows (config.json type_vocab_size; 2 for BERT). */
  typeVocabSize?: number;
  /** embed only: texts put before an input by name (config_sentence_transformers.json's prompts). */
  prompts: Record<string, string>;
  /** embed only: the prompt put before a text when the request names none, and its name when it has one. */
  defaultPrompt?: { name?: string; text: string };
  /** false: the prompt's tokens are left out of the pooling (1_Pooling/config.json include_prompt). */
  includePrompt: boolean;
  /** Texts (a prompt with them) are lowercased before the tokenizer (sentence_bert_config.json do_lower_case). */
  lowercase: boolean;
  /** Which flag, file or default decided task, pooling, normalize and maxLength. */
  sources: SettingSources;
  /** What start-up should warn about (a setting left to its default where a folder usually says). */
  warnings: string[];
  /**
   * Floats per result row in the slab. embed: the normalised vector then its
   * norm (so an unnormalised vector is one multiply away); classify:
   * probabilities then logits; rerank: sigmoid(logit) then the logit.
   */
  outputWidth: number;
}

const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export function isValidModelName(name: string): boolean {
  return NAME.test(name) && !name.includes('..');
}

/** Refuses a name no model can have (`..`, slashes, percent signs, over 128 characters) before any lookup. */
export function checkModelName(name: unknown): void {
  if (typeof name !== 'string' || !isValidModelName(name)) throw new InvalidModelNameError(typeof name === 'string' ? name : String(name));
}

/** Folders under `modelsDir` that hold a config.json, sorted by name. */
export function listModelDirs(modelsDir: string): string[] {
  if (!existsSync(modelsDir)) return [];
  return readdirSync(modelsDir, { withFileTypes: true })
    .filter((d) => d.isDirectory() && isValidModelName(d.name) && existsSync(join(modelsDir, d.name, 'config.json')))
    .map((d) => d.name)
    .sort();
}

interface HfConfig {
  architectures?: string[];
  model_type?: string;
  hidden_size?: number;
  /** DistilBERT's name for hidden_size. */
  dim?: number;
  max_position_embeddings?: number;
  pad_token_id?: number;
  id2label?: Record<string, string>;
  num_labels?: number;
  type_vocab_size?: number;
  vocab_size?: number;
}

/** serve.json: what a folder may say about how it is served (a load's parameters.config says the same, over it). */
export interface ServeSettings {
  task?: Task;
  /** 'splade' too, for a ForMaskedLM graph whose folder is no SparseEncoder (TEI's --pooling splade). */
  pooling?: ServedPooling;
  normalize?: boolean;
  maxLength?: number;
  defaultPromptName?: string;
  defaultPrompt?: string;
}

export function loadModelSpec(dir: string, name = basename(dir), overrides: ModelOverrides = {}, serveOver: ServeSettings = {}, fromCheckpoint?: GraphFromCheckpoint): ModelSpec {
  if (!isValidModelName(name)) throw new Error(`invalid model name "${name}"`);
  const config = readJsonFile<HfConfig>(join(dir, 'config.json'));
  const serve: ServeSettings = { ...(existsSync(join(dir, 'serve.json')) ? readJsonFile<ServeSettings>(join(dir, 'serve.json')) : {}), ...serveOver };

  const tokenizerPath = join(dir, 'tokenizer.json');
  if (!existsSync(tokenizerPath)) throw new Error(`model ${name}: no tokenizer.json in ${dir}`);
  // tokenizer.json (often megabytes) is read only where do_lower_case asks what its normalizer does.
  const folder = readFolderSettings(dir, config, () => tokenizerLowercases(readJsonFile(tokenizerPath)));

  const isClassifier = (config.architectures ?? []).some((a) => a.endsWith('ForSequenceClassification'));
  const labelCount = config.id2label ? Object.keys(config.id2label).length : (config.num_labels ?? 0);
  const task: Task = serve.task ?? (isClassifier ? (labelCount === 1 ? 'rerank' : 'classify') : 'embed');
  if (!TASKS.includes(task)) throw new Error(`model ${name}: unknown task "${String(task)}"`);

  const hiddenSize = config.hidden_size ?? config.dim;
  if (!Number.isInteger(hiddenSize) || hiddenSize! < 1) throw new Error(`model ${name}: config.json lacks hidden_size (or DistilBERT's dim)`);

  const warnings: string[] = [];
  const folderPooling = folder.splade ? { value: 'splade' as const, source: folder.splade.source } : folder.pooling;
  const pooling = first<ServedPooling>(sourced(overrides.pooling, 'flag'), sourced(serve.pooling, 'serve.json'), folderPooling) ?? { value: 'mean', source: 'default' };
  if (!POOLINGS.includes(pooling.value as Pooling) && pooling.value !== 'splade') {
    throw new Error(`model ${name}: unknown pooling "${String(pooling.value)}" (${pooling.source}); expected one of ${POOLINGS.join(', ')} or splade`);
  }
  const splade = task === 'embed' && pooling.value === 'splade' ? spladeOf(name, config, folder) : undefined;
  if (task === 'embed' && pooling.source === 'default' && !folder.colbert) {
    warnings.push(`model ${name}: the folder names no pooling (no 1_Pooling/config.json): mean pooling; --pooling or serve.json to choose`);
  }
  // SPLADE weights are served as they are (TEI refuses normalize for them): no Normalize module follows SpladePooling.
  const normalize = first<boolean>(sourced(serve.normalize, 'serve.json'), folder.normalize) ?? (splade ? { value: false, source: 'splade' } : { value: true, source: 'default' });
  if (splade && normalize.value) throw new Error(`model ${name}: SPLADE weights are not normalised (normalize true from ${normalize.source})`);
  const dimension = splade ? config.vocab_size! : hiddenSize!;
  const colbert = task === 'embed' && folder.colbert ? colbertOf(name, dir, folder.colbert, hiddenSize!, tokenizerPath) : undefined;
  const m3 = task === 'embed' && !splade && !colbert ? m3Of(name, dir, hiddenSize!, tokenizerPath, warnings) : undefined;
  const build = fromCheckpoint && ((dtype: BuiltDtype) => fromCheckpoint(task !== 'embed' ? 'classify' : splade ? 'mlm' : 'hidden', dtype));
  const { path: onnxPath, dtype, source: dtypeSource } = chooseGraph(name, dir, overrides, build);
  const graphInputs = tokenInputs(name, onnxPath);
  // PyLate cuts queries and documents to their own lengths; its sentence_bert_config.json records whichever ran last.
  const colbertLength = colbert ? { value: Math.max(colbert.queryLength, colbert.documentLength), source: 'config_sentence_transformers.json' } : undefined;
  const maxLength = inputLimit(name, colbert ? { ...folder, maxSeqLength: colbertLength } : folder, sourced(overrides.maxLength, 'flag'), sourced(serve.maxLength, 'serve.json'));
  const defaultPrompt = task === 'embed' ? chooseDefaultPrompt(name, folder, overrides, serve) : undefined;

  const labels: string[] = [];
  if (task === 'classify') {
    const id2label = config.id2label ?? {};
    const n = Object.keys(id2label).length;
    if (n === 0) throw new Error(`model ${name}: a classifier needs id2label in config.json`);
    for (let i = 0; i < n; i++) labels.push(id2label[String(i)] ?? `LABEL_${i}`);
  } else if (task === 'rerank') {
    if (labelCount > 1) throw new Error(`model ${name}: a reranker has one logit, but config.json names ${labelCount} labels`);
    labels.push(config.id2label?.['0'] ?? 'LABEL_0');
  }

  return {
    name,
    dir,
    onnxPath,
    dtype,
    tokenizerPath,
    task,
    pooling: pooling.value,
    ...(splade ? { splade } : {}),
    dimension,
    outputs: task !== 'embed' ? [] : splade ? ['dense', 'sparse'] : colbert ? ['tokens'] : m3 ? ['dense', 'sparse', 'colbert'] : ['dense', 'tokens'],
    tokenWidth: task !== 'embed' || splade ? 0 : colbert ? colbert.dense.outFeatures : m3 ? m3.colbert.dim + 1 : hiddenSize!,
    ...(colbert ? { colbert } : {}),
    ...(m3 ? { m3 } : {}),
    normalize: normalize.value,
    maxLength: maxLength.value,
    hiddenSize: hiddenSize!,
    labels,
    graphInputs,
    typeVocabSize: config.type_vocab_size ?? 2,
    prompts: task === 'embed' ? folder.prompts : {},
    ...(defaultPrompt ? { defaultPrompt: defaultPrompt.value } : {}),
    includePrompt: folder.includePrompt,
    lowercase: folder.lowercase,
    sources: {
      task: serve.task ? 'serve.json' : 'config.json',
      dtype: dtypeSource,
      pooling: pooling.source,
      normalize: normalize.source,
      maxLength: maxLength.source,
      ...(defaultPrompt ? { defaultPrompt: defaultPrompt.source } : {}),
    },
    warnings,
    outputWidth: task === 'embed' ? dimension + 1 : 2 * labels.length,
  };
}

/** A PyLate folder's settings with its markers, mask and skiplist as token ids of its tokenizer. */
function colbertOf(name: string, dir: string, f: ColbertFolder, hiddenSize: number, tokenizerPath: string): ColbertSpec {
  if (f.inFeatures !== hiddenSize) throw new Error(`model ${name}: ${f.densePath}/config.json in_features ${f.inFeatures} is not the hidden size ${hiddenSize}`);
  const weightsPath = join(dir, f.densePath, 'model.safetensors');
  if (!existsSync(weightsPath)) throw new Error(`model ${name}: no ${f.densePath}/model.safetensors (the Dense projection's weights)`);
  const { ids, special } = tokenizerTokens(dir, tokenizerPath);
  const maskToken = special('mask_token') ?? '[MASK]';
  const id = (token: string, what: string) => {
    const v = ids(token);
    if (v === undefined) throw new Error(`model ${name}: the ${what} "${token}" is not a token of its tokenizer.json`);
    return v;
  };
  return {
    queryPrefixId: f.queryPrefix === '' ? null : id(f.queryPrefix, 'query prefix'),
    documentPrefixId: f.documentPrefix === '' ? null : id(f.documentPrefix, 'document prefix'),
    queryLength: f.queryLength,
    documentLength: f.documentLength,
    doQueryExpansion: f.doQueryExpansion,
    attendToExpansionTokens: f.attendToExpansionTokens && f.doQueryExpansion,
    maskId: id(maskToken, 'mask token'),
    // As PyLate's convert_tokens_to_ids: a word that is no token is left out (it would be [UNK]'s id there).
    skiplistIds: f.skiplistWords.flatMap((w) => ids(w) ?? []),
    dense: { weightsPath, inFeatures: f.inFeatures, outFeatures: f.outFeatures, bias: f.bias, activation: f.activation },
  };
}

/**
 * BGE-M3's heads where the folder has them as safetensors (colbert_linear,
 * sparse_linear: nn.Linear state dicts, weight and bias); FlagEmbedding's
 * torch pickles alone are not read, and the model is served dense only.
 */
function m3Of(name: string, dir: string, hiddenSize: number, tokenizerPath: string, warnings: string[]): M3Spec | undefined {
  const file = (head: string) => join(dir, `${head}.safetensors`);
  const have = (head: string) => existsSync(file(head));
  if (!have('colbert_linear') && !have('sparse_linear')) {
    if (existsSync(join(dir, 'colbert_linear.pt'))) {
      warnings.push(
        `model ${name}: colbert_linear.pt and sparse_linear.pt are torch pickles, not read: served dense only. To serve its sparse and colbert outputs, ` +
          `save them as safetensors beside them: python -c "import torch, safetensors.torch as s; [s.save_file(torch.load(f'${'{h}'}.pt'), f'${'{h}'}.safetensors') for h in ('colbert_linear', 'sparse_linear')]"`,
      );
    }
    return undefined;
  }
  for (const head of ['colbert_linear', 'sparse_linear']) if (!have(head)) throw new Error(`model ${name}: ${head}.safetensors is missing (BGE-M3's heads come as a pair)`);
  const shape = (head: string, key: string) => safetensorsShapes(file(head)).get(key)?.shape.join(',') ?? 'none';
  const colbertShape = shape('colbert_linear', 'weight');
  const dim = Number(colbertShape.split(',')[0]);
  const expect = (head: string, key: string, want: string) => {
    if (shape(head, key) !== want) throw new Error(`model ${name}: ${head}.safetensors ${key} is [${shape(head, key)}], expected [${want}] (hidden size ${hiddenSize})`);
  };
  expect('colbert_linear', 'weight', `${dim},${hiddenSize}`);
  expect('colbert_linear', 'bias', `${dim}`);
  expect('sparse_linear', 'weight', `1,${hiddenSize}`);
  expect('sparse_linear', 'bias', '1');
  const { ids, special } = tokenizerTokens(dir, tokenizerPath);
  const unusedIds = ['cls_token', 'eos_token', 'pad_token', 'unk_token'].flatMap((k) => {
    const text = special(k);
    const id = text === undefined ? undefined : ids(text);
    return id === undefined ? [] : [id];
  });
  return { colbert: { weightsPath: file('colbert_linear'), dim }, sparse: { weightsPath: file('sparse_linear') }, unusedIds: [...new Set(unusedIds)] };
}

/** A folder's token ids (tokenizer.json) and its special tokens by role (tokenizer_config.json's mask_token, cls_token, ...). */
function tokenizerTokens(dir: string, tokenizerPath: string): { ids: (token: string) => number | undefined; special: (key: string) => string | undefined } {
  const ids = tokenIdsOf(readJsonFile(tokenizerPath));
  const configPath = join(dir, 'tokenizer_config.json');
  const config = existsSync(configPath) ? readJsonFile<Record<string, unknown>>(configPath) : {};
  const special = (key: string) => {
    const token = config[key] as string | { content?: unknown } | undefined; // a text, or an AddedToken as transformers saves some
    return typeof token === 'string' ? token : typeof token?.content === 'string' ? token.content : undefined;
  };
  return { ids, special };
}

/** A token's id in tokenizer.json: its added tokens, then the model's vocabulary (an object for WordPiece and BPE, [piece, score] pairs for Unigram). */
function tokenIdsOf(tokenizerJson: unknown): (token: string) => number | undefined {
  const t = tokenizerJson as { added_tokens?: { id: number; content: string }[]; model?: { vocab?: unknown } } | null;
  const map = new Map<string, number>();
  const vocab = t?.model?.vocab;
  if (Array.isArray(vocab)) vocab.forEach((entry, i) => map.set(String((entry as unknown[])[0]), i));
  else if (vocab && typeof vocab === 'object') for (const [k, v] of Object.entries(vocab)) map.set(k, Number(v));
  for (const a of t?.added_tokens ?? []) map.set(a.content, a.id);
  return (token) => map.get(token);
}

/**
 * SPLADE's settings: the folder's SpladePooling, or max over log(1 + relu) where
 * serve.json asked for it. The graph must be a masked-LM's (TEI's check: its
 * logits are per vocabulary entry), and config.json must say the vocabulary's size.
 */
function spladeOf(name: string, config: HfConfig, folder: FolderSettings): SpladeSettings {
  if (!(config.architectures ?? []).some((a) => a.endsWith('ForMaskedLM'))) {
    throw new Error(`model ${name}: SPLADE pooling needs a ForMaskedLM model (config.json architectures: ${(config.architectures ?? []).join(', ') || 'none'})`);
  }
  if (!Number.isInteger(config.vocab_size) || config.vocab_size! < 1) throw new Error(`model ${name}: config.json lacks vocab_size, which SPLADE rows are as wide as`);
  return folder.splade?.value ?? { strategy: 'max', activation: 'relu' };
}

/**
 * The default prompt: a literal text or a name of the model's prompts, from the
 * flags, then serve.json, then config_sentence_transformers.json's
 * default_prompt_name. A name the model does not have is an error.
 */
function chooseDefaultPrompt(name: string, folder: FolderSettings, overrides: ModelOverrides, serve: ServeSettings): Sourced<{ name?: string; text: string }> | undefined {
  const literal = first(sourced(overrides.defaultPrompt, 'flag'), sourced(serve.defaultPrompt, 'serve.json'));
  const named = first(sourced(overrides.defaultPromptName, 'flag'), sourced(serve.defaultPromptName, 'serve.json'), folder.defaultPromptName);
  // A literal text given at a level outranks a name given below it.
  const order = ['flag', 'serve.json', 'config_sentence_transformers.json'];
  const rank = (s: Sourced<unknown> | undefined) => (s === undefined ? order.length : order.indexOf(s.source));
  if (literal && rank(literal) <= rank(named)) return { value: { text: literal.value }, source: literal.source };
  if (!named) return undefined;
  const text = folder.prompts[named.value];
  if (text === undefined) {
    const known = Object.keys(folder.prompts);
    throw new Error(`model ${name}: default prompt name "${named.value}" (${named.source}) is not one of its prompts (${known.length ? known.join(', ') : 'it has none'})`);
  }
  return { value: { name: named.value, text }, source: named.source };
}

/** The graph files of `dtype` a folder may hold, relative to it, in the order the first found wins. */
export function graphFiles(dtype: Exclude<Dtype, 'auto'>): string[] {
  return DTYPE_FILES[dtype].flatMap((f) => [f, `onnx/${f}`]);
}

/**
 * The graph to serve, from what the folder `where` has (`has(relativePath)`):
 * the dtype asked for (its file must be there), or with auto fp16 on CUDA
 * where the folder has it, else fp32. Throws the reason when none fits.
 */
export function pickGraph(name: string, where: string, has: (file: string) => boolean, overrides: ModelOverrides): { file: string; dtype: Exclude<Dtype, 'auto'>; source: string } {
  const find = (d: Exclude<Dtype, 'auto'>) => graphFiles(d).find(has);
  const asked = overrides.dtype ?? 'auto';
  if (!DTYPES.includes(asked)) throw new Error(`unknown dtype "${String(asked)}"; expected one of ${DTYPES.join(', ')}`);
  if (asked !== 'auto') {
    const file = find(asked);
    if (!file) {
      const have = (['fp32', 'fp16', 'int8'] as const).filter((d) => find(d));
      throw new Error(`model ${name}: --dtype ${asked} but ${where} has no ${DTYPE_FILES[asked].join(' or ')} (in it or onnx/); it has: ${have.join(', ') || 'no graph'}`);
    }
    return { file, dtype: asked, source: 'flag' };
  }
  const fp16 = overrides.onCuda ? find('fp16') : undefined;
  if (fp16) return { file: fp16, dtype: 'fp16', source: 'default (CUDA)' };
  const fp32 = find('fp32');
  if (!fp32) throw new Error(`model ${name}: no model.onnx or onnx/model.onnx in ${where}`);
  return { file: fp32, dtype: 'fp32', source: 'default' };
}

/**
 * The folder's graph, or one built from its checkpoint: where it has no graph
 * (weights auto), or always (weights checkpoint). A built graph computes in
 * the dtype asked for; auto: fp16 on CUDA, as TEI does, else fp32.
 */
function chooseGraph(name: string, dir: string, overrides: ModelOverrides, build?: (dtype: BuiltDtype) => { path: string; source: string } | undefined): { path: string; dtype: Exclude<Dtype, 'auto'>; source: string } {
  const weights = overrides.weights ?? 'auto';
  const checkpoint = checkpointFile(dir);
  const noGraph = !(['fp32', 'fp16', 'int8'] as const).some((d) => graphFiles(d).some((f) => existsSync(join(dir, f))));
  if (weights === 'checkpoint' && !checkpoint) throw new Error(`model ${name}: --weights checkpoint, but ${dir} has no checkpoint (${CHECKPOINT_FILES.join(', ')})`);
  if (build && checkpoint && (weights === 'checkpoint' || (weights === 'auto' && noGraph))) {
    const asked = overrides.dtype ?? 'auto';
    if (asked === 'int8') throw new Error(`model ${name}: --dtype int8: a graph built from a checkpoint (${checkpoint}) computes in fp32 or fp16 (--dtype fp32, fp16 or auto)`);
    const dtype: BuiltDtype = asked === 'auto' ? (overrides.onCuda ? 'fp16' : 'fp32') : asked;
    const built = build(dtype);
    if (built) return { path: built.path, dtype, source: `${built.source}, ${dtype}: ${asked === 'auto' ? (dtype === 'fp16' ? 'default (CUDA)' : 'default') : 'flag'}` };
  }
  if (noGraph && !checkpoint) throw new Error(`model ${name}: ${dir} has no ONNX graph (model.onnx, onnx/model.onnx, ...) and no checkpoint (${CHECKPOINT_FILES.join(', ')})`);
  const { file, dtype, source } = pickGraph(name, dir, (f) => existsSync(join(dir, f)), overrides);
  return { path: join(dir, file), dtype, source };
}

/**
 * Where each setting of a model as served came from: the spec's, but a max
 * length cut to the longest bucket (`servedMaxLength` below the model's) is the
 * buckets' ('buckets').
 */
export function servedSources(spec: ModelSpec, servedMaxLength: number): SettingSources {
  return servedMaxLength < spec.maxLength ? { ...spec.sources, maxLength: 'buckets' } : spec.sources;
}

function sourced<T>(value: T | undefined, source: string): Sourced<T> | undefined {
  return value === undefined ? undefined : { value, source };
}

/** The first setting given, in order of precedence. */
function first<T>(...candidates: (Sourced<T> | undefined)[]): Sourced<T> | undefined {
  return candidates.find((c) => c !== undefined);
}

/**
 * Longest input in tokens: a flag, serve.json or sentence_bert_config.json's
 * max_seq_length, else the model's positions capped by the tokenizer's
 * model_max_length. Asked for more than the model has positions, it refuses.
 */
function inputLimit(name: string, folder: FolderSettings, flag?: Sourced<number>, serve?: Sourced<number>): Sourced<number> {
  const positions = folder.positions;
  const asked = first(flag, serve, folder.maxSeqLength);
  if (asked) {
    if (!Number.isInteger(asked.value) || asked.value < 1) throw new Error(`model ${name}: max input length must be a positive integer, got ${String(asked.value)} (${asked.source})`);
    if (asked.value > positions.value) {
      throw new Error(`model ${name}: max input length ${asked.value} (${asked.source}) exceeds the model's ${positions.value} positions (${positions.source})`);
    }
    return asked;
  }
  const tok = folder.tokenizerMaxLength;
  return tok && tok.value < positions.value ? tok : positions;
}

/** Inputs a token graph may take; anything else it lists is an initializer (older exports list those too). */
const TOKEN_INPUTS = ['input_ids', 'attention_mask', 'token_type_ids', 'position_ids'];

/** The graph's token inputs, read from the file's header; input_ids and attention_mask are required. */
function tokenInputs(name: string, onnxPath: string): string[] {
  let all: string[];
  try {
    all = onnxInputNames(onnxPath);
  } catch (err) {
    throw new Error(`model ${name}: ${onnxPath}: ${(err as Error).message}`);
  }
  for (const need of ['input_ids', 'attention_mask']) {
    if (!all.includes(need)) throw new Error(`model ${name}: the graph has no input "${need}" (its inputs: ${all.join(', ') || 'none'})`);
  }
  return all.filter((i) => TOKEN_INPUTS.includes(i));
}

/** Whether tokenizer.json's normalizer lowercases (BertNormalizer's lowercase, or a Lowercase step). */
function tokenizerLowercases(tokenizerJson: unknown): boolean {
  const lowers = (n: unknown): boolean => {
    if (typeof n !== 'object' || n === null) return false;
    const o = n as { type?: unknown; lowercase?: unknown; normalizers?: unknown };
    if (o.type === 'Lowercase') return true;
    if (o.type === 'BertNormalizer') return o.lowercase !== false;
    return o.type === 'Sequence' && Array.isArray(o.normalizers) && o.normalizers.some(lowers);
  };
  return lowers((tokenizerJson as { normalizer?: unknown } | null)?.normalizer);
}
