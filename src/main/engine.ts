/**
 * The in-process engine: loads the model repository, starts the inference
 * thread, and submits requests through the slabs exactly as a gateway thread
 * does (same Infer, same SlabSubmitter). It is what tests and the
 * quick benchmark drive, and a library API for Node.js programs.
 *
 *   const engine = await createEngine({ device: 'auto' });
 *   const [vec] = await engine.embed('where is my parcel?');
 *   const [top] = await engine.classify('I want my money back');
 *   await engine.close();
 */
import { hubIdOf } from './hub/hub-id.js';
import { basename, resolve } from 'node:path';
import { Infer, type InferResult } from '../core/infer.js';
import { type CallInputs } from '../core/inputs.js';
import { classifications, embeddings, rowOf, type Classification } from '../core/rows.js';
import { type ServedModel } from '../core/served-model.js';
import { Cancellation } from '../core/cancel.js';
import { prompted } from '../core/prompts.js';
import { loadModelTokenizer, type Encoding } from '../core/tokenizer/tokenizer.js';
import { checkNativeBinaries } from './native-binaries.js';
import { checkDevice, type DeviceInfo } from '../gpu-worker/device.js';
import type { BatchingOptions } from '../gpu-worker/scheduler.js';
import { inferenceOptionsOf, InferenceSupervisor, TEST_HOOKS_ENV, type InferenceHoldHooks } from './threads/inference-supervisor.js';
import { DEFAULTS, unbatchedNamesOf, withDefaults, type BatchingName, type NamesOf, type OptionValues } from '../shared/options.js';
import { bucketPlans, loadModels, locateHubModel, locateModels, modelsDirOf, planningOf, planWhileServing } from './plan-models.js';
import { ModelRepository } from './repository/repository.js';
import type { IndexEntry } from '../shared/repository-protocol.js';
import { ModelRegistry } from '../core/model-registry.js';
import { ModelSet } from './repository/model-set.js';
import { ControlBlock } from '../shared/control.js';
import { EngineClosedError } from '../shared/errors.js';
import { servedSources, type HubSource, type ModelOutput, type ServedPooling, type ServeSettings, type SettingSources, type Task } from '../shared/model-format/model-config.js';
import type { ModelPlan } from '../shared/model-plan.js';
import { cacheLayoutOf, ResultCache } from '../shared/result-cache.js';
import { Counter, Slab } from '../shared/slab.js';
import { SlabSubmitter, type SlotResult } from '../core/submitter.js';

export type { Classification } from '../core/rows.js';
export { resolveBatching } from './plan-models.js';

/** Which models, and the settings imposed on every one of them (over serve.json and the folder's own files): the engine's and the server's alike. */
export type ModelOptions = OptionValues<'modelsDir' | 'models' | 'pooling' | 'maxInputLength' | 'dtype' | 'defaultPromptName' | 'defaultPrompt'>;

/**
 * The engine's options: every option of the engine's scope (src/shared/options.ts, docs/configuration.md),
 * by name, each optional (absent: its default; the result cache is off unless `cacheMb` is given, since
 * repeated inputs are what benchmarks and tests drive an engine with), the batching ones in `batching`.
 */
export type EngineOptions = OptionValues<Exclude<NamesOf<'engine'>, BatchingName>> & {
  batching?: Partial<BatchingOptions>;
  /** Where start-up lines go. Default: stderr. */
  log?: (line: string) => void;
};

const ENGINE_OPTION_NAMES = unbatchedNamesOf('engine');

/** The engine's defaults: the table's, but no result cache. */
export const ENGINE_DEFAULTS = { ...withDefaults(ENGINE_OPTION_NAMES, {}), cacheMb: 0 };

export interface RequestOptions {
  /** Model name; default: the first loaded model of the right task. */
  model?: string;
  /** Priority class name (default: the first class, "interactive"). */
  priority?: string;
  /** Cut inputs longer than the model's max length instead of rejecting them. Default false. */
  truncate?: boolean;
  /** Cancels the request: its slots are freed and, if they have not run, they never run. */
  signal?: AbortSignal;
  /** Overrides the engine's requestTimeoutMs for this call. */
  timeoutMs?: number;
}

export interface EmbedOptions extends RequestOptions {
  /** L2-normalise (default: the model's serve.json, normally true). */
  normalize?: boolean;
  /** One of the model's prompts by name, put before each text (default: the model's default prompt, if any). */
  promptName?: string;
  /** A prompt's text put before each text, instead of a named one ('' for none). */
  prompt?: string;
}

export interface ModelInfo {
  name: string;
  /** A model served by its Hub id: the repository, the revision asked for and the commit served. */
  hub?: HubSource;
  task: Task;
  maxLength: number;
  dimension: number;
  labels: string[];
  /** Which of the folder's graphs is served. */
  dtype: string;
  /** Embedding models: how token states become one vector, and whether it is L2-normalised by default. */
  pooling?: ServedPooling;
  normalize?: boolean;
  /** Embedding models: what they answer with (`dense` rows, `sparse` weights: /embed_sparse). */
  outputs?: readonly ModelOutput[];
  /** Embedding models: false when a prompt's tokens are left out of the pooling (1_Pooling/config.json include_prompt). */
  includePrompt?: boolean;
  /** Embedding models: their prompts by name, and the one a text gets when its request names none. */
  prompts?: Record<string, string>;
  defaultPrompt?: { name?: string; text: string };
  /** Which flag, file of the model's folder, or default decided task, pooling, normalize and maxLength. */
  sources: SettingSources;
  /** The graph's token inputs (no token_type_ids where the graph takes none). */
  inputs: string[];
  batching: BatchingOptions;
}

export interface ModelStats {
  slotsInUse: number;
  /** Pages of the token area taken (requests for token vectors in flight: /embed_all). */
  tokenPagesInUse: number;
  queued: number;
  batches: number;
  rows: number;
  realTokens: number;
  paddedTokens: number;
  failedBatches: number;
  droppedExpired: number;
  cancelledSkipped: number;
  /** Summed wall time of session.run calls, ms. */
  runMs: number;
}

/** What a result row of each model looks like, for info() and the HTTP /info route. */
export function describeModel(m: ServedModel['plan']): ModelInfo {
  return {
    name: m.spec.name,
    ...(m.spec.hub ? { hub: m.spec.hub } : {}),
    task: m.spec.task,
    maxLength: m.maxLength,
    dimension: m.spec.task === 'embed' ? m.spec.dimension : m.spec.labels.length,
    labels: m.spec.labels,
    dtype: m.spec.dtype,
    ...(m.spec.task === 'embed' ? { pooling: m.spec.pooling, normalize: m.spec.normalize, outputs: m.spec.outputs, includePrompt: m.spec.includePrompt, prompts: m.spec.prompts } : {}),
    ...(m.spec.defaultPrompt ? { defaultPrompt: m.spec.defaultPrompt } : {}),
    sources: servedSources(m.spec, m.maxLength),
    inputs: m.spec.graphInputs,
    batching: m.batching,
  };
}

/** Reads a slab's counters (shared memory written by the inference thread). */
export function slabStats(slab: Slab): ModelStats {
  const c = slab.counters;
  return {
    slotsInUse: slab.slotsInUse(),
    tokenPagesInUse: slab.tokenPagesInUse(),
    queued: c[Counter.QUEUED]!,
    batches: c[Counter.BATCHES]!,
    rows: c[Counter.ROWS]!,
    realTokens: c[Counter.REAL_TOKENS]!,
    paddedTokens: c[Counter.PADDED_TOKENS]!,
    failedBatches: c[Counter.FAILED_BATCHES]!,
    droppedExpired: c[Counter.DROPPED_EXPIRED]!,
    cancelledSkipped: c[Counter.CANCELLED_SKIPPED]!,
    runMs: c[Counter.RUN_MS]!,
  };
}

const OWNER = 0; // the engine's own thread

export class Engine {
  readonly device: DeviceInfo;
  /** The request pipeline (src/core/infer.ts) the engine's calls go through. */
  private readonly pipeline: Infer;
  /** The slabs this engine submits to, by model id. */
  private readonly owned: ModelRegistry;
  private readonly repository: ModelRepository;
  private readonly inference: InferenceSupervisor;
  private readonly control: ControlBlock;
  private readonly submitter: SlabSubmitter;
  private closing: Promise<void> | null = null;
  /** The inference hold, present only when the engine was created with SLABSERVE_TEST_HOOKS=1 in the environment (tests). */
  readonly testHooks?: InferenceHoldHooks;

  /** Use createEngine(). */
  constructor(parts: {
    device: DeviceInfo;
    infer: Infer;
    owned: ModelRegistry;
    repository: ModelRepository;
    inference: InferenceSupervisor;
    control: ControlBlock;
    submitter: SlabSubmitter;
    testHooks?: InferenceHoldHooks;
  }) {
    this.device = parts.device;
    this.pipeline = parts.infer;
    this.owned = parts.owned;
    this.repository = parts.repository;
    this.inference = parts.inference;
    this.control = parts.control;
    this.submitter = parts.submitter;
    if (parts.testHooks) this.testHooks = parts.testHooks;
  }

  info(): ModelInfo[] {
    return this.pipeline.models.list().map((m) => describeModel(m.plan));
  }

  /**
   * Loads a model while the engine serves (docs/model-repository.md): a name under `modelsDir`,
   * a folder's path, or a Hub id (fetched into the Hugging Face cache); a model served already is reloaded from its folder (the version served
   * answers until the new one is warm). `settings` are serve.json's, over the folder's.
   */
  async loadModel(nameOrPath: string, settings?: ServeSettings): Promise<ModelInfo> {
    this.assertOpen();
    await this.repository.load(nameOrPath, settings);
    const hubId = hubIdOf(nameOrPath, true);
    return describeModel(this.pipeline.models.byName(hubId ? hubId.repo : basename(resolve(nameOrPath))).plan);
  }

  /** Unloads a model: refused for new calls at once; the calls it holds finish first. */
  async unloadModel(name: string): Promise<void> {
    this.assertOpen();
    await this.repository.unload(name);
  }

  /** The model repository's index: every folder of `modelsDir` and every model served, with its state. */
  models(): IndexEntry[] {
    return this.repository.index();
  }

  /** Embeds each text; one Float32Array per input, in order. */
  async embed(inputs: string | string[], opts: EmbedOptions = {}): Promise<Float32Array[]> {
    this.assertOpen();
    const model = this.pipeline.models.resolve('embed', opts.model);
    const call = prompted(
      { model, inputs: { kind: 'inputs', inputs: typeof inputs === 'string' ? [inputs] : inputs, truncate: opts.truncate ?? false } },
      { prompt_name: opts.promptName, prompt: opts.prompt },
    );
    const r = await this.infer(model, call.inputs, opts);
    return embeddings(model, r.rows, opts.normalize);
  }

  /** Classifies each text; one Classification per input, in order. */
  async classify(inputs: string | string[], opts: RequestOptions = {}): Promise<Classification[]> {
    this.assertOpen();
    const model = this.pipeline.models.resolve('classify', opts.model);
    const r = await this.infer(model, { kind: 'inputs', inputs: typeof inputs === 'string' ? [inputs] : inputs, truncate: opts.truncate ?? false }, opts);
    return classifications(model, r.rows);
  }

  /**
   * Runs already-tokenized inputs (ids with [CLS]/[SEP]) through `modelName`:
   * the path a benchmark or a pre-tokenized API uses. Returns raw output rows.
   */
  async runTokens(modelName: string, encodings: Pick<Encoding, 'ids' | 'typeIds'>[], opts: RequestOptions = {}): Promise<SlotResult[]> {
    this.assertOpen();
    const model = this.pipeline.models.byName(modelName);
    const r = await this.infer(model, { kind: 'tokens', tokens: encodings }, opts);
    return encodings.map((_, i) => ({ output: rowOf(r.rows, i), queueMs: r.timing.queueMs, inferenceMs: r.timing.inferenceMs }));
  }

  stats(): Record<string, ModelStats> {
    const out: Record<string, ModelStats> = {};
    for (const m of this.pipeline.models.list()) out[m.plan.spec.name] = slabStats(this.owned.slabs[m.plan.index]!);
    return out;
  }

  /** Stops the inference thread after its running batches; requests still queued fail with EngineClosedError. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      await this.inference.stop();
      this.submitter.close(new EngineClosedError());
    })();
    return this.closing;
  }

  /** One request through the client, cancelled by the caller's AbortSignal. */
  private async infer(model: ServedModel, inputs: CallInputs, opts: RequestOptions): Promise<InferResult> {
    const { cancellation, stop } = Cancellation.following(opts.signal);
    try {
      return await this.pipeline.infer({
        model,
        inputs,
        timeoutMs: opts.timeoutMs,
        priority: opts.priority === undefined ? undefined : this.pipeline.priorityIndex(opts.priority),
        cancel: cancellation,
      });
    } finally {
      stop();
    }
  }

  private assertOpen(): void {
    if (this.closing) throw new EngineClosedError();
  }
}

export async function createEngine(options: EngineOptions = {}): Promise<Engine> {
  const o = withDefaults(ENGINE_OPTION_NAMES, { ...options, cacheMb: options.cacheMb ?? 0 });
  const log = options.log ?? ((line: string) => process.stderr.write(line + '\n'));
  checkDevice(o.device); // before any thread starts
  await checkNativeBinaries({ gateways: false });
  const owners = 1;
  const planning = planningOf(o, options.batching, log, owners);
  const folders = await locateModels({ modelsDir: o.modelsDir, models: o.models, servedNames: o.servedModelNames, overrides: planning.overrides, log });
  const plans = await loadModels(folders, planning);
  const control = ControlBlock.create(owners);
  const testHooks = process.env[TEST_HOOKS_ENV] === '1';
  const models: ServedModel[] = await Promise.all(plans.map(async (plan) => ({ plan, tokenizer: await loadModelTokenizer(plan.spec) })));
  const modelSet = new ModelSet(plans);
  const inference = new InferenceSupervisor(modelSet, control, inferenceOptionsOf(o, log, testHooks));
  const device = await inference.ready;
  const owned = new ModelRegistry(plans);
  for (const m of models) owned.addModel(m);
  const submitter = new SlabSubmitter(owned.slabs, control, OWNER, { buckets: bucketPlans(plans) });
  const infer = new Infer(owned, submitter, {
    requestTimeoutMs: o.requestTimeoutMs,
    priorityNames: o.priorities.map((p) => p.name),
    ...(o.sloP99Ms !== undefined ? { sloP99Ms: o.sloP99Ms } : {}),
    cache: engineCache(o.cacheMb, plans),
  });
  // The engine's one owner (this thread) is the repository's only "gateway".
  const handlers = owned.handlers(submitter);
  const repository = new ModelRepository({
    mode: 'explicit',
    modelsDir: modelsDirOf(o.modelsDir),
    models: modelSet,
    inference,
    gateways: { callEvery: async <T>(method: string, arg: unknown) => [(await handlers[method as keyof typeof handlers](arg)) as T] },
    plan: planWhileServing(planning, modelSet),
    fetchHub: (id) => locateHubModel(id, { overrides: planning.overrides, log }),
    onChange: async () => {},
    log,
    drainTimeoutMs: o.requestTimeoutMs + 1000,
    paths: true,
  });
  return new Engine({ device, infer, owned, repository, inference, control, submitter, ...(testHooks ? { testHooks: inference.holdHooks() } : {}) });
}

/** The engine's result cache (one owner: its own thread), or null when `cacheMb` is 0. */
function engineCache(cacheMb: number, plans: ModelPlan[]): ResultCache | null {
  return cacheMb > 0 ? ResultCache.create(cacheLayoutOf(cacheMb, plans, 1), OWNER) : null;
}
