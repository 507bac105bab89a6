/** The models and their workloads, made ready before any timing. */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { prepareModel, type PreparedModel } from '../../src/gpu-worker/graph.js';
import { loadModelSpec, type ModelSpec } from '../../src/shared/model-format/model-config.js';
import { fail } from '../args.js';
import type { ModelInfo } from '../suite-results.js';
import { makeWorkload, type Workload, type WorkloadName } from '../workloads.js';
import type { SuiteOptions } from './options.js';
import { REPO_ROOT } from './paths.js';
import { round } from './phases.js';

/** Distinct requests generated per workload. */
const WORKLOAD_REQUESTS: Record<WorkloadName, number> = { short: 4096, mixed: 2048, 'client-batch': 256 };

export interface ModelSetup {
  name: string;
  /** The models folder it is in (what `--models-dir` gets). */
  dir: string;
  spec: ModelSpec;
  /** The graph the server runs (pooling appended), for the raw onnxruntime side. */
  prepared: PreparedModel;
  /** The first model: every workload; the others: `short` only. */
  workloads: Map<WorkloadName, Workload>;
}

/** The bench's models folder, every one of `names` in it (generated there once). */
export function benchModels(o: SuiteOptions, names: string[]): string {
  const missing = names.filter((name) => !existsSync(join(o.benchModelsDir, name, 'model.onnx')));
  if (missing.length === 0) return o.benchModelsDir;
  mkdirSync(o.benchModelsDir, { recursive: true });
  process.stderr.write(`generating ${missing.join(', ')} into ${o.benchModelsDir} (once)\n`);
  execFileSync(process.execPath, [join(REPO_ROOT, 'dist', 'models', 'generate.js'), '--missing', '--out', o.benchModelsDir, ...missing], { stdio: 'inherit' });
  return o.benchModelsDir;
}

/** Every model of `--models`, checked to be an embedding model, with its workloads tokenized. */
export async function loadModels(o: SuiteOptions): Promise<ModelSetup[]> {
  const models: ModelSetup[] = [];
  for (const name of o.models) {
    const base = existsSync(join(o.modelsDir, name, 'model.onnx')) ? o.modelsDir : benchModels(o, [name]);
    const dir = join(base, name);
    const spec = await loadModelSpec(dir);
    if (spec.task !== 'embed') fail(`model ${name} is a ${spec.task} model; the suite drives /embed (pick embedding models)`);
    const prepared = prepareModel(readFileSync(spec.onnxPath), spec);
    const names: WorkloadName[] = models.length === 0 ? ['short', 'mixed', 'client-batch'] : ['short'];
    const workloads = new Map<WorkloadName, Workload>();
    for (const wn of names) workloads.set(wn, await makeWorkload(wn, spec, o.seed, WORKLOAD_REQUESTS[wn]));
    models.push({ name, dir: base, spec, prepared, workloads });
  }
  return models;
}

/** The model's size, for the report's model table. */
export function modelInfo(m: ModelSetup): ModelInfo {
  const config = JSON.parse(readFileSync(join(m.dir, m.name, 'config.json'), 'utf8')) as Record<string, number>;
  return {
    name: m.name,
    layers: config.num_hidden_layers ?? 0,
    hidden: config.hidden_size ?? 0,
    heads: config.num_attention_heads ?? 0,
    parametersM: round(statSync(m.spec.onnxPath).size / 4 / 1e6, 1),
    maxLength: m.spec.maxLength,
  };
}
