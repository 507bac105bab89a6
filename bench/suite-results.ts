/**
 * The shape of `npm run bench`'s raw results (bench/results/<date>-<host>/results.json):
 * what bench/suite.ts measures and bench/report.ts turns into the Markdown
 * report and the SVG plots. One place for the contract between the two, so the
 * report can be re-rendered from an old run (`node dist/bench/report.js DIR`).
 *
 * Units: latencies in milliseconds, rates per second, CPU in milliseconds.
 */

export const RESULTS_VERSION = 1;

import type { SchedulingSection } from './suite/scheduling/aggregate.js';

export interface SuiteResults {
  version: typeof RESULTS_VERSION;
  /** ISO times. */
  startedAt: string;
  finishedAt: string;
  durationS: number;
  /** The command line that produced the run, e.g. `npm run bench -- --quick`. */
  command: string;
  mode: 'full' | 'quick';
  machine: MachineInfo;
  settings: SuiteSettings;
  /** The models measured, and how big they are. */
  models?: ModelInfo[];
  /** The first model's tokenization of each workload (all default models share the bert-base-uncased vocabulary). */
  workloads: WorkloadSummary[];
  /** Every measured phase, in the order run. */
  phases: PhaseResult[];
  /** The headline side-by-side ratios, derived from `phases`. */
  comparisons: Comparison[];
  /** Latency against throughput, one curve per server configuration. */
  curves: Curve[];
  /** The scheduling case (bench/suite/scheduling.ts): in-process engines under open-loop load, rounds merged per row. */
  scheduling?: SchedulingSection;
  /** Figures from a GPU run of bench/gpu/run.sh, when its output folder was given (--gpu-results). */
  gpu?: GpuSection;
  /** Figures that are not phases (the opt-in cases' hit shares, RSS, idle CPU ...), shown in their case's section. */
  notes?: { case: CaseName; line: string }[];
}

export interface MachineInfo {
  host: string;
  /** CPU model name (first core). */
  cpu: string;
  cores: number;
  memoryGiB: number;
  os: string;
  node: string;
  onnxruntime: string;
  slabserve: string;
  /** 1-minute load average at the start and at the end: how busy the shared machine was. */
  loadAverageStart: number;
  loadAverageEnd: number;
}

export interface SuiteSettings {
  seed: number;
  warmupS: number;
  /** Measured seconds per closed-loop phase. */
  durationS: number;
  /** Measured seconds per point of a latency-throughput curve. */
  curvePointS: number;
  /** A/B comparisons alternate their sides this many times. */
  rounds: number;
  /** Offered load of the curve points, as fractions of the measured capacity. */
  loadFractions: number[];
  models: string[];
  device: string;
}

export interface ModelInfo {
  name: string;
  layers: number;
  hidden: number;
  heads: number;
  /** Weights, in millions (float32 ONNX file size / 4). */
  parametersM: number;
  maxLength: number;
}

export interface WorkloadSummary {
  /** 'short', 'mixed', 'client-batch' */
  name: string;
  description: string;
  /** Distinct requests generated (sent round-robin). */
  requests: number;
  inputsPerRequest: number;
  /** Tokens per input, [CLS]/[SEP] included, by the model's tokenizer. */
  tokens: { min: number; p50: number; mean: number; p90: number; p99: number; max: number };
  /** Share of inputs in each default length bucket, e.g. { "16": 0.33, "32": 0.66 }. */
  bucketShares: Record<string, number>;
}

export type CaseName = 'batching' | 'bucketing' | 'efficiency' | 'curve' | 'scheduling' | 'defaults' | 'peer' | 'instances' | 'models' | 'floor' | OptInCase;
/** The cases run only when named (`--cases`): one server question each. */
export type OptInCase = 'cache' | 'grpc' | 'tracing' | 'outputs' | 'idle' | 'model-load' | 'long-inputs';

export interface LatencySummary {
  p50: number;
  p90: number;
  p99: number;
  p999: number;
  max: number;
  mean: number;
}

export interface PhaseResult {
  /** Unique, e.g. `batching/tiny-embed/short/http-64/batched/r1`. */
  id: string;
  case: CaseName;
  model: string;
  workload: string;
  /** What was measured, e.g. `slabserve batched`, `slabserve max-batch-size 1`, `raw onnxruntime b=32`, `transformers.js`. */
  target: string;
  /** The server's command-line flags beyond the common ones (slabserve targets). */
  serverArgs?: string[];
  transport: 'http' | 'ws' | 'grpc' | 'in-process';
  loop: 'closed' | 'open';
  /** Closed loop: callers (HTTP clients, or WS sockets x in flight). */
  concurrency?: number;
  /** Open loop: mean arrivals per second asked for, and as a fraction of the capacity. */
  offeredRps?: number;
  loadFraction?: number;
  /** Open loop: 'poisson' or 'bursts' (Poisson whose rate steps up for short bursts). */
  arrivals?: 'poisson' | 'bursts';
  round: number;
  windowS: number;
  /** Answered 200 inside the window. */
  requests: number;
  inputs: number;
  tokens: number;
  /** 429/503 answers (refused by admission or overload). */
  rejected: number;
  /** Anything else: other statuses, timeouts, connection errors. */
  errors: number;
  firstError?: string;
  rps: number;
  inputsPerS: number;
  tokensPerS: number;
  /** Of the requests answered 200. Open loop: from each request's scheduled arrival (coordinated omission corrected). */
  latencyMs: LatencySummary;
  /** The HDR histogram of those latencies in microseconds, compressed (hdr-histogram-js encodeIntoCompressedBase64). */
  histogram?: string;
  /** From the server's /metrics over the window (slabserve targets only). */
  server?: ServerSide;
  /** CPU of the measured process (the server for HTTP/WS, this process for in-process) per request, ms. */
  cpuMsPerRequest?: number;
  /** The load generator's CPU per request, ms (HTTP/WS): wrk's, or this process's (the Node generator). */
  clientCpuMsPerRequest?: number;
  /** What sent the load (HTTP/WS): wrk, or the Node generator (bench/load.ts). */
  generator?: 'wrk' | 'node';
  /** The server's CPU per request by thread (slabserve_thread_cpu_seconds_total), µs. */
  threadCpuUsPerRequest?: Record<string, number>;
}

export interface ServerSide {
  batches: number;
  meanBatch: number;
  /** Real tokens / padded tokens. */
  paddingEfficiency: number;
  /** Batches of each size over the window: slabserve_batch_size histogram, de-cumulated; `le` is the bucket's upper bound. */
  batchSizes: { le: number; count: number }[];
  /** session.run seconds / window seconds: how busy the device was. */
  deviceBusy: number;
}

export interface Comparison {
  id: string;
  case: CaseName;
  /** The question a user asks, e.g. "What does dynamic batching buy?" */
  question: string;
  model: string;
  workload: string;
  transport: PhaseResult['transport'];
  /** What is compared: requests/s, inputs/s, tokens/s, or a latency. */
  metric: 'rps' | 'inputsPerS' | 'tokensPerS' | 'p50' | 'p99' | 'paddingEfficiency' | 'cpuUsPerRequest';
  a: { label: string; value: number };
  b: { label: string; value: number };
  /** a / b (median over rounds). */
  ratio: number;
  /** a / b of each round, side by side. */
  roundRatios: number[];
  note?: string;
}

export interface Curve {
  id: string;
  model: string;
  workload: string;
  transport: 'http' | 'ws';
  /** e.g. `fixed window 5 ms`, `--slo-p99-ms 50`. */
  label: string;
  serverArgs: string[];
  /** The requests/s the load fractions refer to (closed-loop capacity of the default configuration). */
  capacityRps: number;
  sloP99Ms?: number;
  points: CurvePoint[];
}

export interface CurvePoint {
  loadFraction: number;
  arrivals: 'poisson' | 'bursts';
  offeredRps: number;
  /** Answered 200 per second. */
  achievedRps: number;
  p50: number;
  p99: number;
  /** Share of offered requests refused (429/503). */
  rejectedShare: number;
  errors: number;
  meanBatch?: number;
  /** The phase this point came from. */
  phaseId: string;
}

export interface GpuSection {
  /** nvidia-smi: name, memory, driver. */
  card: string;
  /** The summary table bench/gpu/run.sh wrote (Markdown), included as is. */
  summaryMarkdown: string;
  folder: string;
}
