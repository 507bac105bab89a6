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
import { basename, join, resolve } from 'node:path';
import { classifications, embeddings, Infer, rowOf, type CallInputs, type Classification, type ServedModel, type InferResult } from '../core/infer.js';
import { Cancellation } from '../core/cancel.js';
import { prompted } from '../core/prompts.js';
import { loadModelTokenizer, type Encoding } from '../core/tokenizer/tokenizer.js';
import { checkNativeBinaries } from './native-binaries.js';
import { checkDevice, cudaMissing, parseDevice, type DeviceInfo } from '../gpu-worker/device.js';
import type { BatchingOptions } from '../gpu-worker/scheduler.js';
import { DEFAULT_IDLE_SPIN_US, DEFAULT_SCHEDULING } from '../gpu-worker/inference-loop.js';
import { InferenceSupervisor, TEST_HOOKS_ENV, type InferenceHoldHooks } from './threads/inference-supervisor.js';
import { bucketPlans, loadModels, packageRoot, planModel, TOKEN_OUTPUT_MB } from './plan-models.js';
import { ModelRepository } from './repository/repository.js';
import type { IndexEntry } from '../shared/repository-protocol.js';
import { OwnerModels } from '../core/owner-models.js';
import { ModelSet } from './repository/model-set.js';
import { ControlBlock } from '../shared/control.js';
import { EngineClosedError } from '../shared/errors.js';
import { servedSources, type Dtype, type ModelOverrides, type ModelOutput, type Pooling, type ServedPooling, type ServeSettings, type SettingSources, type Task } from '../shared/model-format/model-config.js';
import type { ModelPlan } from '../shared/model-plan.js';
import { cacheLayoutOf, ResultCache } from '../shared/result-cache.js';
import { Counter, Slab } from '../shared/slab.js';
import { SlabSubmitter, type SlotResult } from '../core/submitter.js';

export type { Classification } from '../core/infer.js';
export { resolveBatching } from './plan-models.js';

/** Which models, and the settings imposed on every one of them (over serve.json and the folder's own files): the engine's and the server's alike. */
export interface ModelOptions {
  /** Model repository folder. Default: the package's models/ folder. */
  modelsDir?: string;
  /** Model folder names to load, or folder paths. Default: every model in modelsDir. */
  models?: string[];
  /** Pooling of every embedding model, over its folder's and serve.json's (model-config.ts). */
  pooling?: Pooling;
  /** Longest input of every model in tokens, over its folder's and serve.json's. */
  maxInputLength?: number;
  /** Which of a folder's graphs: fp32 (model.onnx), fp16 (model_fp16.onnx), int8 (model_int8 / model_quantized.onnx); auto (default): fp16 on CUDA where present. */
  dtype?: Dtype;
  /** The prompt before every text that names none, for every embedding model: one of its prompts by name, or a text (src/core/prompts.ts). */
  defaultPromptName?: string;
  defaultPrompt?: string;
}

export interface EngineOptions extends ModelOptions {
  /** 'auto' (default), 'cpu', 'cuda' or 'cuda:N'. */
  device?: string;
  /** Batching knobs; see src/gpu-worker/scheduler.ts. Buckets default to powers of two up to each model's max length. */
  batching?: Partial<BatchingOptions>;
  /**
   * Batches handed to the device before the first finishes. Default 1:
   * onnxruntime-node runs a session synchronously on the inference thread, so
   * a second batch cannot overlap the first; requests that arrive during a run
   * wait in the ring and form the next batch the moment it ends. With 2 or
   * more, the next batch may close (full, or after maxBatchDelayMs) before the
   * running one ends: useful only with an asynchronous execution path.
   */
  maxInflightBatches?: number;
  /** Request slots per model: how many requests may be queued or running at once. Default 1024. */
  slotsPerModel?: number;
  /** MiB of token vectors per model that has them (embedAll): its token area. Default 32. */
  tokenOutputMb?: number;
  /** Deadline of a request that names none, ms. Default 30000. */
  requestTimeoutMs?: number;
  /** onnxruntime intra-op threads; 0 (default): every core, asleep between runs (src/gpu-worker/runner.ts). */
  intraOpThreads?: number;
  /**
   * Sessions of each model that run batches side by side (src/gpu-worker/model-instances.ts);
   * 0 (default): on CPU, one per core up to 4 for a model whose runs take one core, else 1
   * (src/gpu-worker/intra-op-threads.ts).
   */
  modelInstances?: number;
  /** Microseconds the inference loop spins for the next request before it sleeps; 0: it sleeps at once. Default 1000 (src/gpu-worker/inference-loop.ts, DEFAULT_IDLE_SPIN_US). */
  idleSpinUs?: number;
  /** Nice value (0-19) of the intra-op threads on CPU, Linux only; 0: the process's own. Default 10 (src/gpu-worker/runner.ts). */
  intraOpNice?: number;
  /** Priority classes in order (the first is the default) with their fair-share weights. Default interactive 4, bulk 1. */
  priorities?: { name: string; weight: number }[];
  /** A class whose oldest request has waited this long goes first. Default 2000. */
  priorityAgeingMs?: number;
  /** Latency target: adaptive batch window, and admission against it. Default: none (fixed maxBatchDelayMs). */
  sloP99Ms?: number;
  /**
   * A batch run longer than this gets the inference thread replaced (its
   * requests fail with SLABSERVE_INFERENCE_RESTARTED; a thread that dies is
   * replaced too). Default 30000.
   */
  inferenceTimeoutMs?: number;
  /** A loop that has not gone round for this long, no batch running, gets the thread replaced. Default 30000. */
  heartbeatTimeoutMs?: number;
  /**
   * MiB of finished rows kept for inputs seen again (src/shared/result-cache.ts, docs/cache.md):
   * a repeat is answered without the inference thread, with the row computed the first time.
   * Default 0, off (the server's default is 64): the engine is what the quick benchmark and the
   * batching tests drive with repeated inputs, which a cache would answer instead of the device.
   */
  cacheMb?: number;
  /** Where start-up lines go. Default: stderr. */
  log?: (line: string) => void;
}

export const ENGINE_DEFAULTS = {
  device: 'auto',
  maxInflightBatches: 1,
  slotsPerModel: 1024,
  tokenOutputMb: TOKEN_OUTPUT_MB,
  requestTimeoutMs: 30_000,
  intraOpThreads: 0,
  modelInstances: 0,
  idleSpinUs: DEFAULT_IDLE_SPIN_US,
  intraOpNice: 10,
  inferenceTimeoutMs: 30_000,
  heartbeatTimeoutMs: 30_000,
} as const;

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

/** The settings the server's (or engine's) options impose on every model: ModelOverrides. */
export function modelOverrides(o: {
  pooling?: Pooling | undefined;
  maxInputLength?: number | undefined;
  defaultPromptName?: string | undefined;
  defaultPrompt?: string | undefined;
  dtype?: Dtype | undefined;
  device?: string | undefined;
}): ModelOverrides {
  const device = parseDevice(o.device ?? ENGINE_DEFAULTS.device);
  return {
    ...(o.dtype !== undefined ? { dtype: o.dtype } : {}),
    // dtype auto: fp16 where the model has it and the device will be CUDA
    onCuda: device.kind === 'cuda' || (device.kind === 'auto' && cudaMissing() === undefined),
    ...(o.pooling !== undefined ? { pooling: o.pooling } : {}),
    ...(o.maxInputLength !== undefined ? { maxLength: o.maxInputLength } : {}),
    ...(o.defaultPromptName !== undefined ? { defaultPromptName: o.defaultPromptName } : {}),
    ...(o.defaultPrompt !== undefined ? { defaultPrompt: o.defaultPrompt } : {}),
  };
}

/** What a result row of each model looks like, for info() and the HTTP /info route. */
export function describeModel(m: ServedModel['plan']): ModelInfo {
  return {
    name: m.spec.name,
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

export const DEFAULT_PRIORITIES = [
  { name: 'interactive', weight: 4 },
  { name: 'bulk', weight: 1 },
];

export class Engine {
  readonly device: DeviceInfo;
  /** The request pipeline (src/core/infer.ts) the engine's calls go through. */
  private readonly pipeline: Infer;
  /** The slabs this engine submits to, by model id. */
  private readonly owned: OwnerModels;
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
    owned: OwnerModels;
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
    return this.pipeline.list().map((m) => describeModel(m.plan));
  }

  /**
   * Loads a model while the engine serves (docs/model-repository.md): a name under `modelsDir`
   * or a folder's path; a model served already is reloaded from its folder (the version served
   * answers until the new one is warm). `settings` are serve.json's, over the folder's.
   */
  async loadModel(nameOrPath: string, settings?: ServeSettings): Promise<ModelInfo> {
    this.assertOpen();
    await this.repository.load(nameOrPath, settings);
    return describeModel(this.pipeline.byName(basename(resolve(nameOrPath))).plan);
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
    const model = this.pipeline.resolve('embed', opts.model);
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
    const model = this.pipeline.resolve('classify', opts.model);
    const r = await this.infer(model, { kind: 'inputs', inputs: typeof inputs === 'string' ? [inputs] : inputs, truncate: opts.truncate ?? false }, opts);
    return classifications(model, r.rows);
  }

  /**
   * Runs already-tokenized inputs (ids with [CLS]/[SEP]) through `modelName`:
   * the path a benchmark or a pre-tokenized API uses. Returns raw output rows.
   */
  async runTokens(modelName: string, encodings: Pick<Encoding, 'ids' | 'typeIds'>[], opts: RequestOptions = {}): Promise<SlotResult[]> {
    this.assertOpen();
    const model = this.pipeline.byName(modelName);
    const r = await this.infer(model, { kind: 'tokens', tokens: encodings }, opts);
    return encodings.map((_, i) => ({ output: rowOf(r.rows, i), queueMs: r.timing.queueMs, inferenceMs: r.timing.inferenceMs }));
  }

  stats(): Record<string, ModelStats> {
    const out: Record<string, ModelStats> = {};
    for (const m of this.pipeline.list()) out[m.plan.spec.name] = slabStats(this.owned.slabs[m.plan.index]!);
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
  const log = options.log ?? ((line: string) => process.stderr.write(line + '\n'));
  checkDevice(options.device ?? ENGINE_DEFAULTS.device); // before any thread starts
  await checkNativeBinaries({ gateways: false });
  const owners = 1;
  const planning = {
    ...(options.batching ? { batching: options.batching } : {}),
    overrides: modelOverrides(options),
    warn: log,
    slotsPerModel: options.slotsPerModel ?? ENGINE_DEFAULTS.slotsPerModel,
    tokenOutputMb: options.tokenOutputMb ?? ENGINE_DEFAULTS.tokenOutputMb,
    owners,
  };
  const plans = loadModels({
    ...(options.modelsDir ? { modelsDir: options.modelsDir } : {}),
    ...(options.models ? { models: options.models } : {}),
    ...planning,
  });
  const control = ControlBlock.create(owners);
  const testHooks = process.env[TEST_HOOKS_ENV] === '1';
  const models: ServedModel[] = await Promise.all(plans.map(async (plan) => ({ plan, tokenizer: await loadModelTokenizer(plan.spec) })));
  const priorities = options.priorities ?? DEFAULT_PRIORITIES;
  const modelSet = new ModelSet(plans);
  const inference = new InferenceSupervisor(modelSet, control, {
    device: options.device ?? ENGINE_DEFAULTS.device,
    intraOpThreads: options.intraOpThreads ?? ENGINE_DEFAULTS.intraOpThreads,
    intraOpNice: options.intraOpNice ?? ENGINE_DEFAULTS.intraOpNice,
    modelInstances: options.modelInstances ?? ENGINE_DEFAULTS.modelInstances,
    idleSpinUs: options.idleSpinUs ?? ENGINE_DEFAULTS.idleSpinUs,
    maxInflightBatches: options.maxInflightBatches ?? ENGINE_DEFAULTS.maxInflightBatches,
    scheduling: {
      priorityWeights: priorities.map((p) => p.weight),
      priorityAgeingMs: options.priorityAgeingMs ?? DEFAULT_SCHEDULING.priorityAgeingMs,
      ...(options.sloP99Ms !== undefined ? { sloP99Ms: options.sloP99Ms } : {}),
    },
    log,
    inferenceTimeoutMs: options.inferenceTimeoutMs ?? ENGINE_DEFAULTS.inferenceTimeoutMs,
    heartbeatTimeoutMs: options.heartbeatTimeoutMs ?? ENGINE_DEFAULTS.heartbeatTimeoutMs,
    enableTestHooks: testHooks,
  });
  const device = await inference.ready;
  const owned = new OwnerModels(plans);
  const submitter = new SlabSubmitter(owned.slabs, control, OWNER, { buckets: bucketPlans(plans) });
  const requestTimeoutMs = options.requestTimeoutMs ?? ENGINE_DEFAULTS.requestTimeoutMs;
  const infer = new Infer(models, submitter, {
    requestTimeoutMs,
    priorityNames: priorities.map((p) => p.name),
    ...(options.sloP99Ms !== undefined ? { sloP99Ms: options.sloP99Ms } : {}),
    cache: engineCache(options.cacheMb ?? 0, plans),
  });
  // The engine's one owner (this thread) is the repository's only "gateway".
  const handlers = owned.handlers(submitter, infer);
  const repository = new ModelRepository({
    mode: 'explicit',
    modelsDir: resolve(options.modelsDir ?? join(packageRoot, 'models')),
    models: modelSet,
    inference,
    gateways: { callEvery: async <T>(method: string, arg: unknown) => [(await handlers[method as keyof typeof handlers](arg)) as T] },
    plan: (folder, id, serve) => planModel(folder, id, { ...planning, ...(serve ? { serve } : {}), reuse: (bytes) => modelSet.reusable(bytes) }),
    onChange: async () => {},
    log,
    drainTimeoutMs: requestTimeoutMs + 1000,
    paths: true,
  });
  return new Engine({ device, infer, owned, repository, inference, control, submitter, ...(testHooks ? { testHooks: inference.holdHooks() } : {}) });
}

/** The engine's result cache (one owner: its own thread), or null when `cacheMb` is 0. */
function engineCache(cacheMb: number, plans: ModelPlan[]): ResultCache | null {
  return cacheMb > 0 ? ResultCache.create(cacheLayoutOf(cacheMb, plans, 1), OWNER) : null;
}
