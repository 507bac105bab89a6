/**
 * Entry point of an inference thread (one per device). It maps the slabs and
 * the control block, opens one onnxruntime session per model on its device,
 * warms every bucket shape, reports ready, and runs the batching loop until
 * the control block says stop.
 *
 * Messages to the parent (control only, never per request):
 *   { type: 'ready', device, models }   after warm-up
 *   { type: 'batch-error', model, message }
 *   { type: 'fatal', message }           start-up failed; the thread exits
 *   { type: 'stopped' }
 */
import { parentPort, workerData } from 'node:worker_threads';
import { Registry } from 'prom-client';
import { ControlBlock, WorkerState } from '../shared/control.js';
import { inferenceMetrics } from '../shared/metrics.js';
import { RpcPeer } from '../shared/rpc.js';
import type { ModelSpec } from '../shared/model-config.js';
import { Slab, type SlabLayout } from '../shared/slab.js';
import { cudaProviderInstalled, describeCpu, describeCuda, parseDevice, type DeviceInfo } from './device.js';
import { InferenceLoop, type SchedulingOptions } from './inference-loop.js';
import { ModelRunner } from './runner.js';
import { batchCapacity, type BatchingOptions } from './scheduler.js';

export interface InferenceWorkerData {
  control: SharedArrayBuffer;
  owners: number;
  device: string;
  intraOpThreads: number;
  maxInflightBatches: number;
  scheduling: SchedulingOptions;
  models: { spec: ModelSpec; slab: SharedArrayBuffer; layout: SlabLayout; batching: BatchingOptions }[];
}

export type InferenceWorkerMessage =
  | { type: 'ready'; device: DeviceInfo; note?: string }
  | { type: 'batch-error'; model: string; message: string }
  | { type: 'fatal'; message: string }
  | { type: 'stopped' };

const data = workerData as InferenceWorkerData;
const post = (m: InferenceWorkerMessage) => parentPort!.postMessage(m);
const control = new ControlBlock(data.control, data.owners);

/** Opens every model on the requested device; with `auto`, falls back to CPU when CUDA cannot be used. */
async function openRunners(): Promise<{ runners: ModelRunner[]; device: DeviceInfo; note?: string }> {
  const want = parseDevice(data.device);
  const open = (device: DeviceInfo) =>
    Promise.all(
      data.models.map((m) =>
        ModelRunner.create(m.spec, new Slab(m.slab, m.layout), m.batching, device, { intraOpThreads: data.intraOpThreads }, data.maxInflightBatches),
      ),
    );
  if (want.kind === 'cpu') return { runners: await open(describeCpu()), device: describeCpu() };
  if (want.kind === 'cuda' && !cudaProviderInstalled()) {
    throw new Error('device cuda requested but the CUDA provider libraries are not installed: run `npm run cuda:install`');
  }
  if (want.kind === 'auto' && !cudaProviderInstalled()) {
    return { runners: await open(describeCpu()), device: describeCpu(), note: 'auto: CUDA provider not installed, using CPU' };
  }
  const gpu = describeCuda(want.id);
  try {
    return { runners: await open(gpu), device: gpu };
  } catch (err) {
    if (want.kind === 'cuda') throw err;
    return { runners: await open(describeCpu()), device: describeCpu(), note: `auto: CUDA unavailable (${(err as Error).message.split('\n')[0]}), using CPU` };
  }
}

const registry = new Registry();
const metrics = inferenceMetrics(registry);

async function main(): Promise<void> {
  // Answers metrics scrapes; its port listener also keeps this thread alive
  // while the loop sleeps in Atomics.waitAsync.
  new RpcPeer(parentPort!, { metrics: () => registry.getMetricsAsJSON() });
  let runners: ModelRunner[];
  let loop: InferenceLoop;
  try {
    const opened = await openRunners();
    runners = opened.runners;
    loop = createLoop(runners);
    for (const [m, r] of runners.entries()) {
      for (const t of await r.warmUp()) loop.seedCost(m, t.bucket, t.rows, t.ms);
    }
    control.workerState = WorkerState.READY;
    control.heartbeat = Date.now();
    post({ type: 'ready', device: opened.device, ...(opened.note ? { note: opened.note } : {}) });
  } catch (err) {
    control.workerState = WorkerState.FAILED;
    post({ type: 'fatal', message: (err as Error).message });
    process.exit(1);
  }
  await loop.run();
  await Promise.all(runners.map((r) => r.release()));
  control.workerState = WorkerState.STOPPED;
  post({ type: 'stopped' });
  parentPort!.removeAllListeners('message');
  parentPort!.close();
}

function createLoop(runners: ModelRunner[]): InferenceLoop {
  return new InferenceLoop(runners, control, {
    maxInflightBatches: data.maxInflightBatches,
    scheduling: data.scheduling,
    onBatchError: (model, error) => {
      metrics.batchFailures.inc({ model });
      post({ type: 'batch-error', model, message: (error as Error)?.message ?? String(error) });
    },
    onBatch: (m, bucket, stats) => {
      const { spec, batching } = data.models[m]!;
      const labels = { model: spec.name };
      metrics.batchSize.observe(labels, stats.rows);
      metrics.batchDuration.observe(labels, stats.runMs / 1000);
      metrics.fillRatio.observe(labels, stats.rows / batchCapacity(batching, batching.buckets[bucket]!));
      metrics.paddingEfficiency.observe(labels, stats.realTokens / stats.paddedTokens);
    },
  });
}

void main();
