/**
 * Start-up shared by the in-process engine and the server: read the model
 * repository, size a slab per model, start the inference thread and wait for
 * its warm-up. Everything here runs once, on the main thread.
 */
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { describeDevice, type DeviceInfo } from './gpu-worker/device.js';
import { batchCapacity, DEFAULT_BATCHING, defaultBuckets, PAD_TO, type BatchingOptions } from './gpu-worker/scheduler.js';
import { DEFAULT_SCHEDULING, type SchedulingOptions } from './gpu-worker/inference-loop.js';
import type { InferenceWorkerData, InferenceWorkerMessage } from './gpu-worker/worker.js';
import type { ControlBlock } from './shared/control.js';
import { ModelNotFoundError, SlabserveError, ValidationError } from './shared/errors.js';
import { listModelDirs, loadModelSpec, type ModelSpec } from './shared/model-config.js';
import { Slab, type SlabLayout } from './shared/slab.js';

/** The package's own folder (dist/src/.. /..), where models/ lives by default. */
export const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** A model as every thread sees it: its spec, its batching, its slab. Plain data: it crosses to workers. */
export interface ModelPlan {
  index: number;
  spec: ModelSpec;
  batching: BatchingOptions;
  /** Longest accepted input: the model's max length or the last bucket, whichever is shorter. */
  maxLength: number;
  /** Most rows in one batch of each bucket. */
  capacities: number[];
  slab: SharedArrayBuffer;
  layout: SlabLayout;
}

export interface LoadModelsOptions {
  modelsDir?: string;
  models?: string[];
  batching?: Partial<BatchingOptions>;
  slotsPerModel: number;
  /** Threads that submit requests (each gets its own completion queue). */
  owners: number;
}

export function loadModels(opts: LoadModelsOptions): ModelPlan[] {
  const modelsDir = resolve(opts.modelsDir ?? join(packageRoot, 'models'));
  const names = opts.models && opts.models.length > 0 ? opts.models : listModelDirs(modelsDir);
  if (names.length === 0) throw new Error(`no models in ${modelsDir}: run \`npm run models\` to generate the defaults`);
  return names.map((name, index) => {
    const dir = join(modelsDir, name);
    if (!existsSync(join(dir, 'config.json'))) throw new ModelNotFoundError(name, listModelDirs(modelsDir));
    const spec = loadModelSpec(dir, name);
    const batching = resolveBatching(spec, opts.batching);
    const maxLength = Math.min(spec.maxLength, batching.buckets[batching.buckets.length - 1]!);
    const slab = Slab.create({ slotCount: opts.slotsPerModel, maxLength, outputWidth: spec.outputWidth, owners: opts.owners });
    const capacities = batching.buckets.map((len) => batchCapacity(batching, len));
    return { index, spec, batching, maxLength, capacities, slab: slab.buffer, layout: slab.layout };
  });
}

/** Each model's bucket lengths and batch capacities, as owners need them for admission. */
export function bucketPlans(plans: ModelPlan[]): { lengths: number[]; capacities: number[] }[] {
  return plans.map((p) => ({ lengths: p.batching.buckets, capacities: p.capacities }));
}

/** Validates and completes the batching options for one model. */
export function resolveBatching(spec: ModelSpec, given: Partial<BatchingOptions> = {}): BatchingOptions {
  const opts: BatchingOptions = {
    maxBatchSize: given.maxBatchSize ?? DEFAULT_BATCHING.maxBatchSize,
    maxBatchDelayMs: given.maxBatchDelayMs ?? DEFAULT_BATCHING.maxBatchDelayMs,
    maxBatchTokens: given.maxBatchTokens ?? DEFAULT_BATCHING.maxBatchTokens,
    buckets: given.buckets ? [...given.buckets] : defaultBuckets(spec.maxLength),
    padTo: given.padTo ?? DEFAULT_BATCHING.padTo,
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

export interface InferenceThreadOptions {
  device: string;
  intraOpThreads: number;
  maxInflightBatches: number;
  /** Priority classes, their ageing, and the latency target. Default: DEFAULT_SCHEDULING. */
  scheduling?: SchedulingOptions;
  log: (line: string) => void;
}

export interface InferenceThread {
  worker: Worker;
  /** Resolves with the device once every model is loaded and warmed up. */
  ready: Promise<DeviceInfo>;
}

/** Starts the inference thread; `ready` settles when warm-up ends (or start-up fails). */
export function startInferenceThread(models: ModelPlan[], control: ControlBlock, opts: InferenceThreadOptions): InferenceThread {
  if (!Number.isInteger(opts.maxInflightBatches) || opts.maxInflightBatches < 1) {
    throw new ValidationError('maxInflightBatches must be a positive integer');
  }
  const workerData: InferenceWorkerData = {
    control: control.buffer,
    owners: control.owners,
    device: opts.device,
    intraOpThreads: opts.intraOpThreads,
    maxInflightBatches: opts.maxInflightBatches,
    scheduling: opts.scheduling ?? DEFAULT_SCHEDULING,
    models: models.map((m) => ({ spec: m.spec, slab: m.slab, layout: m.layout, batching: m.batching })),
  };
  const worker = new Worker(new URL('./gpu-worker/worker.js', import.meta.url), { workerData, name: 'slabserve-inference' });
  const ready = new Promise<DeviceInfo>((res, rej) => {
    const onExit = (code: number) => rej(new Error(`inference thread exited during start-up (code ${code})`));
    worker.once('exit', onExit);
    worker.once('error', rej);
    worker.on('message', (m: InferenceWorkerMessage) => {
      if (m.type === 'ready') {
        worker.off('exit', onExit);
        if (m.note) opts.log(`slabserve: ${m.note}`);
        opts.log(`slabserve: device ${describeDevice(m.device)}`);
        for (const plan of models) {
          opts.log(
            `slabserve: model ${plan.spec.name} task=${plan.spec.task} device=${m.device.label} ` +
              `buckets=${plan.batching.buckets.join(',')} maxBatchSize=${plan.batching.maxBatchSize}`,
          );
        }
        res(m.device);
      } else if (m.type === 'fatal') {
        rej(new SlabserveError(`inference thread failed to start: ${m.message}`, 'SLABSERVE_START_FAILED', 'unavailable'));
      } else if (m.type === 'batch-error') {
        opts.log(`slabserve: batch of model ${m.model} failed: ${m.message}`);
      }
    });
  });
  return { worker, ready };
}
