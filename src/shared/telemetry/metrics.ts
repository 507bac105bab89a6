/**
 * Every Prometheus metric slabserve exports, defined in one place. Each
 * thread registers its own share in its own prom-client Registry; the main
 * thread merges them on scrape (AggregatorRegistry.aggregate), so /metrics is
 * one view of the whole process. Names follow Prometheus conventions: base
 * units, `_seconds`, `_total`. docs/metrics.md lists them.
 */
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import { CellCounter, CellHistogram } from './metric-cells.js';

const LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
const RATIO_BUCKETS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1];

/**
 * Recorded by each gateway thread, per request. The per-request ones are
 * cell metrics (metric-cells.ts): a label set is bound once per route and
 * model, and an observation costs a bucket search.
 */
export function gatewayMetrics(registry: Registry) {
  const registers = [registry];
  return {
    requestDuration: new CellHistogram({
      name: 'slabserve_request_duration_seconds',
      help: 'End-to-end request latency in the gateway: body read to response written.',
      labelNames: ['model', 'route', 'status'],
      buckets: LATENCY_BUCKETS,
      registers,
    }),
    queueDuration: new CellHistogram({
      name: 'slabserve_request_queue_duration_seconds',
      help: 'Time a request waited in the queue before its batch started (longest of its inputs).',
      labelNames: ['model'],
      buckets: LATENCY_BUCKETS,
      registers,
    }),
    inputs: new CellCounter({
      name: 'slabserve_request_inputs_total',
      help: 'Inputs (texts or token sequences) received, one slot each.',
      labelNames: ['model', 'route'],
      registers,
    }),
    failures: new CellCounter({
      name: 'slabserve_request_failures_total',
      help: 'Requests answered with an error, by reason (the error type).',
      labelNames: ['reason'],
      registers,
    }),
    cancellations: new Counter({
      name: 'slabserve_cancellations_total',
      help: 'Requests given up before their answer, by reason: client_disconnect, ws_cancel, ws_close, deadline (ran but finished late), request_failed (a sibling input failed).',
      labelNames: ['reason'] as const,
      registers,
    }),
    cancelledTokens: new Counter({
      name: 'slabserve_cancelled_tokens_total',
      help: 'Real tokens of cancelled requests: saved (never ran) or wasted (the device had run them).',
      labelNames: ['reason', 'outcome'] as const,
      registers,
    }),
    loneWaits: new Counter({
      name: 'slabserve_gateway_lone_waits_total',
      help: 'Answers a gateway thread held itself awake for, its request being the only one in the server (--lone-wait-us): outcome answered (it came within the wait) or released (the bound passed first).',
      labelNames: ['outcome'] as const,
      registers,
    }),
    eventLoopLag: new Gauge({
      name: 'slabserve_gateway_event_loop_lag_seconds',
      help: 'P99 event-loop delay of each gateway thread since the last scrape.',
      labelNames: ['gateway'] as const,
      registers,
    }),
    connections: new Gauge({
      name: 'slabserve_gateway_connections',
      help: 'Connections the gateways hold: kind ws (open WebSockets) and http (HTTP connections with a request in progress).',
      labelNames: ['kind'] as const,
      registers,
    }),
    connectionsRejected: new Counter({
      name: 'slabserve_connections_rejected_total',
      help: 'Connections refused with 503 past --max-connections: kind http (a request) or ws (an upgrade).',
      labelNames: ['kind'] as const,
      registers,
    }),
  };
}
export type GatewayMetrics = ReturnType<typeof gatewayMetrics>;

/**
 * Recorded by the inference thread, per batch. The per-batch histograms are
 * cell metrics, bound once per model (src/gpu-worker/thread.ts): prom-client's observe with
 * labels, per batch, shows up in the inference thread's profile under load.
 */
export function inferenceMetrics(registry: Registry) {
  const registers = [registry];
  return {
    batchSize: new CellHistogram({
      name: 'slabserve_batch_size',
      help: 'Requests per batch run on the device.',
      labelNames: ['model'],
      buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256],
      registers,
    }),
    batchDuration: new CellHistogram({
      name: 'slabserve_batch_duration_seconds',
      help: 'Wall time of one batch run (session.run).',
      labelNames: ['model'],
      buckets: LATENCY_BUCKETS,
      registers,
    }),
    fillRatio: new CellHistogram({
      name: 'slabserve_batch_fill_ratio',
      help: 'Batch size / the most its bucket allows (maxBatchSize or the token budget).',
      labelNames: ['model'],
      buckets: RATIO_BUCKETS,
      registers,
    }),
    paddingEfficiency: new CellHistogram({
      name: 'slabserve_batch_padding_efficiency',
      help: 'Real tokens / padded tokens computed in one batch.',
      labelNames: ['model'],
      buckets: RATIO_BUCKETS,
      registers,
    }),
    batchFailures: new Counter({
      name: 'slabserve_batch_failures_total',
      help: 'Batches whose run threw (their requests failed).',
      labelNames: ['model'] as const,
      registers,
    }),
    fusedLayerNorms: new Gauge({
      name: 'slabserve_model_fused_layer_norms',
      help: "LayerNormalizations of each model's graph run fused with their residual sum as SkipLayerNormalization (0: the graph as exported; also where the fused graph could not run).",
      labelNames: ['model'] as const,
      registers,
    }),
    fusedAttentions: new Gauge({
      name: 'slabserve_model_fused_attentions',
      help: "Self-attentions of each model's graph run as one onnxruntime Attention node (0: as exported; also where the fused graph could not run).",
      labelNames: ['model'] as const,
      registers,
    }),
  };
}
export type InferenceMetrics = ReturnType<typeof inferenceMetrics>;

/** slabserve_trace_spans_dropped_total of a thread that makes spans (tracing.ts): read from its processor at scrape time. */
export function traceDropMetric(registry: Registry, dropped: () => number): void {
  new Counter({
    name: 'slabserve_trace_spans_dropped_total',
    help: 'Spans not exported: the export queue was full (a slow or absent collector) or an export failed.',
    registers: [registry],
    collect() {
      this.reset();
      this.inc(dropped());
    },
  });
}

/** What the main thread reads from shared memory at scrape time. */
export interface ProcessState {
  models(): {
    name: string;
    queued: number;
    slotsInUse: number;
    tokenPagesInUse: number;
    tokenPages: number;
    slots: number;
    realTokens: number;
    paddedTokens: number;
    expired: number;
    expiredTokens: number;
    cancelled: number;
    /** Runs of halves of failed batches (SPLIT_RUNS). */
    splitRuns: number;
    /** Inputs that failed alone while the rest of their batch ran (ISOLATED_INPUTS). */
    failedAlone: number;
    /** Fitted batch cost per bucket. */
    costs: { bucket: number; fixedMs: number; perRowMs: number }[];
  }[];
  ready(): boolean;
  heartbeatAgeSeconds(): number;
  /** Device memory, where the provider exposes it (nvidia-smi for CUDA); null on CPU. */
  deviceMemory(): { device: string; totalBytes?: number; usedBytes?: number } | null;
  /** CPU seconds per thread of the process (main, gateway-N, inference, onnxruntime, other); empty where /proc is missing. */
  threadCpuSeconds(): Map<string, number>;
}

type ModelState = ReturnType<ProcessState['models']>[number];

/** The per-model gauges that read one number of ProcessState.models(): name, help, which number. */
const PER_MODEL_GAUGES: readonly [name: string, help: string, key: keyof ModelState][] = [
  ['slabserve_queue_depth', 'Requests queued for the device, not yet in a batch.', 'queued'],
  ['slabserve_slots_in_use', 'Request slots taken (filling, queued, running or being answered).', 'slotsInUse'],
  ['slabserve_slots', 'Request slots per model (--slots-per-model): the admission limit.', 'slots'],
  ['slabserve_token_pages_in_use', 'Pages of the token area taken: inputs whose token vectors are in flight (/embed_all, ColBERT).', 'tokenPagesInUse'],
  ['slabserve_token_pages', 'Pages of the token area per model (--token-output-mb / one input of max length): the admission limit for token vectors; 0 without token outputs.', 'tokenPages'],
  ['slabserve_requests_expired_total', 'Requests dropped before running: their deadline had passed.', 'expired'],
  ['slabserve_expired_tokens_total', 'Real tokens of requests dropped before running because their deadline passed (work saved).', 'expiredTokens'],
  ['slabserve_batch_split_runs_total', 'Runs of a half (of a half...) of a failed batch, retried to find the inputs that make it fail.', 'splitRuns'],
  ['slabserve_inputs_failed_alone_total', 'Inputs the model failed on alone while the rest of their batch ran (answered 422 SLABSERVE_INPUT_FAILED).', 'failedAlone'],
  ['slabserve_requests_cancelled_total', 'Requests cancelled (client gone) that the device never ran or whose result was dropped.', 'cancelled'],
];

/** Gauges and counters the main thread computes from shared memory on each scrape. */
export function processMetrics(registry: Registry, state: ProcessState): void {
  const registers = [registry];
  for (const [name, help, key] of PER_MODEL_GAUGES) {
    new Gauge({
      name,
      help,
      labelNames: ['model'],
      registers,
      collect() {
        this.reset();
        for (const m of state.models()) this.set({ model: m.name }, m[key] as number);
      },
    });
  }
  modelWorkGauges(registers, state);
  healthGauges(registers, state);
}

/** Tokens computed (real and padded) and the fitted batch cost, per model. */
function modelWorkGauges(registers: Registry[], state: ProcessState): void {
  new Gauge({
    name: 'slabserve_tokens_total',
    help: 'Tokens computed on the device: real ones and padded ones (real + padding). Padding efficiency = real / padded.',
    labelNames: ['model', 'kind'],
    registers,
    collect() {
      this.reset();
      for (const m of state.models()) {
        this.set({ model: m.name, kind: 'real' }, m.realTokens);
        this.set({ model: m.name, kind: 'padded' }, m.paddedTokens);
      }
    },
  });
  new Gauge({
    name: 'slabserve_batch_cost_seconds',
    help: 'The online cost model of a batch run, per bucket: seconds = fixed + per_row x rows.',
    labelNames: ['model', 'bucket', 'term'],
    registers,
    collect() {
      this.reset();
      for (const m of state.models()) {
        for (const c of m.costs) {
          this.set({ model: m.name, bucket: String(c.bucket), term: 'fixed' }, c.fixedMs / 1000);
          this.set({ model: m.name, bucket: String(c.bucket), term: 'per_row' }, c.perRowMs / 1000);
        }
      }
    },
  });
}

/** Readiness, the inference thread's heartbeat, CPU per thread, device memory. */
function healthGauges(registers: Registry[], state: ProcessState): void {
  new Gauge({
    name: 'slabserve_ready',
    help: '1 when the server is ready (warmed up, inference thread alive, not draining).',
    registers,
    collect() {
      this.set(state.ready() ? 1 : 0);
    },
  });
  new Gauge({
    name: 'slabserve_inference_heartbeat_age_seconds',
    help: 'Seconds since the inference thread last went round its loop.',
    registers,
    collect() {
      this.set(state.heartbeatAgeSeconds());
    },
  });
  new Gauge({
    name: 'slabserve_thread_cpu_seconds_total',
    help: 'CPU time per thread of the process: main, gateway-N, inference, onnxruntime (its intra-op pool), other (V8 and libuv helpers, the tokenizer pool). Linux only.',
    labelNames: ['thread'],
    registers,
    collect() {
      this.reset();
      for (const [thread, s] of state.threadCpuSeconds()) this.set({ thread }, s);
    },
  });
  new Gauge({
    name: 'slabserve_device_memory_bytes',
    help: 'Device memory (total and used) where the execution provider exposes it (CUDA, via nvidia-smi).',
    labelNames: ['device', 'kind'],
    registers,
    collect() {
      this.reset();
      const d = state.deviceMemory();
      if (!d) return;
      if (d.totalBytes !== undefined) this.set({ device: d.device, kind: 'total' }, d.totalBytes);
      if (d.usedBytes !== undefined) this.set({ device: d.device, kind: 'used' }, d.usedBytes);
    },
  });
}

/** One model's result-cache counts, summed over the threads (src/shared/result-cache.ts statsOf). */
export interface CacheState {
  name: string;
  hits: number;
  misses: number;
  evictions: number;
  bytes: number;
  capacityBytes: number;
}

/** The result cache's series (--cache-mb), read from its shared memory at scrape time; not registered when it is off. */
export function cacheMetrics(registry: Registry, models: () => CacheState[]): void {
  const registers = [registry];
  const perModel = (key: keyof Omit<CacheState, 'name'>) =>
    function (this: Gauge<'model'>) {
      this.reset();
      for (const m of models()) this.set({ model: m.name }, m[key]);
    };
  const series: [string, keyof Omit<CacheState, 'name'>, string][] = [
    ['slabserve_cache_hits_total', 'hits', 'Inputs answered from the result cache (no slot, no inference).'],
    ['slabserve_cache_misses_total', 'misses', 'Inputs looked up in the result cache and not found (run on the device), those too long to cache included.'],
    ['slabserve_cache_evictions_total', 'evictions', "Cached rows replaced by another input's (the least used of their set)."],
    ['slabserve_cache_bytes', 'bytes', 'Bytes of the result cache holding rows now (keys and rows as laid out).'],
    ['slabserve_cache_capacity_bytes', 'capacityBytes', "Bytes of the result cache given to the model (its share of --cache-mb)."],
  ];
  for (const [name, key, help] of series) new Gauge({ name, help, labelNames: ['model'], registers, collect: perModel(key) });
}

/** Kept by the main thread: thread replacements. */
export function supervisionMetrics(registry: Registry, state: { abandonedInferenceThreads(): number }) {
  const registers = [registry];
  new Gauge({
    name: 'slabserve_inference_threads_abandoned',
    help: 'Inference threads given up that have not exited yet (stuck in a native call that does not return).',
    registers,
    collect() {
      this.set(state.abandonedInferenceThreads());
    },
  });
  return {
    inferenceRestarts: new Counter({
      name: 'slabserve_inference_restarts_total',
      help: 'Inference threads replaced, by reason: crash (uncaught error), oom, exit, run_timeout (a batch ran past --inference-timeout-ms), heartbeat_timeout (its loop stalled past --heartbeat-timeout-ms).',
      labelNames: ['reason'] as const,
      registers,
    }),
    restartFailedInputs: new Counter({
      name: 'slabserve_inference_restart_failed_inputs_total',
      help: 'Inputs answered 503 (SLABSERVE_INFERENCE_RESTARTED) because the inference thread was replaced while they were queued or running.',
      registers,
    }),
    gatewayRestarts: new Counter({
      name: 'slabserve_gateway_restarts_total',
      help: 'Gateway threads replaced, by reason: crash (uncaught error), exit.',
      labelNames: ['reason'] as const,
      registers,
    }),
  };
}

/** The model repository's (src/main/repository/repository.ts), kept by the main thread. */
export function repositoryMetrics(registry: Registry, state: { loaded(): { name: string; memoryBytes: number | null }[]; known(): string[] }) {
  const registers = [registry];
  new Gauge({
    name: 'slabserve_model_loaded',
    help: 'Whether each model of the repository is served now (1) or not (0).',
    labelNames: ['model'] as const,
    registers,
    collect() {
      this.reset();
      for (const name of state.known()) this.set({ model: name }, 0);
      for (const m of state.loaded()) this.set({ model: m.name }, 1);
    },
  });
  new Gauge({
    name: 'slabserve_model_memory_bytes',
    help: "Each loaded model's footprint as measured at its load: the process's resident memory after its session was created and warmed up, less before, plus its slab (absent for the models loaded at start).",
    labelNames: ['model'] as const,
    registers,
    collect() {
      this.reset();
      for (const m of state.loaded()) if (m.memoryBytes !== null) this.set({ model: m.name }, m.memoryBytes);
    },
  });
  return {
    loads: new Counter({
      name: 'slabserve_model_loads_total',
      help: 'Model loads and reloads, by outcome: ok, failed.',
      labelNames: ['model', 'outcome'] as const,
      registers,
    }),
    unloads: new Counter({
      name: 'slabserve_model_unloads_total',
      help: 'Model versions unloaded, by reason: request (an unload), reload (the version a reload replaced), budget (to make room for a load), idle (past --model-idle-unload-s).',
      labelNames: ['model', 'reason'] as const,
      registers,
    }),
    loadSeconds: new Histogram({
      name: 'slabserve_model_load_seconds',
      help: 'Time from a load request to the model taking requests: files read, session opened, every bucket warmed up, handed to the gateways.',
      labelNames: ['model'] as const,
      buckets: [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120],
      registers,
    }),
  };
}

export type RepositoryMetrics = ReturnType<typeof repositoryMetrics>;
