/**
 * The model repository: one folder per model, laid out as a Hugging Face
 * export (optimum's, or ours from `npm run models`):
 *
 *   <dir>/config.json       Hugging Face config (architectures, hidden_size, id2label, ...)
 *   <dir>/tokenizer.json    Hugging Face tokenizer
 *   <dir>/model.onnx        or <dir>/onnx/model.onnx (optimum's layout)
 *   <dir>/serve.json        optional: { task, pooling, normalize, maxLength }
 *
 * Tasks: `embed` (a BertModel: pooled, normalised vectors), `classify` (a
 * ForSequenceClassification head: softmax over its labels), `rerank` (a
 * cross-encoder: a ForSequenceClassification head with ONE logit, scored
 * with a sigmoid, fed (query, text) pairs). Without serve.json the task is
 * inferred: a ForSequenceClassification config with one label is a
 * reranker, with more a classifier, anything else an embedding model.
 *
 * This module turns a folder into a ModelSpec: everything the threads need to
 * agree on (task, lengths, the width of a result row), read once at start.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { basename, join } from 'node:path';

export type Task = 'embed' | 'classify' | 'rerank';
export const TASKS: readonly Task[] = ['embed', 'classify', 'rerank'];
export type Pooling = 'mean' | 'cls';

export interface ModelSpec {
  name: string;
  dir: string;
  onnxPath: string;
  tokenizerPath: string;
  task: Task;
  /** embed only: how token states become one vector. */
  pooling: Pooling;
  /** embed only: whether results are L2-normalised unless the caller says otherwise. */
  normalize: boolean;
  /** Longest input in tokens, [CLS] and [SEP] included. */
  maxLength: number;
  hiddenSize: number;
  /** classify: label names by class id; rerank: the one label of its logit; embed: empty. */
  labels: string[];
  /** Token type ids the model knows (config.json type_vocab_size; 2 for BERT). */
  typeVocabSize?: number;
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
  hidden_size?: number;
  max_position_embeddings?: number;
  id2label?: Record<string, string>;
  num_labels?: number;
  type_vocab_size?: number;
}

interface ServeJson {
  task?: Task;
  pooling?: Pooling;
  normalize?: boolean;
  maxLength?: number;
}

function readJson<T>(path: string): T {
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as T;
  } catch (err) {
    throw new Error(`cannot read ${path}: ${(err as Error).message}`);
  }
}

export function loadModelSpec(dir: string, name = basename(dir)): ModelSpec {
  if (!isValidModelName(name)) throw new Error(`invalid model name "${name}"`);
  const config = readJson<HfConfig>(join(dir, 'config.json'));
  const serve: ServeJson = existsSync(join(dir, 'serve.json')) ? readJson<ServeJson>(join(dir, 'serve.json')) : {};

  const onnxPath = [join(dir, 'model.onnx'), join(dir, 'onnx', 'model.onnx')].find((p) => existsSync(p));
  if (!onnxPath) throw new Error(`model ${name}: no model.onnx or onnx/model.onnx in ${dir}`);
  const tokenizerPath = join(dir, 'tokenizer.json');
  if (!existsSync(tokenizerPath)) throw new Error(`model ${name}: no tokenizer.json in ${dir}`);

  const isClassifier = (config.architectures ?? []).some((a) => a.endsWith('ForSequenceClassification'));
  const labelCount = config.id2label ? Object.keys(config.id2label).length : (config.num_labels ?? 0);
  const task: Task = serve.task ?? (isClassifier ? (labelCount === 1 ? 'rerank' : 'classify') : 'embed');
  if (!TASKS.includes(task)) throw new Error(`model ${name}: unknown task "${String(task)}"`);

  const hiddenSize = config.hidden_size;
  if (!Number.isInteger(hiddenSize) || hiddenSize! < 1) throw new Error(`model ${name}: config.json lacks hidden_size`);
  const maxPositions = config.max_position_embeddings ?? 512;
  const maxLength = Math.min(serve.maxLength ?? maxPositions, maxPositions);

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
    tokenizerPath,
    task,
    pooling: serve.pooling ?? 'mean',
    normalize: serve.normalize ?? true,
    maxLength,
    hiddenSize: hiddenSize!,
    labels,
    typeVocabSize: config.type_vocab_size ?? 2,
    outputWidth: task === 'embed' ? hiddenSize! + 1 : 2 * labels.length,
  };
}
