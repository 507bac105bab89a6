/**
 * Generates the random-weight BERT model folders (see models/README.md).
 *
 *   node dist/models/generate.js [--missing] [--force] [--out DIR] [name ...]
 *
 *   name ...    presets to generate (default: tiny-embed tiny-intent tiny-rerank);
 *               `all` means every preset
 *   --missing   skip folders that already hold model.onnx, config.json and
 *               tokenizer.json
 *   --out DIR   where the folders go (default: this repository's models/)
 *   --force     also overwrite a folder that holds a model we did not
 *               generate (a real Hugging Face export: its config.json lacks
 *               the "_slabserve" marker); without it such folders are refused
 *   --int8      also write model_int8.onnx, the dynamically quantized graph
 *               (models/generator/quantize.ts; served with --dtype int8)
 *   --fp16      also write model_fp16.onnx: float16 weights and outputs
 *               (served with --dtype fp16, and by auto on CUDA)
 *   --name N    the folder's name (and so the served model's), for one preset
 *   --pooling P an embedding model's pooling (cls, mean, max, mean_sqrt_len,
 *               weightedmean, lasttoken), written to its serve.json
 *   --max-length N  the longest input in tokens, written to its serve.json
 *   --list      print the presets and exit
 *
 * Exit status: 0 on success, 1 if a model could not be written, 2 on bad usage.
 */
import { existsSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import {
  DEFAULT_PRESETS,
  PRESETS,
  isGeneratedFolder,
  isModelFolderComplete,
  presetNames,
  writeOptionsProblem,
  writePreset,
  type WriteOptions,
} from './generator/presets.js';
import { isValidModelName, type Pooling } from '../src/shared/model-format/model-config.js';

const USAGE = `usage: node dist/models/generate.js [--missing] [--force] [--int8] [--fp16] [--out DIR] [--name N] [--pooling P] [--max-length N] [--list] [name ... | all]
presets: ${presetNames().join(', ')} (default: ${DEFAULT_PRESETS.join(', ')})`;

/** The repository's models/ folder: walk up from this file to package.json (works from src and dist). */
function defaultModelsDir(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, 'package.json'))) return join(dir, 'models');
    const parent = dirname(dir);
    if (parent === dir) return resolve('models');
    dir = parent;
  }
}

function main(argv: string[]): number {
  let args;
  try {
    args = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        missing: { type: 'boolean', default: false },
        force: { type: 'boolean', default: false },
        int8: { type: 'boolean', default: false },
        fp16: { type: 'boolean', default: false },
        out: { type: 'string' },
        name: { type: 'string' },
        pooling: { type: 'string' },
        'max-length': { type: 'string' },
        list: { type: 'boolean', default: false },
        help: { type: 'boolean', short: 'h', default: false },
      },
    });
  } catch (err) {
    console.error(`generate: ${(err as Error).message}\n${USAGE}`);
    return 2;
  }
  const { values, positionals } = args;
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (values.list) {
    for (const p of Object.values(PRESETS)) console.log(`${p.name.padEnd(12)} ${p.description}`);
    return 0;
  }

  const names = positionals.length === 0 ? [...DEFAULT_PRESETS] : positionals.includes('all') ? presetNames() : positionals;
  const unknown = names.filter((n) => !Object.hasOwn(PRESETS, n));
  if (unknown.length > 0) {
    console.error(`generate: unknown model ${unknown.map((n) => `"${n}"`).join(', ')}\n${USAGE}`);
    return 2;
  }
  const unique = [...new Set(names)];
  const custom = customisation(values, unique);
  if (typeof custom === 'string') {
    console.error(`generate: ${custom}\n${USAGE}`);
    return 2;
  }
  const outDir = values.out ? resolve(values.out) : defaultModelsDir();
  const shown = (dir: string) => {
    const rel = relative(process.cwd(), dir);
    return rel === '' ? '.' : rel.startsWith('..') ? dir : rel;
  };

  let failed = 0;
  for (const name of unique) {
    const t0 = performance.now();
    const dir = join(outDir, custom.folder ?? name);
    const secs = () => ((performance.now() - t0) / 1000).toFixed(2);
    if (values.missing && isModelFolderComplete(dir)) {
      console.log(`${name}: skipped, ${shown(dir)} is complete (${secs()}s)`);
      continue;
    }
    if (existsSync(join(dir, 'config.json')) && !isGeneratedFolder(dir) && !values.force) {
      console.error(`${name}: refused, ${shown(dir)} holds a model slabserve did not generate (use --force to overwrite)`);
      failed++;
      continue;
    }
    try {
      const { modelBytes } = writePreset(name, outDir, { int8: values.int8, fp16: values.fp16, ...custom });
      const preset = PRESETS[name]!;
      const s = preset.spec;
      const mb = (modelBytes / 1e6).toFixed(1);
      // The task it is served as (serve.json: a one-logit classifier graph is a reranker), not its graph's head.
      console.log(
        `${name}: wrote ${shown(dir)} (${preset.serve?.task ?? s.task}, ${s.layers} layers x ${s.hidden}, model.onnx ${mb} MB) in ${secs()}s`,
      );
    } catch (err) {
      console.error(`${name}: failed after ${secs()}s: ${(err as Error).stack ?? String(err)}`);
      failed++;
    }
  }
  return failed > 0 ? 1 : 0;
}

/** --name, --pooling and --max-length as writePreset's options, or what is wrong with them. */
function customisation(values: { name?: string; pooling?: string; 'max-length'?: string }, names: string[]): WriteOptions | string {
  const out: WriteOptions = {};
  if (values.name !== undefined) {
    if (names.length !== 1) return `--name names one folder: give one preset (got ${names.length})`;
    if (!isValidModelName(values.name)) return `--name "${values.name}" cannot be a model's name (letters, digits, ".", "_", "-"; not "." or "..")`;
    out.folder = values.name;
  }
  if (values.pooling !== undefined) out.pooling = values.pooling as Pooling;
  if (values['max-length'] !== undefined) {
    if (!/^\d+$/.test(values['max-length'])) return `--max-length "${values['max-length']}" is not a whole number`;
    out.maxLength = Number(values['max-length']);
  }
  const problems = names.map((n) => writeOptionsProblem(n, out)).filter((p) => p !== null);
  if (problems.length > 0) return problems.join('; ');
  return out;
}

process.exitCode = main(process.argv.slice(2));
