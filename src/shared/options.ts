/**
 * Every option of slabserve, once: its flag, environment variable, type,
 * default, help and scope. The command line (src/cli.ts), ServerConfig, the
 * engine's options and docs/configuration.md are made from this table; the
 * modules that apply an option read its default here.
 *
 * Scope: `engine`, an option of the server and of the in-process engine alike;
 * `server`, the server's only; `cluster`, the cluster's primary (--processes,
 * --devices). An option a model folder may set too (its serve.json, its
 * sentence-transformers files) is `perModel`: the flag overrides the folder,
 * and the default applies only where neither says.
 */
import { PAD_TO, type PadTo } from './batching.js';
import { DTYPES, POOLINGS, WEIGHTS_SOURCES, type Dtype, type Pooling, type WeightsSource } from './model-format/model-config.js';

export type Scope = 'engine' | 'server' | 'cluster';

/** How a value is read from its flag or variable. */
export type Kind = 'int' | 'number' | 'bool' | 'string' | 'list' | 'intList' | 'priorities';

export interface OptionSpec<T> {
  /** The flag with its argument, as --help shows it. */
  flag: string;
  kind: Kind;
  /** int, number: the least and the most accepted (number: `min` 0 is ">= 0", `exclusiveMin` makes it "> 0"). */
  min?: number;
  max?: number;
  exclusiveMin?: boolean;
  choices?: readonly string[];
  default?: T;
  /** What --help and the docs say of the default where it is worked out at start (the cores, the port, the model). */
  defaultHelp?: string;
  help: string;
  scope: Scope;
  perModel?: boolean;
}


type Entry<T, S extends Scope> = Omit<OptionSpec<T>, 'scope'> & { scope: S };

/** The definer of one scope's options: the value's type is given or read from the default. */
function definer<S extends Scope>(scope: S) {
  function define<T>(spec: Omit<OptionSpec<T>, 'scope'> & { default: T }): Entry<T, S> & { default: T };
  function define<T>(spec: Omit<OptionSpec<T>, 'scope'>): Entry<T, S>;
  function define<T>(spec: Omit<OptionSpec<T>, 'scope'>): Entry<T, S> {
    return { ...spec, scope };
  }
  return define;
}
const server = definer('server');
const engine = definer('engine');
const cluster = definer('cluster');

/** What happens to an input longer than the model takes (--long-inputs, a request's `long_inputs`): src/core/long-inputs.ts. */
export const LONG_INPUTS = ['error', 'truncate', 'chunk'] as const;
export type LongInputs = (typeof LONG_INPUTS)[number];

/** What integer inputs of OpenAI's /v1/embeddings are: tiktoken's cl100k_base ids (OpenAI's), or the model's own. */
export type OpenAITokenIds = 'cl100k_base' | 'model';

/** Triton's --model-control-mode: `none`, the set is fixed at start; `explicit`, the repository routes load and unload. */
export type ModelControlMode = 'none' | 'explicit';
export const MODEL_CONTROL_MODES: readonly ModelControlMode[] = ['none', 'explicit'];
export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];
/** auto: readable where the output is a terminal, JSON elsewhere. */
export const LOG_FORMATS = ['auto', 'json', 'pretty'] as const;
export type LogFormat = (typeof LOG_FORMATS)[number];
export interface PriorityClass {
  name: string;
  weight: number;
}

/** The default length buckets, up to maxLength (always the last): four to each doubling of the length (docs/tuning.md). */
export function defaultBuckets(maxLength: number): number[] {
  const out: number[] = [];
  // Four a doubling from 16 (steps of a quarter of the power of two below), every 4 below:
  // 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, ...
  for (let b = 8; b < maxLength; b += Math.max(4, 2 ** Math.floor(Math.log2(b)) / 4)) out.push(b);
  out.push(maxLength);
  return out;
}

/** The most model instances --model-instances takes, and the most its auto mode picks. */
export const MAX_MODEL_INSTANCES = 64;
export const AUTO_INSTANCES_MAX = 4;

/** gRPC's port where --grpc-port is not given and --port is not 0 (a free port then). */
export const DEFAULT_GRPC_PORT = 8081;

export const OPTIONS = {
  host: server({ flag: '--host <host>', kind: 'string', default: '0.0.0.0', help: 'address to listen on' }),
  port: server({ flag: '--port <port>', kind: 'int', min: 0, default: 8080, help: 'port to listen on (0: any free port)' }),
  grpcPort: server<number>({
    flag: '--grpc-port <port>',
    kind: 'int',
    min: 0,
    defaultHelp: `${DEFAULT_GRPC_PORT}; a free port with --port 0`,
    help: "gRPC beside HTTP on every gateway thread: KServe v2's GRPCInferenceService and TEI's tei.v1 services, health and reflection (0: off): docs/grpc.md",
  }),
  modelsDir: engine<string>({ flag: '--models-dir <dir>', kind: 'string', defaultHelp: 'the package models/', help: 'model repository folder' }),
  models: engine<string[]>({
    flag: '--model <name>',
    kind: 'list',
    defaultHelp: 'all',
    help: 'which models to serve: a Hugging Face Hub id ORG/NAME[@REVISION] (fetched into the Hugging Face cache: HF_ENDPOINT, HF_TOKEN, HF_HUB_CACHE, HF_HUB_OFFLINE), a name under --models-dir, or a folder path (repeatable, or comma-separated): models/README.md',
  }),
  servedModelNames: engine<string[]>({
    flag: '--served-model-name <name>',
    kind: 'list',
    defaultHelp: "a Hub model's repository NAME, a folder's name",
    help: 'the name each --model is served by, in order (repeatable, or comma-separated); a Hub model answers to its ORG/NAME id as well',
  }),
  modelControlMode: server<ModelControlMode>({
    flag: '--model-control-mode <mode>',
    kind: 'string',
    choices: MODEL_CONTROL_MODES,
    default: 'none',
    help: "none: the model set is fixed at start; explicit: POST /v2/repository/models/{name}/load and /unload change it while serving (Triton's names): docs/model-repository.md",
  }),
  loadModel: server<string[]>({
    flag: '--load-model <name>',
    kind: 'list',
    defaultHelp: 'all',
    help: "with --model-control-mode explicit: the models loaded at start, by name (repeatable, or comma-separated; * for all): Triton's name for --model",
  }),
  lazyLoad: server({
    flag: '--lazy-load [bool]',
    kind: 'bool',
    default: false,
    help: 'with --model-control-mode explicit: a request naming a model of the repository that is not loaded loads it and waits for it within its deadline (concurrent first requests share one load)',
  }),
  maxLoadedModels: server<number>({
    flag: '--max-loaded-models <n>',
    kind: 'int',
    min: 1,
    help: 'explicit mode: most models loaded at once; a load past it first unloads the least recently used idle one (503 when every one is busy or pinned)',
  }),
  modelMemoryMb: server<number>({
    flag: '--model-memory-mb <mib>',
    kind: 'number',
    min: 0,
    exclusiveMin: true,
    help: "explicit mode: most memory the loaded models take together (each one's footprint measured at its load); a load past it unloads the least recently used idle ones first",
  }),
  modelIdleUnloadS: server<number>({
    flag: '--model-idle-unload-s <s>',
    kind: 'number',
    min: 0,
    exclusiveMin: true,
    help: 'explicit mode: a model that served nothing for this long is unloaded',
  }),
  pinModels: server<string[]>({
    flag: '--pin-model <name>',
    kind: 'list',
    help: 'explicit mode: never unload this model for the budget or for idling (repeatable, or comma-separated)',
  }),
  pooling: engine<Pooling>({
    flag: '--pooling <mode>',
    kind: 'string',
    choices: POOLINGS,
    defaultHelp: "the folder's",
    help: "pooling of every embedding model served, over its folder's (1_Pooling/config.json) and serve.json",
    perModel: true,
  }),
  dtype: engine<Dtype>({
    flag: '--dtype <dtype>',
    kind: 'string',
    choices: DTYPES,
    defaultHelp: 'auto',
    help: "which of a folder's graphs: fp32 (model.onnx), fp16 (model_fp16.onnx), int8 (model_int8.onnx or model_quantized.onnx), in the folder or onnx/ as transformers.js names them; auto: fp16 on CUDA where the folder has it, else fp32. A graph built from a checkpoint computes in fp32 or fp16 (auto: fp16 on CUDA). Rows are float32 whatever the graph computes in",
    perModel: true,
  }),
  weights: engine<WeightsSource>({
    flag: '--weights <source>',
    kind: 'string',
    choices: WEIGHTS_SOURCES,
    default: 'auto',
    help: "where a model's graph comes from: auto, the folder's ONNX graph, or where it has none a graph built from its checkpoint (model.safetensors, sharded safetensors, pytorch_model.bin; docs/checkpoints.md); graph, never built; checkpoint, built even beside a graph",
  }),
  graphCacheDir: engine<string>({
    flag: '--graph-cache-dir <dir>',
    kind: 'string',
    defaultHelp: '$XDG_CACHE_HOME/slabserve/graphs, or ~/.cache/slabserve/graphs',
    help: 'where graphs built from checkpoints are kept, one per checkpoint, config and head, so a restart opens them at once',
  }),
  defaultPromptName: engine<string>({
    flag: '--default-prompt-name <name>',
    kind: 'string',
    help: "prompt put before every text whose request names none, by its name in the model's config_sentence_transformers.json (every embedding model served)",
    perModel: true,
  }),
  defaultPrompt: engine<string>({
    flag: '--default-prompt <text>',
    kind: 'string',
    help: 'prompt text put before every text whose request names none (every embedding model served)',
    perModel: true,
  }),
  maxInputLength: engine<number>({
    flag: '--max-input-length <n>',
    kind: 'int',
    min: 1,
    defaultHelp: "the folder's",
    help: "longest input in tokens of every model served, over its folder's (sentence_bert_config.json) and serve.json; at most the model's positions",
    perModel: true,
  }),
  device: engine({ flag: '--device <device>', kind: 'string', default: 'auto', help: 'cpu, cuda, cuda:N, or auto (CUDA if its provider loads, else CPU, said in one log line)' }),
  processes: cluster<number>({
    flag: '--processes <n>',
    kind: 'int',
    min: 1,
    help: 'a cluster of N server processes on one port, supervised, one /metrics (each on --device; cpu when that is auto): docs/cluster.md',
  }),
  devices: cluster<string[]>({
    flag: '--devices <list>',
    kind: 'list',
    help: 'a cluster of one server process per device on one port, e.g. cuda:0,cuda:1: docs/cluster.md',
  }),
  gatewayThreads: server<number>({
    flag: '--gateway-threads <n>',
    kind: 'int',
    min: 1,
    defaultHelp: '1 on 2 cores or fewer, else half the cores',
    help: 'uWebSockets.js threads sharing the port',
  }),
  maxBatchSize: engine({ flag: '--max-batch-size <n>', kind: 'int', min: 1, default: 32, help: 'most requests in one batch', perModel: true }),
  maxBatchDelayMs: engine({
    flag: '--max-batch-delay-ms <ms>',
    kind: 'number',
    min: 0,
    default: 5,
    help: 'longest a request waits for a batch to fill while the device is busy',
    perModel: true,
  }),
  maxBatchTokens: engine({ flag: '--max-batch-tokens <n>', kind: 'int', min: 1, default: 16384, help: 'most padded tokens (batch size x bucket length) in one batch', perModel: true }),
  padTo: engine<PadTo>({
    flag: '--pad-to <mode>',
    kind: 'string',
    choices: PAD_TO,
    default: 'auto',
    help: "what a batch is padded to: 'bucket' (its bucket's length: fixed shapes, warmed up, for GPUs), 'longest' (its longest input: fewer padded tokens, for CPUs; with one bucket, a single FIFO queue padded to the longest) or 'auto' (longest on CPU, bucket on CUDA): docs/tuning.md",
    perModel: true,
  }),
  buckets: engine<number[]>({
    flag: '--buckets <list>',
    kind: 'intList',
    defaultHelp: `four to each doubling, ${defaultBuckets(80).join(',')},... up to the max length`,
    help: 'length buckets, e.g. 16,32,64,128 (at most 64); a batch holds one bucket',
    perModel: true,
  }),
  maxInflightBatches: engine({ flag: '--max-inflight-batches <n>', kind: 'int', min: 1, default: 1, help: 'batches handed to the device before the first ends (onnxruntime-node runs a session synchronously, so more do not overlap today)' }),
  slotsPerModel: engine({ flag: '--slots-per-model <n>', kind: 'int', min: 1, default: 1024, help: 'requests queued or running per model; beyond it, 429 at once' }),
  // 32 MiB: 128 inputs of 512 tokens of 128 floats, or 21 of bert-base's 512 x 768; the inference
  // thread's private copy doubles it.
  tokenOutputMb: engine({
    flag: '--token-output-mb <mib>',
    kind: 'number',
    min: 0,
    default: 32,
    help: "MiB per model of token vectors in flight (/embed_all): a page of its max length per input; beyond it, 429 at once; twice that in memory (the inference thread's private copy)",
  }),
  requestTimeoutMs: engine({
    flag: '--request-timeout-ms <ms>',
    kind: 'int',
    min: 1,
    default: 30_000,
    help: 'a request not run by then is answered 504 and never reaches the device',
  }),
  intraOpThreads: engine({
    flag: '--intra-op-threads <n>',
    kind: 'int',
    min: 0,
    default: 0,
    help: 'onnxruntime intra-op threads (0: one for a model of hidden size below 256, whose operators are too small to split, every core for a wider one; on CPU they spin while a run lasts and sleep between runs): docs/tuning.md',
  }),
  modelInstances: engine({
    flag: '--model-instances <n>',
    kind: 'int',
    min: 0,
    max: MAX_MODEL_INSTANCES,
    default: 0,
    help: `sessions of each model running batches side by side, each with its own copy of the weights (0: on CPU one per core up to ${AUTO_INSTANCES_MAX} for a model of hidden size below 256 with --intra-op-threads 0, else 1)`,
  }),
  idleSpinUs: engine({
    flag: '--idle-spin-us <us>',
    kind: 'int',
    min: 0,
    max: 1_000_000,
    default: 1000,
    help: 'microseconds the inference thread spins for the next request when it runs out of work, before it sleeps: a client sending one request after another finds it awake instead of waking it (0: sleep at once; it spins only after a batch, never at rest): docs/tuning.md',
  }),
  loneWaitUs: server({
    flag: '--lone-wait-us <us>',
    kind: 'int',
    min: 0,
    max: 100_000,
    default: 2000,
    help: 'longest a gateway thread holds itself for the answer to a request alone in the server, from a caller sending one request at a time: asleep until just before its batch should end, then awake, instead of being woken by it (0: never; not where a CPU run takes every core): docs/tuning.md',
  }),
  intraOpNice: engine({
    flag: '--intra-op-nice <n>',
    kind: 'int',
    min: 0,
    max: 19,
    default: 10,
    help: "nice value (0-19) of the intra-op threads on CPU, Linux: a gateway with a request to answer goes before a pool thread spinning through a run (0: the process's own)",
  }),
  maxClientBatchSize: server({
    flag: '--max-client-batch-size <n>',
    kind: 'int',
    min: 1,
    default: 1024,
    help: "most inputs in one request: a bound on its memory, not on the batcher (a client batch larger than a quarter of the slots runs part by part, interleaved with other clients' requests)",
  }),
  maxBodyBytes: server({ flag: '--max-body-bytes <n>', kind: 'int', min: 1, default: 2 * 1024 * 1024, help: 'largest request body; refused (413) before it is read' }),
  truncate: server({
    flag: '--truncate [bool]',
    kind: 'bool',
    default: false,
    help: 'cut inputs longer than the model accepts when a request does not say "truncate" (TEI\'s --auto-truncate; false: 413)',
  }),
  longInputs: server<LongInputs>({
    flag: '--long-inputs <mode>',
    kind: 'string',
    choices: LONG_INPUTS,
    defaultHelp: 'error (truncate with --truncate)',
    help: 'what happens to an input longer than the model takes when a request does not say ("long_inputs"): error, a 413; truncate, its tail is cut (--truncate); chunk, it runs as windows of the model\'s length, their rows combined (embeddings) or the best one\'s score kept (rerank): docs/long-inputs.md',
  }),
  maxInputTokens: server<number>({
    flag: '--max-input-tokens <n>',
    kind: 'int',
    min: 1,
    defaultHelp: "8 x the model's max length",
    help: 'most tokens a chunked input may have in all, special tokens included (a rerank pair: its query and document); past it, 413',
  }),
  chunkOverlapTokens: server({
    flag: '--chunk-overlap-tokens <n>',
    kind: 'int',
    min: 0,
    default: 0,
    help: "text tokens each window of a chunked input repeats of the window before it (at most half a window's)",
  }),
  openaiTokenIds: server<OpenAITokenIds>({
    flag: '--openai-token-ids <encoding>',
    kind: 'string',
    choices: ['cl100k_base', 'model'],
    default: 'cl100k_base',
    help: 'what integer inputs of /v1/embeddings are when a request does not say ("token_encoding"): OpenAI\'s tiktoken cl100k_base ids, decoded to their text (what LangChain sends), or the model\'s own ids',
  }),
  heartbeatTimeoutMs: engine({
    flag: '--heartbeat-timeout-ms <ms>',
    kind: 'int',
    min: 1,
    default: 30_000,
    help: 'readiness fails when the inference thread has not gone round its loop for this long',
  }),
  inferenceTimeoutMs: engine({
    flag: '--inference-timeout-ms <ms>',
    kind: 'int',
    min: 1,
    default: 30_000,
    help: 'a batch run longer than this (or a loop stalled past --heartbeat-timeout-ms) gets the inference thread replaced, its requests answered 503',
  }),
  drainTimeoutMs: server({ flag: '--drain-timeout-ms <ms>', kind: 'int', min: 0, default: 30_000, help: 'on SIGTERM, how long in-flight requests may take to finish' }),
  drainGraceMs: server({
    flag: '--drain-grace-ms <ms>',
    kind: 'int',
    min: 0,
    default: 500,
    help: 'on SIGTERM, how long idle keep-alive connections stay open after the last request, so one a client is sending on is answered, not cut',
  }),
  tokenizerThreads: server({
    flag: '--tokenizer-threads <n>',
    kind: 'int',
    min: 1,
    default: 1,
    help: 'most tokenizer pool threads per gateway: client batches past --inline-tokenize-chars are tokenized there (started when first needed, stopped after 5 idle minutes): docs/tokenizer.md',
  }),
  tokenizerQueue: server<number>({
    flag: '--tokenizer-queue <n>',
    kind: 'int',
    min: 1,
    defaultHelp: '256 per pool thread',
    help: 'requests waiting for the tokenizer pool per gateway; past it, 429 at once',
  }),
  inlineTokenizeChars: server({
    flag: '--inline-tokenize-chars <n>',
    kind: 'int',
    min: 0,
    default: 1024,
    help: 'client batches up to this many characters are tokenized on the gateway thread itself (ASCII text the fast path takes counts an eighth)',
  }),
  grpcThreads: server({
    flag: '--grpc-threads <n>',
    kind: 'int',
    min: 0,
    default: 0,
    help: 'gRPC on threads of its own, serving no HTTP (0: every gateway thread serves gRPC beside HTTP): docs/grpc.md',
  }),
  grpcStreamMaxInflight: server({
    flag: '--grpc-stream-max-inflight <n>',
    kind: 'int',
    min: 1,
    default: 256,
    help: 'gRPC: most messages of one stream answered at once; past it (or while its answers are not read) the stream is read no further',
  }),
  wsMaxInflight: server({ flag: '--ws-max-inflight <n>', kind: 'int', min: 1, default: 256, help: 'WebSocket: most requests in flight per socket (the highest credit)' }),
  wsMaxBufferedBytes: server({
    flag: '--ws-max-buffered-bytes <n>',
    kind: 'int',
    min: 1,
    default: 1024 * 1024,
    help: "WebSocket: unsent bytes above which a socket's requests are held back",
  }),
  wsMaxFrameBytes: server({
    flag: '--ws-max-frame-bytes <n>',
    kind: 'int',
    min: 1,
    default: 2 * 1024 * 1024,
    help: 'WebSocket: largest frame; a larger one closes the socket',
  }),
  wsIdleTimeoutSeconds: server({
    flag: '--ws-idle-timeout-s <s>',
    kind: 'int',
    min: 8,
    default: 120,
    help: 'WebSocket: idle seconds before a socket is closed (pings are sent meanwhile)',
  }),
  priorities: engine<PriorityClass[]>({
    flag: '--priority-weights <list>',
    kind: 'priorities',
    default: [
      { name: 'interactive', weight: 4 },
      { name: 'bulk', weight: 1 },
    ],
    help: 'priority classes (the x-priority header or the priority field picks one) and their fair shares; the first is the default',
  }),
  priorityAgeingMs: engine({
    flag: '--priority-ageing-ms <ms>',
    kind: 'int',
    min: 1,
    default: 2000,
    help: 'a request waiting this long puts its class first, so no class starves',
  }),
  sloP99Ms: engine<number>({
    flag: '--slo-p99-ms <ms>',
    kind: 'number',
    min: 0,
    exclusiveMin: true,
    defaultHelp: 'none: fixed --max-batch-delay-ms',
    help: 'latency target: the batch window adapts to keep P99 under it, and admission sheds what cannot meet it: docs/architecture.md',
  }),
  cacheMb: engine({
    flag: '--cache-mb <mib>',
    kind: 'number',
    min: 0,
    default: 64,
    defaultHelp: '64 (the in-process engine: 0)',
    help: 'MiB of finished rows kept in shared memory for every gateway thread: an input seen before is answered by the gateway itself, no slot or device, with the row computed the first time (x-cache: hit); 0: off: docs/cache.md',
  }),
  apiKeys: server<string[]>({
    flag: '--api-key <key>',
    kind: 'list',
    help: 'require this API key as "Authorization: Bearer <key>" (a constant-time check) on every route but health (/livez, /readyz, /health) and /metrics (unless --metrics-auth); repeatable or comma-separated; prefer the variable or --api-key-file (a flag shows in ps): docs/security.md',
  }),
  adminApiKeys: server<string[]>({
    flag: '--admin-api-key <key>',
    kind: 'list',
    help: "the model repository's routes (/v2/repository/...) need one of these keys instead of an --api-key; repeatable or comma-separated: docs/model-repository.md",
  }),
  apiKeyFile: server<string>({ flag: '--api-key-file <path>', kind: 'string', help: 'require one of the API keys in this file (one a line, # comments)' }),
  metricsAuth: server({ flag: '--metrics-auth [bool]', kind: 'bool', default: false, help: '/metrics needs an API key too' }),
  maxConnections: server({
    flag: '--max-connections <n>',
    kind: 'int',
    min: 1,
    default: 4096,
    help: 'most connections per gateway thread: open WebSockets plus HTTP connections with a request in progress; past it 503',
  }),
  maxUrlBytes: server({ flag: '--max-url-bytes <n>', kind: 'int', min: 16, default: 2048, help: 'longest URL (path and query); past it 414' }),
  maxHeaderBytes: server({
    flag: '--max-header-bytes <n>',
    kind: 'int',
    min: 64,
    // uWS reads at most 4 KiB of a head that arrives in pieces (it closes the connection past that),
    // up to ~128 KiB of one that arrives at once: 4 KiB makes both the same.
    default: 4096,
    help: 'largest request head (request line and headers); past it 431 (uWS closes a head over 4 KiB that arrives in pieces, whatever this says)',
  }),
  maxDiscardBytes: server({
    flag: '--max-discard-bytes <n>',
    kind: 'int',
    min: 0,
    default: 16 * 2 ** 20,
    help: 'a refusal decided before the body has arrived (413, 401, 429, ...) to a client that writes its whole body first reads and drops up to this many body bytes in all before it is answered, so that client reads it; a larger body: answered and closed at once (the client may see a reset): docs/security.md',
  }),
  discardTimeoutMs: server({
    flag: '--discard-timeout-ms <ms>',
    kind: 'int',
    min: 1,
    default: 10_000,
    help: 'how long such a refusal waits for the rest of the body before it is answered and the connection closed',
  }),
  logProbes: server({
    flag: '--log-probes [bool]',
    kind: 'bool',
    default: false,
    help: 'access lines for health probes (/livez, /readyz, /health, /v2/health/*) and /metrics scrapes too',
  }),
  otlpEndpoint: server<string>({
    flag: '--otlp-endpoint <url>',
    kind: 'string',
    defaultHelp: 'OTEL_EXPORTER_OTLP_ENDPOINT; off when none is set',
    help: "OpenTelemetry traces over OTLP/HTTP to this endpoint, e.g. http://localhost:4318: a span per request (its parent from traceparent) with tokenize and queue children, a span per batch linking every request it carried; OpenTelemetry's OTEL_EXPORTER_OTLP_*, OTEL_SERVICE_NAME and OTEL_TRACES_SAMPLER(_ARG) work too: docs/tracing.md",
  }),
  otlpServiceName: server<string>({
    flag: '--otlp-service-name <name>',
    kind: 'string',
    defaultHelp: 'OTEL_SERVICE_NAME, else slabserve',
    help: "the traces' service.name",
  }),
  logLevel: server<LogLevel>({
    flag: '--log-level <level>',
    kind: 'string',
    choices: LOG_LEVELS,
    default: 'info',
    help: 'least level logged (pino): events on stderr, one access line per request on stdout at info, x-request-id echoed',
  }),
  logFormat: server<LogFormat>({
    flag: '--log-format <format>',
    kind: 'string',
    choices: LOG_FORMATS,
    default: 'auto',
    help: 'auto: readable lines where the output is a terminal, JSON lines (pino) elsewhere (containers, files); json; pretty',
  }),
};

export type OptionName = keyof typeof OPTIONS;
/** The value an option takes. */
export type OptionValue<K extends OptionName> = (typeof OPTIONS)[K] extends Entry<infer T, Scope> ? T : never;
/** The options of a scope. */
export type NamesOf<S extends Scope> = { [K in OptionName]: (typeof OPTIONS)[K] extends { scope: S } ? K : never }[OptionName];
/** The options that have a default. */
export type DefaultedName = { [K in OptionName]: (typeof OPTIONS)[K] extends { default: unknown } ? K : never }[OptionName];
/** Some options by name, each optional (absent: its default). */
export type OptionValues<K extends OptionName> = { [N in K]?: OptionValue<N> | undefined };
/** Some options by name, those with a default present. */
export type ResolvedValues<K extends OptionName> = { [N in K & DefaultedName]: OptionValue<N> } & { [N in Exclude<K, DefaultedName>]?: OptionValue<N> | undefined };

/** The batching options, which a server or an engine takes together as `batching` (a model's serve.json may set them too). */
export const BATCHING_OPTIONS = ['maxBatchSize', 'maxBatchDelayMs', 'maxBatchTokens', 'padTo', 'buckets'] as const satisfies readonly OptionName[];
export type BatchingName = (typeof BATCHING_OPTIONS)[number];

/** Every default, by option name. */
export const DEFAULTS = Object.fromEntries(
  Object.entries(OPTIONS).flatMap(([name, spec]) => ('default' in spec ? [[name, spec.default]] : [])),
) as { readonly [K in DefaultedName]: OptionValue<K> };

/** `given` over the defaults of `names`: a value given as undefined takes the default too. */
export function withDefaults<K extends OptionName, G extends OptionValues<K>>(names: readonly K[], given: G): G & ResolvedValues<K> {
  const out: Record<string, unknown> = { ...given };
  for (const name of names) {
    const spec: OptionSpec<unknown> = OPTIONS[name];
    if (out[name] === undefined && 'default' in spec) out[name] = spec.default;
  }
  return out as G & ResolvedValues<K>;
}

/** Some options' values out of a larger set of them (what a thread is sent). */
export function pickOptions<K extends OptionName, V extends { [N in K]?: unknown }>(values: V, names: readonly K[]): Pick<V, K> {
  const out: Partial<V> = {};
  for (const name of names) if (values[name] !== undefined) out[name] = values[name];
  return out as Pick<V, K>;
}

/** The names of a scope's options, in the table's order. */
export function namesOf<S extends Scope>(...scopes: S[]): NamesOf<S>[] {
  return (Object.keys(OPTIONS) as OptionName[]).filter((n) => (scopes as Scope[]).includes(OPTIONS[n].scope)) as NamesOf<S>[];
}

/** What --help and the docs say of an option's default: its words where it is worked out at start, else its value; undefined: none. */
export function defaultText(spec: OptionSpec<unknown>): string | undefined {
  if (spec.defaultHelp !== undefined) return spec.defaultHelp;
  if (spec.default === undefined) return undefined;
  if (spec.kind === 'priorities') return (spec.default as PriorityClass[]).map((p) => `${p.name}=${p.weight}`).join(',');
  return String(spec.default);
}

/** The names of a scope's options that a server or an engine takes by name: all but the batching ones, which go together in `batching`. */
export function unbatchedNamesOf<S extends Scope>(...scopes: S[]): Exclude<NamesOf<S>, BatchingName>[] {
  return namesOf(...scopes).filter((n) => !(BATCHING_OPTIONS as readonly OptionName[]).includes(n)) as Exclude<NamesOf<S>, BatchingName>[];
}

/** The environment variable of an option: SLABSERVE_ and its flag's name, upper case. */
export function envOf(spec: OptionSpec<unknown>): string {
  return 'SLABSERVE_' + spec.flag.slice(2).split(' ')[0]!.replaceAll('-', '_').toUpperCase();
}
