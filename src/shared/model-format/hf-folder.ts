/**
 * What a Hugging Face / sentence-transformers model folder says about how it
 * is to be served, read as sentence-transformers and text-embeddings-inference
 * read it:
 *
 *   modules.json                  the module chain: Transformer, Pooling, Normalize, or a
 *                                 SparseEncoder's MLMTransformer and SpladePooling (SPLADE), or
 *                                 PyLate's Transformer and Dense (ColBERT: a vector per token);
 *                                 modules that change the vectors otherwise are refused
 *   <pooling>/config.json         the pooling mode (1_Pooling/config.json in every export seen),
 *                                 or SpladePooling's strategy and activation
 *   sentence_bert_config.json     max_seq_length, do_lower_case (texts lowercased before the tokenizer)
 *   config.json                   model_type, max_position_embeddings, pad_token_id
 *   tokenizer_config.json         model_max_length
 *   config_sentence_transformers.json   prompts, default_prompt_name; a PyLate folder's query and
 *                                 document prefixes, lengths, query expansion and skiplist
 *
 * Each setting comes with the file it came from (`source`), so that start-up
 * and /info can say why a model is served as it is. Nothing here knows about
 * flags or serve.json: model-config.ts puts those on top.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { basename, dirname } from 'node:path/posix'; // Hub paths and folder names: '/' between parts

/** Pooling modes, as sentence-transformers names them (its Pooling module's `pooling_mode_*` keys). */
export const POOLINGS = ['cls', 'mean', 'max', 'mean_sqrt_len', 'weightedmean', 'lasttoken'] as const;
export type Pooling = (typeof POOLINGS)[number];

/**
 * SPLADE's pooling (sentence-transformers' SpladePooling): per vocabulary
 * entry, log(1 + relu(logit)) (twice log1p with `log1p_relu`) over the real
 * tokens, by max or sum.
 */
export interface SpladeSettings {
  strategy: 'max' | 'sum';
  activation: 'relu' | 'log1p_relu';
}

/** A value and the file (or 'default') it came from. */
export interface Sourced<T> {
  value: T;
  source: string;
}

/** What a PyLate (ColBERT) folder says: its Dense projection, and how queries and documents are marked. */
export interface ColbertFolder {
  /** The Dense module's folder, relative to the model's (1_Dense), with its config.json and model.safetensors. */
  densePath: string;
  inFeatures: number;
  outFeatures: number;
  bias: boolean;
  activation: 'identity' | 'tanh';
  /** Tokens put after [CLS] (PyLate: "[Q] " and "[D] ", or colbert-ir's [unused0] and [unused1]); '' for none. */
  queryPrefix: string;
  documentPrefix: string;
  /** Tokens of a query (padded to it with [MASK] when expanded) and at most of a document, the prefix included. */
  queryLength: number;
  documentLength: number;
  doQueryExpansion: boolean;
  attendToExpansionTokens: boolean;
  /** Tokens whose vectors a document leaves out (punctuation by default). */
  skiplistWords: string[];
}

/** PyLate's defaults, where its config_sentence_transformers.json says nothing. */
const PYLATE_DEFAULTS = {
  queryPrefix: '[Q] ',
  documentPrefix: '[D] ',
  queryLength: 32,
  documentLength: 180,
  doQueryExpansion: true,
  attendToExpansionTokens: false,
  skiplistWords: [...'!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~'],
} as const;

export interface FolderSettings {
  /** From the Pooling module's config.json; absent when the folder has none. */
  pooling?: Sourced<Pooling>;
  /** A SparseEncoder folder's SpladePooling (its config.json); absent otherwise. */
  splade?: Sourced<SpladeSettings>;
  /** A PyLate folder's ColBERT settings; absent otherwise. */
  colbert?: ColbertFolder;
  /** Whether modules.json ends in a Normalize module; absent without modules.json. */
  normalize?: Sourced<boolean>;
  /** sentence_bert_config.json's max_seq_length. */
  maxSeqLength?: Sourced<number>;
  /** Positions the model has for tokens: max_position_embeddings, less the RoBERTa family's offset. */
  positions: Sourced<number>;
  /** tokenizer_config.json's model_max_length, where it is a real limit. */
  tokenizerMaxLength?: Sourced<number>;
  /** config_sentence_transformers.json's prompts by name (texts put before an input), and the default one's name. */
  prompts: Record<string, string>;
  defaultPromptName?: Sourced<string>;
  /** The Pooling module's include_prompt: false means the prompt's tokens are left out of the pooling. */
  includePrompt: boolean;
  /** sentence_bert_config.json's do_lower_case, where the tokenizer does not lowercase by itself: texts are lowercased first. */
  lowercase: boolean;
}

/** config.json's fields this module reads. */
interface HfConfigFields {
  model_type?: string;
  max_position_embeddings?: number;
  pad_token_id?: number;
}

interface StModule {
  idx?: number;
  name?: string;
  path?: string;
  type?: string;
}

/** The RoBERTa family numbers positions from pad_token_id + 1: 514 position embeddings are 512 tokens. */
const PADDING_OFFSET_FAMILIES = new Set(['roberta', 'xlm-roberta', 'camembert', 'xlm-roberta-xl', 'mpnet']);

/** The checkpoint files a folder may hold, in the order the first found wins (transformers' order). */
export const CHECKPOINT_FILES = ['model.safetensors', 'model.safetensors.index.json', 'pytorch_model.bin', 'pytorch_model.bin.index.json'] as const;

/** The checkpoint file of `dir` (its index for a sharded one), or undefined. */
export function checkpointFile(dir: string): string | undefined {
  return CHECKPOINT_FILES.find((f) => existsSync(join(dir, f)));
}

/** A graph's external data files among `paths` (model.onnx_data, model.onnx.data, model.onnx_data_1, ...): beside it, named after it. */
export function externalDataFiles(paths: readonly string[], graph: string): string[] {
  const dir = dirname(graph);
  const stem = basename(graph);
  return paths.filter((p) => dirname(p) === dir && p !== graph && (basename(p).startsWith(`${stem}_data`) || basename(p).startsWith(`${stem}.data`)));
}

/** Transformers' "no limit" value of model_max_length (int(1e30)) and anything like it. */
const NO_TOKENIZER_LIMIT = 1e9;

export function readJsonFile<T>(path: string): T {
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as T;
  } catch (err) {
    throw new Error(`cannot read ${path}: ${(err as Error).message}`);
  }
}

function readOptional<T>(dir: string, file: string): T | undefined {
  const path = join(dir, file);
  return existsSync(path) ? readJsonFile<T>(path) : undefined;
}

/** Reads what the folder says; throws, naming the file, on what it says that cannot be served as it asks. */
export function readFolderSettings(dir: string, config: HfConfigFields, tokenizerLowercases: () => boolean): FolderSettings {
  const modules = readOptional<StModule[]>(dir, 'modules.json');
  if (modules !== undefined && !Array.isArray(modules)) throw new Error(`${join(dir, 'modules.json')}: expected a list of modules`);
  checkModules(dir, modules ?? []);
  const poolingDir = modules?.find((m) => moduleKind(m) === 'Pooling')?.path ?? '1_Pooling';
  const settings: FolderSettings = { positions: modelPositions(config), prompts: {}, includePrompt: true, lowercase: false };

  const poolingFile = `${poolingDir}/config.json`;
  const poolingConfig = readOptional<Record<string, unknown>>(dir, poolingFile);
  if (poolingConfig) {
    settings.pooling = { value: poolingMode(poolingConfig, join(dir, poolingFile)), source: poolingFile };
    settings.includePrompt = poolingConfig.include_prompt !== false;
  }
  readPrompts(dir, settings);
  if (modules) settings.normalize = { value: modules.some((m) => moduleKind(m) === 'Normalize'), source: 'modules.json' };
  const spladeModule = modules?.find((m) => moduleKind(m) === 'SpladePooling');
  if (spladeModule) settings.splade = readSplade(dir, spladeModule.path ?? '1_SpladePooling');
  const denseModule = modules?.find((m) => moduleKind(m) === 'Dense');
  if (denseModule && modules!.some(isPylate)) settings.colbert = readColbert(dir, denseModule.path ?? '1_Dense');

  const sbert = readOptional<{ max_seq_length?: unknown; do_lower_case?: unknown }>(dir, 'sentence_bert_config.json');
  if (sbert?.max_seq_length !== undefined) {
    const n = sbert.max_seq_length;
    if (!Number.isInteger(n) || (n as number) < 1) throw new Error(`${join(dir, 'sentence_bert_config.json')}: max_seq_length must be a positive integer, got ${String(n)}`);
    settings.maxSeqLength = { value: n as number, source: 'sentence_bert_config.json' };
  }
  // sentence-transformers lowercases the texts itself before its tokenizer; where the tokenizer
  // lowercases anyway, that changes nothing.
  settings.lowercase = sbert?.do_lower_case === true && !tokenizerLowercases();

  const tokenizerConfig = readOptional<{ model_max_length?: unknown }>(dir, 'tokenizer_config.json');
  const limit = tokenizerConfig?.model_max_length;
  if (typeof limit === 'number' && Number.isInteger(limit) && limit > 0 && limit < NO_TOKENIZER_LIMIT) {
    settings.tokenizerMaxLength = { value: limit, source: 'tokenizer_config.json' };
  }
  return settings;
}

/** config_sentence_transformers.json: `prompts` (name -> text) and `default_prompt_name`. */
function readPrompts(dir: string, settings: FolderSettings): void {
  const file = 'config_sentence_transformers.json';
  const st = readOptional<{ prompts?: unknown; default_prompt_name?: unknown }>(dir, file);
  if (!st) return;
  const path = join(dir, file);
  if (st.prompts !== undefined && st.prompts !== null) {
    if (typeof st.prompts !== 'object' || Array.isArray(st.prompts)) throw new Error(`${path}: prompts must be an object of name: text`);
    for (const [name, text] of Object.entries(st.prompts)) {
      if (typeof text !== 'string') throw new Error(`${path}: prompt "${name}" must be a text`);
      settings.prompts[name] = text;
    }
  }
  if (typeof st.default_prompt_name === 'string') settings.defaultPromptName = { value: st.default_prompt_name, source: file };
}

/** "sentence_transformers.models.Pooling" -> "Pooling". */
function moduleKind(m: StModule): string {
  return String(m.type ?? '').split('.').pop() ?? '';
}

/** Module chains served: a SentenceTransformer's, and a SparseEncoder's (SPLADE). */
const DENSE_MODULES = new Set(['Transformer', 'Pooling', 'Normalize']);
const SPARSE_MODULES = new Set(['MLMTransformer', 'SpladePooling']);
/** PyLate's chain: the Transformer's token states projected by its own Dense module (pylate.models.Dense). */
const COLBERT_MODULES = new Set(['Transformer', 'Dense']);

/** Whether a module is PyLate's (a ColBERT folder), not sentence-transformers' own Dense after a Pooling. */
const isPylate = (m: StModule) => String(m.type ?? '').startsWith('pylate.');

function checkModules(dir: string, modules: StModule[]): void {
  const sparse = modules.some((m) => SPARSE_MODULES.has(moduleKind(m)));
  const served = sparse ? SPARSE_MODULES : modules.some(isPylate) ? COLBERT_MODULES : DENSE_MODULES;
  for (const m of modules) {
    const kind = moduleKind(m);
    if (!served.has(kind)) {
      throw new Error(
        `${join(dir, 'modules.json')}: module ${m.path ?? m.name ?? '?'} (${m.type ?? 'no type'}) is not supported: ` +
          `slabserve serves Transformer, Pooling and Normalize modules, MLMTransformer then SpladePooling, or PyLate's Transformer then Dense, and the vectors would not be the model's without it`,
      );
    }
  }
  if (sparse && !(modules.some((m) => moduleKind(m) === 'MLMTransformer') && modules.some((m) => moduleKind(m) === 'SpladePooling'))) {
    throw new Error(`${join(dir, 'modules.json')}: a SparseEncoder folder needs both MLMTransformer and SpladePooling`);
  }
  if (served === COLBERT_MODULES && modules.filter((m) => moduleKind(m) === 'Dense').length !== 1) {
    throw new Error(`${join(dir, 'modules.json')}: a PyLate folder with ${modules.filter((m) => moduleKind(m) === 'Dense').length} Dense modules is not supported (one is)`);
  }
}

/** A PyLate folder: its Dense module's config.json, and config_sentence_transformers.json's ColBERT fields (PyLate's defaults where absent). */
function readColbert(dir: string, densePath: string): ColbertFolder {
  const file = `${densePath}/config.json`;
  const dense = readOptional<{ in_features?: unknown; out_features?: unknown; bias?: unknown; activation_function?: unknown; use_residual?: unknown }>(dir, file);
  if (!dense) throw new Error(`${join(dir, file)}: missing (the Dense module's in_features, out_features, bias, activation_function)`);
  // PyLate's residual Dense (since late 2025) adds a second projection of the input: not served.
  if (dense.use_residual === true) throw new Error(`${join(dir, file)}: use_residual true is not supported (a Dense without the residual projection is)`);
  const positive = (v: unknown, what: string, where: string) => {
    if (!Number.isInteger(v) || (v as number) < 1) throw new Error(`${where}: ${what} must be a positive integer, got ${String(v)}`);
    return v as number;
  };
  const act = String(dense.activation_function ?? 'torch.nn.modules.linear.Identity');
  const activation = act.endsWith('Identity') ? 'identity' : act.endsWith('Tanh') ? 'tanh' : null;
  if (!activation) throw new Error(`${join(dir, file)}: activation_function ${act} is not supported (Identity or Tanh)`);
  const stFile = 'config_sentence_transformers.json';
  const st = readOptional<Record<string, unknown>>(dir, stFile) ?? {};
  const where = join(dir, stFile);
  const text = (k: string, d: string) => (st[k] === undefined || st[k] === null ? d : typeof st[k] === 'string' ? st[k] : fail(`${where}: ${k} must be a text`));
  const flag = (k: string, d: boolean) => (st[k] === undefined || st[k] === null ? d : typeof st[k] === 'boolean' ? st[k] : fail(`${where}: ${k} must be true or false`));
  const skiplist = st.skiplist_words ?? PYLATE_DEFAULTS.skiplistWords;
  if (!Array.isArray(skiplist) || !skiplist.every((w) => typeof w === 'string')) throw new Error(`${where}: skiplist_words must be a list of texts`);
  return {
    densePath,
    inFeatures: positive(dense.in_features, 'in_features', join(dir, file)),
    outFeatures: positive(dense.out_features, 'out_features', join(dir, file)),
    bias: dense.bias !== false,
    activation,
    queryPrefix: text('query_prefix', PYLATE_DEFAULTS.queryPrefix),
    documentPrefix: text('document_prefix', PYLATE_DEFAULTS.documentPrefix),
    queryLength: st.query_length == null ? PYLATE_DEFAULTS.queryLength : positive(st.query_length, 'query_length', where),
    documentLength: st.document_length == null ? PYLATE_DEFAULTS.documentLength : positive(st.document_length, 'document_length', where),
    doQueryExpansion: flag('do_query_expansion', PYLATE_DEFAULTS.doQueryExpansion),
    attendToExpansionTokens: flag('attend_to_expansion_tokens', PYLATE_DEFAULTS.attendToExpansionTokens),
    skiplistWords: skiplist as string[],
  };
}

function fail(message: string): never {
  throw new Error(message);
}

/** SpladePooling's config.json (its defaults where a key is missing, as sentence-transformers has them). */
function readSplade(dir: string, path: string): Sourced<SpladeSettings> {
  const file = `${path ? `${path}/` : ''}config.json`;
  const config = readOptional<{ pooling_strategy?: unknown; activation_function?: unknown }>(dir, file) ?? {};
  const strategy = config.pooling_strategy ?? 'max';
  const activation = config.activation_function ?? 'relu';
  if (strategy !== 'max' && strategy !== 'sum') throw new Error(`${join(dir, file)}: pooling_strategy must be "max" or "sum", got ${String(strategy)}`);
  if (activation !== 'relu' && activation !== 'log1p_relu') throw new Error(`${join(dir, file)}: activation_function must be "relu" or "log1p_relu", got ${String(activation)}`);
  return { value: { strategy, activation }, source: file };
}

/** The one pooling mode a sentence-transformers Pooling config turns on. */
function poolingMode(config: Record<string, unknown>, path: string): Pooling {
  const keys: Record<Pooling, string> = {
    cls: 'pooling_mode_cls_token',
    mean: 'pooling_mode_mean_tokens',
    max: 'pooling_mode_max_tokens',
    mean_sqrt_len: 'pooling_mode_mean_sqrt_len_tokens',
    weightedmean: 'pooling_mode_weightedmean_tokens',
    lasttoken: 'pooling_mode_lasttoken',
  };
  const on = POOLINGS.filter((p) => config[keys[p]] === true);
  if (on.length === 0) throw new Error(`${path}: no pooling mode is on (expected one of ${Object.values(keys).join(', ')})`);
  if (on.length > 1) throw new Error(`${path}: ${on.join(' and ')} pooling together (their vectors concatenated) is not supported`);
  return on[0]!;
}

function modelPositions(config: HfConfigFields): Sourced<number> {
  const positions = config.max_position_embeddings;
  if (positions === undefined) return { value: 512, source: 'default' };
  if (!Number.isInteger(positions) || positions < 1) throw new Error(`config.json: max_position_embeddings must be a positive integer, got ${String(positions)}`);
  const offset = PADDING_OFFSET_FAMILIES.has(String(config.model_type)) ? (config.pad_token_id ?? 1) + 1 : 0;
  return { value: positions - offset, source: 'config.json' };
}
