/**
 * The model repository read into plans, on the main thread at start: which
 * folders, each model's settings (src/shared/model-format/model-config.ts), its batching
 * (checked and completed here), and a slab sized for it; a graph built from a
 * checkpoint is built on a thread of its own (specOf). Shared by the
 * in-process engine and the server.
 */
import { existsSync, statSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { batchCapacity, PAD_TO, type BatchingOptions } from '../gpu-worker/scheduler.js';
import { DEFAULTS, defaultBuckets } from '../shared/options.js';
import { cudaMissing, parseDevice } from '../gpu-worker/device.js';
import { ModelNotFoundError, ValidationError } from '../shared/errors.js';
import { isValidModelName, listModelDirs, loadModelSpec, type Dtype, type GraphFromCheckpoint, type HubSource, type ModelOverrides, type ModelSpec, type Pooling, type ServeSettings, type WeightsSource } from '../shared/model-format/model-config.js';
import { defaultGraphCacheDir, type BuiltGraph } from './checkpoint/build.js';
import { checkpointGraphOffThread } from './checkpoint/off-thread.js';
import { fetchModel } from './hub/fetch-model.js';
import { hfEnv, type HfEnv } from './hub/hf-env.js';
import { hubIdText, parseHubId, shortNameOf, type HubModelId } from './hub/hub-id.js';
import { downloadProgress } from './hub/progress.js';
import type { ModelPlan } from '../shared/model-plan.js';
import { MAX_BUCKETS, Slab } from '../shared/slab.js';

/** The package's own folder (dist/src/.. /..), where models/ lives by default. */
export const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/** A model's folder, the name it is served by, and where it came from when it came from the Hub. */
export interface ModelFolder {
  name: string;
  dir: string;
  hub?: HubSource;
}

export interface LocateModelsOptions {
  modelsDir?: string | undefined;
  /** Names under modelsDir, folder paths, or Hub ids (ORG/NAME[@REVISION], fetched into the Hugging Face cache). Default: every folder of modelsDir. */
  models?: string[] | undefined;
  /** The names to serve them by instead (--served-model-name), one per model in order. */
  servedNames?: string[] | undefined;
  /** Which graph a Hub model needs (dtype, CUDA): only that one is fetched. */
  overrides: ModelOverrides;
  log: (line: string) => void;
  /** The Hugging Face conventions (HF_ENDPOINT, HF_TOKEN, HF_HUB_CACHE, HF_HUB_OFFLINE); default from the environment. */
  hf?: HfEnv;
}

export interface LoadModelsOptions {
  /** Settings the server's flags impose on every model (pooling, max input length). */
  overrides: ModelOverrides;
  /** Where a model's start-up warnings go (a pooling left to the default). */
  warn?: (line: string) => void;
  batching?: Partial<BatchingOptions>;
  slotsPerModel: number;
  /** MiB of token vectors per model with them (/embed_all): its token area, a page per input in flight. Default: --token-output-mb's. */
  tokenOutputMb?: number;
  /** Threads that submit requests (each gets its own completion queue). */
  owners: number;
  /** Where graphs built from checkpoints are kept (--graph-cache-dir); default: the user's cache. */
  graphCacheDir?: string;
}

/** How every model is planned, at start and at a load while serving. */
export type Planning = LoadModelsOptions;

/** The models directory: --models-dir, or the package's own models/. */
export function modelsDirOf(given: string | undefined): string {
  return resolve(given ?? join(packageRoot, 'models'));
}

/** How every model is planned, from the server's or the engine's option values. */
export function planningOf(
  o: Parameters<typeof modelOverrides>[0] & { slotsPerModel: number; tokenOutputMb: number; graphCacheDir?: string | undefined },
  batching: Partial<BatchingOptions> | undefined,
  warn: (line: string) => void,
  owners: number,
): Planning {
  const graphCacheDir = o.graphCacheDir ?? defaultGraphCacheDir();
  return { ...(batching ? { batching } : {}), overrides: modelOverrides(o), warn, slotsPerModel: o.slotsPerModel, tokenOutputMb: o.tokenOutputMb, owners, graphCacheDir };
}

/** A folder planned while serving (a load) as at start, in a retired model's slab memory where it fits. */
export function planWhileServing(planning: Planning, models: { reusable(bytes: number): SharedArrayBuffer | undefined }) {
  return (folder: ModelFolder, id: number, serve?: ServeSettings): Promise<ModelPlan> =>
    planModel(folder, id, { ...planning, ...(serve ? { serve } : {}), reuse: (bytes) => models.reusable(bytes) });
}

/** The settings the server's (or engine's) options impose on every model: ModelOverrides. */
export function modelOverrides(o: {
  pooling?: Pooling | undefined;
  maxInputLength?: number | undefined;
  defaultPromptName?: string | undefined;
  defaultPrompt?: string | undefined;
  dtype?: Dtype | undefined;
  device?: string | undefined;
  weights?: WeightsSource | undefined;
}): ModelOverrides {
  const device = parseDevice(o.device ?? DEFAULTS.device);
  return {
    ...(o.dtype !== undefined ? { dtype: o.dtype } : {}),
    // dtype auto: fp16 where the model has it and the device will be CUDA
    onCuda: device.kind === 'cuda' || (device.kind === 'auto' && cudaMissing() === undefined),
    ...(o.pooling !== undefined ? { pooling: o.pooling } : {}),
    ...(o.maxInputLength !== undefined ? { maxLength: o.maxInputLength } : {}),
    ...(o.defaultPromptName !== undefined ? { defaultPromptName: o.defaultPromptName } : {}),
    ...(o.defaultPrompt !== undefined ? { defaultPrompt: o.defaultPrompt } : {}),
    ...(o.weights !== undefined ? { weights: o.weights } : {}),
  };
}

/** Where each model to serve is, fetching those named by Hub id: the start's first step, before any thread. */
export async function locateModels(opts: LocateModelsOptions): Promise<ModelFolder[]> {
  const modelsDir = modelsDirOf(opts.modelsDir);
  const names = opts.models && opts.models.length > 0 ? opts.models : listModelDirs(modelsDir);
  if (names.length === 0) throw new Error(noModelsMessage(modelsDir));
  const served = opts.servedNames ?? [];
  if (served.length > 0 && served.length !== names.length) {
    throw new ValidationError(`--served-model-name gives ${served.length} name${served.length === 1 ? '' : 's'} for ${names.length} models (${names.join(', ')}): one per --model, in order`);
  }
  const folders: ModelFolder[] = [];
  for (const [i, given] of names.entries()) {
    const folder = await locateModel(modelsDir, given, opts);
    const name = served[i];
    if (name !== undefined && !isValidModelName(name)) throw new ValidationError(`--served-model-name "${name}": a name is letters, digits, ".", "_" and "-"`);
    folders.push(name !== undefined ? { ...folder, name } : folder);
  }
  const seen = new Set<string>();
  for (const f of folders) {
    if (seen.has(f.name)) throw new ValidationError(`two models named "${f.name}" (${names.join(', ')}): a model is named after its folder, or its Hub repository's name; --served-model-name names them apart`);
    seen.add(f.name);
  }
  return folders;
}

/** Each folder planned, as model ids 0, 1, ...: one after another, so a start refuses with the first folder's reason and two checkpoint builds never compete for memory. */
export async function loadModels(folders: readonly ModelFolder[], planning: Planning): Promise<ModelPlan[]> {
  const plans: ModelPlan[] = [];
  for (const [index, folder] of folders.entries()) plans.push(await planModel(folder, index, planning));
  return plans;
}

/** Where one --model value is: a local folder or a name under modelsDir as they stand, else a Hub id, fetched. */
export async function locateModel(modelsDir: string, given: string, opts: HubFetching): Promise<ModelFolder> {
  return localFolder(modelsDir, given) ?? locateHubModel(parseHubId(given)!, opts);
}

export type HubFetching = Pick<LocateModelsOptions, 'overrides' | 'log' | 'hf'>;

/** A model by its Hub id: fetched into the cache (or found there), served from its snapshot under its repository's NAME. */
export async function locateHubModel(id: HubModelId, opts: HubFetching): Promise<ModelFolder> {
  const text = hubIdText(id);
  const fetched = await fetchModel(id, { env: opts.hf ?? hfEnv(), overrides: opts.overrides, log: opts.log, progress: downloadProgress(text, opts.log) });
  opts.log(`slabserve: model ${text}: commit ${fetched.commit}, ${fetched.online ? 'from the Hub' : 'from the cache'} (${fetched.dir})`);
  return { name: shortNameOf(id.repo), dir: fetched.dir, hub: { repo: id.repo, revision: id.revision, commit: fetched.commit } };
}

/**
 * One model folder planned as model id `index` (ModelPlan.index: never reused, src/main/repository/model-set.ts):
 * its settings read (`serve` over the folder's serve.json, for a load's parameters.config), its
 * batching checked, its slab made. Throws with the reason when the folder cannot be served.
 */
export async function planModel(
  folder: ModelFolder,
  index: number,
  opts: LoadModelsOptions & { serve?: ServeSettings; reuse?: (bytes: number) => SharedArrayBuffer | undefined },
): Promise<ModelPlan> {
  let spec = await specOf(folder, opts);
  if (folder.hub) spec = { ...spec, hub: folder.hub };
  for (const w of spec.warnings) opts.warn?.(`slabserve: warning: ${w}`);
  const batching = resolveBatching(spec, opts.batching);
  const maxLength = Math.min(spec.maxLength, batching.buckets[batching.buckets.length - 1]!);
  const tokenPages = tokenPagesOf(spec.tokenWidth, maxLength, opts.slotsPerModel, opts.tokenOutputMb ?? DEFAULTS.tokenOutputMb);
  if (spec.tokenWidth > 0 && tokenPages === 0) {
    const mb = (maxLength * spec.tokenWidth * 4) / 2 ** 20;
    opts.warn?.(`slabserve: warning: model ${spec.name}: one input's token vectors (${mb.toFixed(2)} MiB) do not fit --token-output-mb ${opts.tokenOutputMb ?? DEFAULTS.tokenOutputMb}: /embed_all is off for it`);
    spec = { ...spec, outputs: spec.outputs.filter((o) => o !== 'tokens'), tokenWidth: 0 };
  }
  const layout = { slotCount: opts.slotsPerModel, maxLength, outputWidth: spec.outputWidth, owners: opts.owners, tokenPages, tokenWidth: spec.tokenWidth };
  const slab = Slab.create(layout, opts.reuse?.(Slab.byteLength(layout)));
  const capacities = batching.buckets.map((len) => batchCapacity(batching, len));
  return { index, spec, batching, maxLength, capacities, slab: slab.buffer, layout: slab.layout };
}

/** Thrown by specOf's callback where the spec wants a graph built from the checkpoint that no pass has built yet. */
class GraphWanted {
  constructor(readonly head: Parameters<GraphFromCheckpoint>[0], readonly dtype: Parameters<GraphFromCheckpoint>[1]) {}
}

/**
 * The folder's spec (loadModelSpec, synchronous), with any graph built from its
 * checkpoint made on a build thread (checkpoint/off-thread.ts): hashing the
 * weights and building take seconds the main thread spends serving. A pass
 * whose spec wants a graph no pass has built yet stops at the graph with the
 * head and dtype it wants; that graph is built (or found in the cache) off the
 * thread, and the next pass reads the spec again with it. loadModelSpec alone
 * decides which graph the spec wants.
 */
async function specOf(folder: ModelFolder, opts: LoadModelsOptions & { serve?: ServeSettings }): Promise<ModelSpec> {
  const built = new Map<string, BuiltGraph | undefined>();
  const fromCheckpoint: GraphFromCheckpoint = (head, dtype) => {
    const key = `${head} ${dtype}`;
    if (built.has(key)) return built.get(key);
    throw new GraphWanted(head, dtype);
  };
  const log = (line: string) => opts.warn?.(line);
  for (;;) {
    try {
      return loadModelSpec(folder.dir, folder.name, opts.overrides, opts.serve, fromCheckpoint);
    } catch (err) {
      if (!(err instanceof GraphWanted)) throw err;
      const { head, dtype } = err;
      built.set(`${head} ${dtype}`, await checkpointGraphOffThread(folder.name, folder.dir, head, { cacheDir: opts.graphCacheDir ?? defaultGraphCacheDir(), dtype, log }));
    }
  }
}

/** Pages of a model's token area: as many inputs of `maxLength` tokens as `mb` holds, at most one per slot. */
function tokenPagesOf(tokenWidth: number, maxLength: number, slots: number, mb: number): number {
  if (tokenWidth === 0) return 0;
  return Math.min(slots, Math.floor((mb * 2 ** 20) / (maxLength * tokenWidth * 4)));
}

/** Why `modelsDir` gives no model, for an operator: it is not there, or holds no model folder. */
function noModelsMessage(modelsDir: string): string {
  // The generator's hint only where the generated defaults belong: the package's own models/.
  const hint = modelsDir === join(packageRoot, 'models') ? ': run `npm run models` to generate the defaults' : '';
  if (!existsSync(modelsDir)) return `the models directory ${modelsDir} does not exist (--models-dir)${hint}`;
  return `the models directory ${modelsDir} holds no model folder (a folder with a config.json; --models-dir, or --model PATH)${hint}`;
}

/**
 * Where `given` (a --model value) is on disk: a name under modelsDir when it
 * is one (no "/"), else a folder path as it stands (relative to the working
 * directory). null: not on disk, and shaped as a Hub id (ORG/NAME[@REVISION]).
 */
function localFolder(modelsDir: string, given: string): ModelFolder | null {
  if (isValidModelName(given)) {
    const dir = join(modelsDir, given);
    if (!existsSync(join(dir, 'config.json'))) throw new ModelNotFoundError(given, listModelDirs(modelsDir));
    return { name: given, dir };
  }
  const dir = resolve(given);
  if (existsSync(dir) && statSync(dir).isDirectory()) {
    if (!existsSync(join(dir, 'config.json'))) throw new ValidationError(`model folder ${dir} has no config.json`);
    return { name: basename(dir), dir };
  }
  const pathLike = /^(\.{1,2}|~)?[/\\]/.test(given) || given.includes('\\');
  if (pathLike || !parseHubId(given)) throw new ValidationError(`model folder ${dir} does not exist${pathLike ? '' : ', and "' + given + '" is no Hub id (ORG/NAME[@REVISION])'}`);
  return null;
}

/** "task=embed pooling=cls (1_Pooling/config.json) normalize=true (modules.json) maxLength=128 (sentence_bert_config.json)". */
export function describeSettings(plan: ModelPlan): string {
  const { spec } = plan;
  const parts = [`task=${spec.task} (${spec.sources.task})`, `dtype=${spec.dtype} (${spec.sources.dtype})`];
  const c = spec.colbert;
  if (c) {
    const dense = `${c.dense.inFeatures}->${c.dense.outFeatures}${c.dense.activation === 'tanh' ? ' tanh' : ''}`;
    parts.push(`colbert=dense ${dense}, query ${c.queryLength}${c.doQueryExpansion ? ' expanded' : ''}, document ${c.documentLength} (modules.json, config_sentence_transformers.json)`);
  } else if (spec.task === 'embed') {
    parts.push(`pooling=${spec.pooling} (${spec.sources.pooling})`, `normalize=${spec.normalize} (${spec.sources.normalize})`);
    if (spec.m3) parts.push(`m3=colbert ${spec.hiddenSize}->${spec.m3.colbert.dim} and sparse (colbert_linear.safetensors, sparse_linear.safetensors)`);
    if (!spec.includePrompt) parts.push('include_prompt=false (1_Pooling/config.json)');
  }
  if (spec.defaultPrompt) parts.push(`defaultPrompt=${JSON.stringify(spec.defaultPrompt.name ?? spec.defaultPrompt.text)} (${spec.sources.defaultPrompt})`);
  const cut = plan.maxLength < spec.maxLength ? `, cut to the longest bucket` : '';
  parts.push(`maxLength=${plan.maxLength} (${spec.sources.maxLength}${cut})`, `inputs=${spec.graphInputs.join(',')}`);
  return parts.join(' ');
}

/** Each model's bucket lengths and batch capacities, as owners need them for admission: by model id. */
export function bucketPlans(plans: ModelPlan[]): { lengths: number[]; capacities: number[] }[] {
  const out: { lengths: number[]; capacities: number[] }[] = [];
  for (const p of plans) out[p.index] = { lengths: p.batching.buckets, capacities: p.capacities };
  return out;
}

/** Validates and completes the batching options for one model. */
export function resolveBatching(spec: ModelSpec, given: Partial<BatchingOptions> = {}): BatchingOptions {
  const opts: BatchingOptions = {
    maxBatchSize: given.maxBatchSize ?? DEFAULTS.maxBatchSize,
    maxBatchDelayMs: given.maxBatchDelayMs ?? DEFAULTS.maxBatchDelayMs,
    maxBatchTokens: given.maxBatchTokens ?? DEFAULTS.maxBatchTokens,
    buckets: given.buckets ? [...given.buckets] : defaultBuckets(spec.maxLength),
    padTo: given.padTo ?? DEFAULTS.padTo,
  };
  if (!PAD_TO.includes(opts.padTo)) throw new ValidationError(`padTo must be one of ${PAD_TO.join(', ')}, got ${String(opts.padTo)}`);
  const positiveInt = (name: string, v: number) => {
    if (!Number.isInteger(v) || v < 1) throw new ValidationError(`${name} must be a positive integer, got ${v}`);
  };
  positiveInt('maxBatchSize', opts.maxBatchSize);
  positiveInt('maxBatchTokens', opts.maxBatchTokens);
  if (!(opts.maxBatchDelayMs >= 0) || !Number.isFinite(opts.maxBatchDelayMs)) {
    throw new ValidationError(`maxBatchDelayMs must be a number >= 0, got ${opts.maxBatchDelayMs}`);
  }
  if (opts.buckets.length === 0) throw new ValidationError('buckets must not be empty');
  if (opts.buckets.length > MAX_BUCKETS) {
    throw new ValidationError(`at most ${MAX_BUCKETS} buckets (--buckets), got ${opts.buckets.length}: the slab keeps a cost model and a queue tally for each`);
  }
  opts.buckets.forEach((b, i) => {
    positiveInt('bucket length', b);
    if (i > 0 && b <= opts.buckets[i - 1]!) throw new ValidationError(`buckets must be ascending, got ${opts.buckets.join(',')}`);
  });
  // Buckets past the model's max length can never be used: drop them.
  opts.buckets = opts.buckets.filter((b) => b <= spec.maxLength);
  if (opts.buckets.length === 0) throw new ValidationError(`model ${spec.name}: every bucket exceeds its max length ${spec.maxLength}`);
  const longest = opts.buckets[opts.buckets.length - 1]!;
  if (opts.maxBatchTokens < longest) {
    throw new ValidationError(`maxBatchTokens (${opts.maxBatchTokens}) must be at least the longest bucket (${longest}) so one input always fits`);
  }
  return opts;
}
