/**
 * Which of a repository's files a served model needs: its configs, its
 * tokenizer, its sentence-transformers modules' settings and weights, and one
 * graph (the one --dtype picks, as a local folder would be read), with its
 * external data. Never the other variants (other dtypes, O1-O4 graphs,
 * OpenVINO, other frameworks' weights); the checkpoint only where the
 * repository has no graph at all (or --weights checkpoint asks for it).
 */
import { externalDataFiles } from '../../shared/model-format/hf-folder.js';
import { graphFiles, pickGraph, type ModelOverrides } from '../../shared/model-format/model-config.js';

/** Read as a local folder is (model-config.ts, hf-folder.ts, the tokenizer), wherever present. */
const SETTINGS = new Set([
  'config.json',
  'serve.json',
  'modules.json',
  'sentence_bert_config.json',
  'config_sentence_transformers.json',
  'tokenizer.json',
  'tokenizer_config.json',
  'special_tokens_map.json',
  'added_tokens.json',
  'vocab.txt',
  // BGE-M3's sparse and ColBERT heads
  'colbert_linear.safetensors',
  'sparse_linear.safetensors',
]);
/** A sentence-transformers module's folder (1_Pooling, 2_Dense, ...): its config and, for Dense, its weights. */
const MODULE_FILE = /^\d+_[A-Za-z]\w*\/(?:[^/]+\.json|model\.safetensors)$/;
const CHECKPOINTS: RegExp[] = [
  /^model\.safetensors$/,
  /^model\.safetensors\.index\.json$|^model-\d+-of-\d+\.safetensors$/,
  /^pytorch_model\.bin$/,
  /^pytorch_model\.bin\.index\.json$|^pytorch_model-\d+-of-\d+\.bin$/,
];

export interface PickedFiles {
  /** Paths to fetch, relative to the repository. */
  files: string[];
  /** The graph among them; null when the repository has none and its checkpoint comes instead. */
  graph: string | null;
}

/** Throws, naming what the repository has, when it holds nothing slabserve can serve. */
export function pickFiles(paths: readonly string[], where: string, name: string, overrides: ModelOverrides): PickedFiles {
  const has = new Set(paths);
  const settings = paths.filter((p) => SETTINGS.has(p) || MODULE_FILE.test(p));
  if (!has.has('config.json')) throw new Error(`${where} has no config.json: not a transformers model (it has: ${listed(paths)})`);
  const anyGraph = (['fp32', 'fp16', 'int8'] as const).some((d) => graphFiles(d).some((f) => has.has(f)));
  // --weights: graph never takes the checkpoint; checkpoint takes it even beside a graph.
  if (anyGraph && overrides.weights !== 'checkpoint') {
    const { file } = pickGraph(name, where, (f) => has.has(f), overrides);
    return { files: [...settings, file, ...externalDataFiles(paths, file)], graph: file };
  }
  for (const pattern of overrides.weights === 'graph' ? [] : CHECKPOINTS) {
    const weights = paths.filter((p) => pattern.test(p));
    if (weights.length > 0) return { files: [...settings, ...weights], graph: null };
  }
  throw new Error(`${where} has no ONNX graph (model.onnx, onnx/model.onnx, ...) and no checkpoint (model.safetensors, pytorch_model.bin); it has: ${listed(paths)}`);
}

function listed(paths: readonly string[]): string {
  const shown = paths.slice(0, 20).join(', ');
  return paths.length > 20 ? `${shown}, and ${paths.length - 20} more` : shown || 'no files';
}
