/**
 * The in-process engine: loads the model repository, starts the inference
 * thread, and submits requests through the slabs exactly as a gateway thread
 * does. It is what tests and the quick benchmark drive, and what `slabserve
 * serve` builds its gateways around.
 *
 *   const engine = await createEngine({ device: 'auto' });
 *   const [vec] = await engine.embed('where is my parcel?');
 *   const [top] = await engine.classify('I want my money back');
 *   await engine.close();
 */
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { loadTokenizer, type Encoding, type TextTokenizer } from './gateway/tokenizer.js';
import { describeDevice, type DeviceInfo } from './gpu-worker/device.js';
import { DEFAULT_BATCHING, defaultBuckets, type BatchingOptions } from './gpu-worker/scheduler.js';
import type { InferenceWorkerData, InferenceWorkerMessage } from './gpu-worker/worker.js';
import { nowMs } from './shared/clock.js';
import { ControlBlock } from './shared/control.js';
import { EngineClosedError, ModelNotFoundError, SlabserveError, ValidationError } from './shared/errors.js';
import { listModelDirs, loadModelSpec, type ModelSpec, type Task } from './shared/model-config.js';
import { Counter, Slab } from './shared/slab.js';
import { SlabSubmitter, type SlotResult } from './shared/submitter.js';

export interface EngineOptions {
  /** Model repository folder. Default: the package's models/ folder. */
  modelsDir?: string;
  /** Model folder names to load. Default: every model in modelsDir. */
  models?: string[];
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
  /** Deadline of a request that names none, ms. Default 30000. */
  requestTimeoutMs?: number;
  /** onnxruntime intra-op threads; 0 (default) lets onnxruntime choose. */
  intraOpThreads?: number;
  /** Where start-up lines go. Default: stderr. */
  log?: (line: string) => void;
}

export const ENGINE_DEFAULTS = {
  device: 'auto',
  maxInflightBatches: 1,
  slotsPerModel: 1024,
  requestTimeoutMs: 30_000,
  intraOpThreads: 0,
} as const;

export interface RequestOptions {
  /** Model name; default: the first loaded model of the right task. */
  model?: string;
  /** Cut inputs longer than the model's max length instead of rejecting them. Default false. */
  truncate?: boolean;
  /** Cancels the request: its slot is freed and, if it has not run, it never runs. */
  signal?: AbortSignal;
  /** Overrides the engine's requestTimeoutMs for this call. */
  timeoutMs?: number;
}

export interface EmbedOptions extends RequestOptions {
  /** L2-normalise (default: the model's serve.json, normally true). */
  normalize?: boolean;
}

export interface Classification {
  /** Most likely label and its probability. */
  label: string;
  score: number;
  /** Probability of every label, by class id. */
  probabilities: Float32Array;
  /** Raw logits, by class id. */
  logits: Float32Array;
}

export interface ModelInfo {
  name: string;
  task: Task;
  maxLength: number;
  dimension: number;
  labels: string[];
  batching: BatchingOptions;
}

export interface ModelStats {
  slotsInUse: number;
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

interface LoadedModel {
  index: number;
  spec: ModelSpec;
  tokenizer: TextTokenizer;
  slab: Slab;
  batching: BatchingOptions;
  /** Longest accepted input: the model's max length or the last bucket, whichever is shorter. */
  maxLength: number;
}

const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const OWNER = 0; // the engine's own thread; gateway threads take 1..N

export class Engine {
  readonly device: DeviceInfo;
  private readonly models: LoadedModel[];
  private readonly worker: Worker;
  private readonly control: ControlBlock;
  private readonly submitter: SlabSubmitter;
  private readonly requestTimeoutMs: number;
  private closing: Promise<void> | null = null;

  /** Use createEngine(). */
  constructor(parts: { device: DeviceInfo; models: LoadedModel[]; worker: Worker; control: ControlBlock; requestTimeoutMs: number }) {
    this.device = parts.device;
    this.models = parts.models;
    this.worker = parts.worker;
    this.control = parts.control;
    this.requestTimeoutMs = parts.requestTimeoutMs;
    this.submitter = new SlabSubmitter(
      parts.models.map((m) => m.slab),
      parts.control,
      OWNER,
    );
  }

  info(): ModelInfo[] {
    return this.models.map((m) => ({
      name: m.spec.name,
      task: m.spec.task,
      maxLength: m.maxLength,
      dimension: m.spec.task === 'embed' ? m.spec.hiddenSize : m.spec.labels.length,
      labels: m.spec.labels,
      batching: m.batching,
    }));
  }

  /** Embeds each text; one Float32Array per input, in order. */
  async embed(inputs: string | string[], opts: EmbedOptions = {}): Promise<Float32Array[]> {
    const model = this.pick('embed', opts.model);
    const encodings = await this.tokenize(model, inputs, opts);
    return this.embedEncodings(model, encodings, opts);
  }

  /** Classifies each text; one Classification per input, in order. */
  async classify(inputs: string | string[], opts: RequestOptions = {}): Promise<Classification[]> {
    const model = this.pick('classify', opts.model);
    const encodings = await this.tokenize(model, inputs, opts);
    const results = await this.submitAll(model, encodings, opts);
    const n = model.spec.labels.length;
    return results.map((r) => {
      const probabilities = r.output.subarray(0, n);
      let best = 0;
      for (let i = 1; i < n; i++) if (probabilities[i]! > probabilities[best]!) best = i;
      return { label: model.spec.labels[best]!, score: probabilities[best]!, probabilities, logits: r.output.subarray(n, 2 * n) };
    });
  }

  /**
   * Runs already-tokenized inputs (ids with [CLS]/[SEP]) through `model`:
   * the path a benchmark or a pre-tokenized API uses. Returns raw output rows.
   */
  async runTokens(modelName: string, encodings: Pick<Encoding, 'ids' | 'typeIds'>[], opts: RequestOptions = {}): Promise<SlotResult[]> {
    const model = this.byName(modelName);
    for (const e of encodings) {
      if (e.ids.length > model.maxLength) throw new ValidationError(`input of ${e.ids.length} tokens exceeds ${model.maxLength}`);
    }
    return this.submitAll(model, encodings, opts);
  }

  stats(): Record<string, ModelStats> {
    const out: Record<string, ModelStats> = {};
    for (const m of this.models) {
      const c = m.slab.counters;
      out[m.spec.name] = {
        slotsInUse: m.slab.slotsInUse(),
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
    return out;
  }

  /** Stops the inference thread after its running batches; requests still queued fail with EngineClosedError. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      const exited = new Promise<void>((res) => this.worker.once('exit', () => res()));
      this.control.requestStop();
      await exited;
      this.submitter.close(new EngineClosedError());
    })();
    return this.closing;
  }

  private async embedEncodings(model: LoadedModel, encodings: Encoding[], opts: EmbedOptions): Promise<Float32Array[]> {
    const results = await this.submitAll(model, encodings, opts);
    const dim = model.spec.hiddenSize;
    const normalize = opts.normalize ?? model.spec.normalize;
    return results.map((r) => {
      const v = r.output.subarray(0, dim);
      if (!normalize) {
        const norm = r.output[dim]!;
        for (let i = 0; i < dim; i++) v[i]! *= norm;
      }
      return v;
    });
  }

  private submitAll(model: LoadedModel, encodings: Pick<Encoding, 'ids' | 'typeIds'>[], opts: RequestOptions): Promise<SlotResult[]> {
    if (this.closing) return Promise.reject(new EngineClosedError());
    const deadline = nowMs() + (opts.timeoutMs ?? this.requestTimeoutMs);
    const submitted = encodings.map((e) =>
      this.submitter.submit(model.index, e.ids, e.typeIds, { deadline, ...(opts.signal ? { signal: opts.signal } : {}) }),
    );
    return Promise.all(submitted);
  }

  private async tokenize(model: LoadedModel, inputs: string | string[], opts: RequestOptions): Promise<Encoding[]> {
    const texts = typeof inputs === 'string' ? [inputs] : inputs;
    if (!Array.isArray(texts) || texts.length === 0) throw new ValidationError('inputs must be a string or a non-empty list of strings');
    for (const t of texts) {
      if (typeof t !== 'string') throw new ValidationError('every input must be a string');
      if (t.length === 0) throw new ValidationError('inputs must not be empty strings');
    }
    const encOpts = { maxLength: model.maxLength, truncate: opts.truncate ?? false };
    return texts.length === 1 ? [model.tokenizer.encode(texts[0]!, encOpts)] : await model.tokenizer.encodeBatch(texts, encOpts);
  }

  private pick(task: Task, name: string | undefined): LoadedModel {
    if (name !== undefined) {
      const m = this.byName(name);
      if (m.spec.task !== task) throw new ValidationError(`model "${name}" is a ${m.spec.task} model, not ${task}`);
      return m;
    }
    const m = this.models.find((x) => x.spec.task === task);
    if (!m) throw new ModelNotFoundError(`(any ${task} model)`, this.models.map((x) => x.spec.name));
    return m;
  }

  private byName(name: string): LoadedModel {
    const m = this.models.find((x) => x.spec.name === name);
    if (!m) throw new ModelNotFoundError(name, this.models.map((x) => x.spec.name));
    return m;
  }
}

/** Validates and completes the batching options for one model. */
export function resolveBatching(spec: ModelSpec, given: Partial<BatchingOptions> = {}): BatchingOptions {
  const opts: BatchingOptions = {
    maxBatchSize: given.maxBatchSize ?? DEFAULT_BATCHING.maxBatchSize,
    maxBatchDelayMs: given.maxBatchDelayMs ?? DEFAULT_BATCHING.maxBatchDelayMs,
    maxBatchTokens: given.maxBatchTokens ?? DEFAULT_BATCHING.maxBatchTokens,
    buckets: given.buckets ? [...given.buckets] : defaultBuckets(spec.maxLength),
  };
  const positiveInt = (name: string, v: number) => {
    if (!Number.isInteger(v) || v < 1) throw new ValidationError(`${name} must be a positive integer, got ${v}`);
  };
  positiveInt('maxBatchSize', opts.maxBatchSize);
  positiveInt('maxBatchTokens', opts.maxBatchTokens);
  if (!(opts.maxBatchDelayMs >= 0) || !Number.isFinite(opts.maxBatchDelayMs)) {
    throw new ValidationError(`maxBatchDelayMs must be a number >= 0, got ${opts.maxBatchDelayMs}`);
  }
  if (opts.buckets.length === 0) throw new ValidationError('buckets must not be empty');
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

export async function createEngine(options: EngineOptions = {}): Promise<Engine> {
  const log = options.log ?? ((line: string) => process.stderr.write(line + '\n'));
  const modelsDir = resolve(options.modelsDir ?? join(packageRoot, 'models'));
  const names = options.models ?? listModelDirs(modelsDir);
  if (names.length === 0) throw new Error(`no models in ${modelsDir}: run \`npm run models\` to generate the defaults`);
  const slotsPerModel = options.slotsPerModel ?? ENGINE_DEFAULTS.slotsPerModel;
  const maxInflightBatches = options.maxInflightBatches ?? ENGINE_DEFAULTS.maxInflightBatches;
  if (!Number.isInteger(maxInflightBatches) || maxInflightBatches < 1) throw new ValidationError('maxInflightBatches must be a positive integer');
  const owners = 1;

  const models: LoadedModel[] = [];
  for (const [index, name] of names.entries()) {
    const dir = join(modelsDir, name);
    if (!existsSync(join(dir, 'config.json'))) throw new ModelNotFoundError(name, listModelDirs(modelsDir));
    const spec = loadModelSpec(dir, name);
    const batching = resolveBatching(spec, options.batching);
    const maxLength = Math.min(spec.maxLength, batching.buckets[batching.buckets.length - 1]!);
    const slab = Slab.create({ slotCount: slotsPerModel, maxLength, outputWidth: spec.outputWidth, owners });
    models.push({ index, spec, tokenizer: await loadTokenizer(spec.tokenizerPath), slab, batching, maxLength });
  }

  const control = ControlBlock.create(owners);
  const workerData: InferenceWorkerData = {
    control: control.buffer,
    owners,
    device: options.device ?? ENGINE_DEFAULTS.device,
    intraOpThreads: options.intraOpThreads ?? ENGINE_DEFAULTS.intraOpThreads,
    maxInflightBatches,
    models: models.map((m) => ({ spec: m.spec, slab: m.slab.buffer, layout: m.slab.layout, batching: m.batching })),
  };
  const worker = new Worker(new URL('./gpu-worker/worker.js', import.meta.url), { workerData, name: 'slabserve-inference' });

  const device = await new Promise<DeviceInfo>((res, rej) => {
    const onExit = (code: number) => rej(new Error(`inference thread exited during start-up (code ${code})`));
    worker.once('exit', onExit);
    worker.on('error', rej);
    worker.on('message', (m: InferenceWorkerMessage) => {
      if (m.type === 'ready') {
        worker.off('exit', onExit);
        if (m.note) log(`slabserve: ${m.note}`);
        res(m.device);
      } else if (m.type === 'fatal') {
        rej(new SlabserveError(`inference thread failed to start: ${m.message}`, 'SLABSERVE_START_FAILED', 'unavailable'));
      } else if (m.type === 'batch-error') {
        log(`slabserve: batch of model ${m.model} failed: ${m.message}`);
      }
    });
  });
  log(`slabserve: device ${describeDevice(device)}`);
  for (const m of models) {
    log(`slabserve: model ${m.spec.name} task=${m.spec.task} device=${device.label} buckets=${m.batching.buckets.join(',')} maxBatchSize=${m.batching.maxBatchSize}`);
  }
  return new Engine({ device, models, worker, control, requestTimeoutMs: options.requestTimeoutMs ?? ENGINE_DEFAULTS.requestTimeoutMs });
}
