#!/usr/bin/env node
/**
 * The slabserve command line. Every option is also an environment variable
 * (SLABSERVE_<NAME>), shown by --help.
 *
 *   slabserve serve --port 8080 --max-batch-size 32
 *   slabserve embed "where is my parcel?" "cancel my plan"
 *   slabserve classify --model tiny-intent "I want my money back"
 */
import { readFileSync } from 'node:fs';
import { Command, InvalidArgumentError, Option } from 'commander';
import { clusterRole, clusterWorker, runClusterPrimary } from './main/cluster/cluster.js';
import { createEngine, type Engine, type EngineOptions } from './main/engine.js';
import { DEFAULT_GRPC_PORT, defaultGatewayThreads, SERVER_DEFAULTS, startServer, type ServerConfig } from './main/server.js';
import { createLogger, LOG_FORMATS, LOG_LEVELS, logDestination } from './gateway/log.js';
import { apiKeyProblem } from './gateway/security.js';
import { InputTooLongError, SlabserveError, ValidationError } from './shared/errors.js';
import { VERSION } from './version.js';
import { collectStartupGarbage, turnOffMemoryReducer } from './shared/gc.js';
import { defaultBuckets, PAD_TO, type PadTo } from './gpu-worker/scheduler.js';
import { AUTO_INSTANCES_MAX, MAX_MODEL_INSTANCES } from './gpu-worker/intra-op-threads.js';
import { MAX_IDLE_SPIN_US } from './gpu-worker/inference-loop.js';
import { MAX_LONE_WAIT_US } from './core/lone-wait.js';
import { DTYPES, POOLINGS } from './shared/model-format/model-config.js';
import { MODEL_CONTROL_MODES } from './main/repository/repository.js';

/** An integer option parser with a clear message on bad values. */
function int(min: number, max = Infinity) {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min || n > max) {
      throw new InvalidArgumentError(`expected an integer ${max === Infinity ? `>= ${min}` : `from ${min} to ${max}`}, got "${value}"`);
    }
    return n;
  };
}

function nonNegative(value: string): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0) throw new InvalidArgumentError(`expected a number >= 0, got "${value}"`);
  return n;
}

function intList(value: string): number[] {
  const parts = value.split(',').map((p) => p.trim()).filter(Boolean);
  const ints = parts.map(Number);
  if (ints.length === 0 || ints.some((n) => !Number.isInteger(n) || n < 1)) {
    throw new InvalidArgumentError(`expected a comma-separated list of positive integers, got "${value}"`);
  }
  return ints;
}

/** "interactive=4,bulk=1" -> ordered classes with weights (the first is the default class). */
function priorityList(value: string): { name: string; weight: number }[] {
  const out = value.split(',').map((part) => {
    const [name, weight] = part.split('=').map((x) => x?.trim() ?? '');
    const w = Number(weight);
    if (!name || !/^[a-z][a-z0-9_-]*$/.test(name) || !(w > 0)) {
      throw new InvalidArgumentError(`expected name=weight pairs like interactive=4,bulk=1, got "${value}"`);
    }
    return { name, weight: w };
  });
  if (new Set(out.map((p) => p.name)).size !== out.length) throw new InvalidArgumentError(`priority class names must be distinct: "${value}"`);
  return out;
}

function positive(value: string): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new InvalidArgumentError(`expected a number > 0, got "${value}"`);
  return n;
}

/** true/false, yes/no, on/off, 1/0 (an option like --metrics-auth, whose variable may say "false"). */
function bool(value: string | boolean): boolean {
  if (typeof value === 'boolean') return value; // a bare flag: commander passes its preset through the parser
  const v = value.trim().toLowerCase();
  if (['true', 'yes', 'on', '1'].includes(v)) return true;
  if (['false', 'no', 'off', '0', ''].includes(v)) return false;
  throw new InvalidArgumentError(`expected true or false, got "${value}"`);
}

/**
 * The API keys of --api-key and --api-key-file (one key a line; blank lines
 * and lines starting with # are skipped). Never echoes a key in an error.
 */
function apiKeys(given: string[] | undefined, file: string | undefined): string[] {
  const keys = [...(given ?? [])];
  if (file !== undefined) {
    let text: string;
    try {
      text = readFileSync(file, 'utf8');
    } catch (err) {
      throw new ValidationError(`--api-key-file ${file}: cannot read it (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
    }
    const before = keys.length;
    for (const line of text.split(/\r?\n/)) {
      const k = line.trim();
      if (k !== '' && !k.startsWith('#')) keys.push(k);
    }
    if (keys.length === before) throw new ValidationError(`--api-key-file ${file}: no key in it (one key a line)`);
  }
  keys.forEach((k, i) => {
    const problem = apiKeyProblem(k);
    if (problem) throw new ValidationError(`API key ${i + 1} (--api-key / --api-key-file): ${problem}`);
  });
  return [...new Set(keys)];
}

function collect(value: string, previous: string[] = []): string[] {
  return [...previous, ...value.split(',').map((v) => v.trim()).filter(Boolean)];
}

/** A flag with its SLABSERVE_* environment variable. */
function flag(flags: string, description: string, env: string, parse?: (v: string, prev?: never) => unknown, defaultValue?: unknown): Option {
  const o = new Option(flags, description).env(`SLABSERVE_${env}`);
  if (parse) o.argParser(parse as (v: string, prev: unknown) => unknown);
  if (defaultValue !== undefined) o.default(defaultValue);
  return o;
}

interface CommonFlags {
  modelsDir?: string;
  model?: string;
  device: string;
  truncate: boolean;
}

function commonOptions(cmd: Command): Command {
  return cmd
    .addOption(new Option('--models-dir <dir>', 'model repository folder (default: the package models/)').env('SLABSERVE_MODELS_DIR'))
    .addOption(new Option('--model <name>', 'model to use (default: the first of the right task)').env('SLABSERVE_MODEL'))
    .addOption(new Option('--device <device>', 'auto, cpu, cuda or cuda:N').default('auto').env('SLABSERVE_DEVICE'))
    .addOption(new Option('--truncate', 'cut inputs longer than the model accepts').default(false).env('SLABSERVE_TRUNCATE'));
}

async function withEngine(flags: CommonFlags, fn: (e: Engine) => Promise<unknown>): Promise<void> {
  const opts: EngineOptions = { device: flags.device, log: () => {} };
  if (flags.modelsDir) opts.modelsDir = flags.modelsDir;
  if (flags.model) opts.models = [flags.model];
  const engine = await createEngine(opts);
  try {
    const out = await fn(engine);
    process.stdout.write(JSON.stringify(out) + '\n');
  } finally {
    await engine.close();
  }
}

const program = new Command('slabserve').description('Dynamic-batching inference for BERT-class models').version(VERSION).showHelpAfterError();

/**
 * What `serve`'s flags parse to: ServerConfig's own fields under their own
 * names, plus the flags that map onto it differently (the batching knobs, the
 * model list, the priority classes, the idle timeout in seconds).
 */
type ServeFlags = Omit<ServerConfig, 'models' | 'batching' | 'priorities' | 'wsIdleTimeoutSeconds' | 'log'> & {
  model?: string[];
  maxBatchSize?: number;
  maxBatchDelayMs?: number;
  maxBatchTokens?: number;
  buckets?: number[];
  padTo?: PadTo;
  priorityWeights: ServerConfig['priorities'];
  wsIdleTimeoutS: number;
  processes?: number;
  devices?: string[];
  apiKey?: string[];
  apiKeyFile?: string;
  adminApiKey?: string[];
  pinModel?: string[];
  loadModel?: string[];
};

/** The models to load at start: --model's, or in explicit mode --load-model's (Triton's name; `*`: all); undefined: all. */
function modelsAtStart(model: string[] | undefined, loadModel: string[] | undefined, mode: string | undefined): string[] | undefined {
  if (loadModel === undefined) return model;
  if (mode !== 'explicit') throw new ValidationError('--load-model names the models loaded at start with --model-control-mode explicit; without it, use --model');
  if (model !== undefined) throw new ValidationError('--model and --load-model both name the models loaded at start: give one');
  return loadModel.includes('*') ? undefined : loadModel;
}

const D = SERVER_DEFAULTS;
program
  .command('serve')
  .description('serve the model repository over HTTP')
  .addOption(flag('--host <host>', 'address to listen on', 'HOST', undefined, D.host))
  .addOption(flag('--port <port>', 'port to listen on (0: any free port)', 'PORT', int(0), D.port))
  .addOption(flag('--grpc-port <port>', `gRPC port, served beside HTTP and WebSocket by every gateway thread (default ${DEFAULT_GRPC_PORT}; a free port with --port 0; 0: no gRPC): docs/grpc.md`, 'GRPC_PORT', int(0)))
  .addOption(flag('--models-dir <dir>', 'model repository folder (default: the package models/)', 'MODELS_DIR'))
  .addOption(flag('--model <name>', 'serve only this model: a name under --models-dir or a folder path (repeatable, or comma-separated; default: all)', 'MODEL', collect))
  .addOption(flag('--model-control-mode <mode>', "none: the model set is fixed at start; explicit: POST /v2/repository/models/{name}/load and /unload change it while serving (Triton's names): docs/model-repository.md", 'MODEL_CONTROL_MODE', undefined, D.modelControlMode).choices(MODEL_CONTROL_MODES as unknown as string[]))
  .addOption(flag('--load-model <name>', "with --model-control-mode explicit: the models loaded at start, by name (repeatable, or comma-separated; * for all; default all): Triton's name for --model", 'LOAD_MODEL', collect))
  .addOption(flag('--lazy-load [bool]', 'with --model-control-mode explicit: a request naming a model of the repository that is not loaded loads it and waits for it within its deadline (concurrent first requests share one load)', 'LAZY_LOAD', bool, false).preset(true))
  .addOption(flag('--max-loaded-models <n>', 'explicit mode: most models loaded at once; a load past it first unloads the least recently used idle one (503 when every one is busy or pinned)', 'MAX_LOADED_MODELS', int(1)))
  .addOption(flag('--model-memory-mb <mib>', "explicit mode: most memory the loaded models take together (each one's footprint measured at its load); a load past it unloads the least recently used idle ones first", 'MODEL_MEMORY_MB', positive))
  .addOption(flag('--model-idle-unload-s <s>', 'explicit mode: a model that served nothing for this long is unloaded', 'MODEL_IDLE_UNLOAD_S', positive))
  .addOption(flag('--pin-model <name>', 'explicit mode: never unload this model for the budget or for idling (repeatable, or comma-separated)', 'PIN_MODEL', collect))
  .addOption(flag('--pooling <mode>', "pooling of every embedding model served, over its folder's (1_Pooling/config.json) and serve.json", 'POOLING').choices(POOLINGS as unknown as string[]))
  .addOption(flag('--dtype <dtype>', "which of a model folder's graphs: fp32 (model.onnx), fp16 (model_fp16.onnx), int8 (model_int8.onnx or model_quantized.onnx), auto (fp16 on CUDA where the folder has it, else fp32)", 'DTYPE').choices(DTYPES as unknown as string[]))
  .addOption(flag('--default-prompt-name <name>', "prompt put before every text whose request names none, by its name in the model's config_sentence_transformers.json (every embedding model served)", 'DEFAULT_PROMPT_NAME'))
  .addOption(flag('--default-prompt <text>', 'prompt text put before every text whose request names none (every embedding model served)', 'DEFAULT_PROMPT'))
  .addOption(flag('--max-input-length <n>', "longest input in tokens of every model served, over its folder's (sentence_bert_config.json) and serve.json; at most the model's positions", 'MAX_INPUT_LENGTH', int(1)))
  .addOption(flag('--device <device>', 'auto, cpu, cuda or cuda:N', 'DEVICE', undefined, D.device))
  .addOption(flag('--processes <n>', 'run a cluster of N server processes on one port, restarted if they exit (each on --device; cpu when that is auto): docs/cluster.md', 'PROCESSES', int(1)))
  .addOption(flag('--devices <list>', 'run a cluster of one server process per device on one port, e.g. cuda:0,cuda:1: docs/cluster.md', 'DEVICES', collect))
  .addOption(flag('--gateway-threads <n>', 'HTTP gateway threads', 'GATEWAY_THREADS', int(1)).default(defaultGatewayThreads(), `1 on 2 cores or fewer, else half the cores: ${defaultGatewayThreads()} here`))
  .addOption(flag('--max-batch-size <n>', 'most requests in one batch (default 32)', 'MAX_BATCH_SIZE', int(1)))
  .addOption(flag('--max-batch-delay-ms <ms>', 'longest a request waits for a batch to fill while the device is busy (default 5)', 'MAX_BATCH_DELAY_MS', nonNegative))
  .addOption(flag('--max-batch-tokens <n>', 'most padded tokens in one batch (default 16384)', 'MAX_BATCH_TOKENS', int(1)))
  .addOption(flag('--pad-to <mode>', "what a batch is padded to: 'bucket' (its bucket's length: fixed shapes, warmed up, for GPUs), 'longest' (its longest input: fewer padded tokens, for CPUs; with one bucket, a single FIFO queue padded to the longest) or 'auto' (default: longest on CPU, bucket on CUDA)", 'PAD_TO').choices(PAD_TO as string[]))
  .addOption(flag('--buckets <list>', `padded lengths, e.g. 16,32,64,128 (default: four to each doubling, ${defaultBuckets(80).join(',')},... up to the max length)`, 'BUCKETS', intList))
  .addOption(flag('--max-inflight-batches <n>', 'batches handed to the device before the first ends', 'MAX_INFLIGHT_BATCHES', int(1), D.maxInflightBatches))
  .addOption(flag('--slots-per-model <n>', 'requests queued or running per model; beyond it, 429 at once', 'SLOTS_PER_MODEL', int(1), D.slotsPerModel))
  .addOption(flag('--token-output-mb <mib>', 'MiB per model of token vectors in flight (/embed_all), a page per input; beyond it, 429 at once', 'TOKEN_OUTPUT_MB', nonNegative, D.tokenOutputMb))
  .addOption(flag('--request-timeout-ms <ms>', 'a request not run by then is answered 504 and never runs', 'REQUEST_TIMEOUT_MS', int(1), D.requestTimeoutMs))
  .addOption(flag('--intra-op-threads <n>', 'onnxruntime intra-op threads (0: one for a model of hidden size below 256, every core for a wider one; on CPU they spin while a run lasts and sleep between runs)', 'INTRA_OP_THREADS', int(0), D.intraOpThreads))
  .addOption(flag('--model-instances <n>', `sessions of each model running batches side by side, each with its own copy of the weights (0: on CPU one per core up to ${AUTO_INSTANCES_MAX} for a model of hidden size below 256 with --intra-op-threads 0, else 1)`, 'MODEL_INSTANCES', int(0, MAX_MODEL_INSTANCES), D.modelInstances))
  .addOption(flag('--idle-spin-us <us>', `microseconds the inference thread spins for the next request when it runs out of work, before it sleeps: a client sending one request after another finds it awake (0: sleep at once; at most ${MAX_IDLE_SPIN_US})`, 'IDLE_SPIN_US', int(0, MAX_IDLE_SPIN_US), D.idleSpinUs))
  .addOption(flag('--lone-wait-us <us>', `longest a gateway thread holds itself for the answer to a request alone in the server, asleep until just before its batch should end and then awake, instead of waking for it (0: never; at most ${MAX_LONE_WAIT_US}; only where a run leaves a core free)`, 'LONE_WAIT_US', int(0, MAX_LONE_WAIT_US), D.loneWaitUs))
  .addOption(flag('--intra-op-nice <n>', 'nice value (0-19) of the intra-op threads on CPU, so that a gateway with a request to answer goes first (0: the process\'s own)', 'INTRA_OP_NICE', int(0, 19), D.intraOpNice))
  .addOption(flag('--max-client-batch-size <n>', 'most inputs in one request (larger client batches run part by part)', 'MAX_CLIENT_BATCH_SIZE', int(1), D.maxClientBatchSize))
  .addOption(flag('--max-body-bytes <n>', 'largest request body accepted', 'MAX_BODY_BYTES', int(1), D.maxBodyBytes))
  .addOption(flag('--truncate [bool]', 'cut inputs longer than the model accepts when a request does not say "truncate" (TEI\'s --auto-truncate; default: 413)', 'TRUNCATE', bool, false).preset(true))
  .addOption(flag('--heartbeat-timeout-ms <ms>', 'readiness fails when the inference thread has not gone round its loop for this long', 'HEARTBEAT_TIMEOUT_MS', int(1), D.heartbeatTimeoutMs))
  .addOption(flag('--inference-timeout-ms <ms>', 'a batch run longer than this (or a loop stalled past --heartbeat-timeout-ms) gets the inference thread replaced, its requests answered 503', 'INFERENCE_TIMEOUT_MS', int(1), D.inferenceTimeoutMs))
  .addOption(flag('--drain-timeout-ms <ms>', 'on SIGTERM, how long in-flight requests may take to finish', 'DRAIN_TIMEOUT_MS', int(0), D.drainTimeoutMs))
  .addOption(flag('--drain-grace-ms <ms>', 'on SIGTERM, how long idle keep-alive connections stay open after the last request, so one a client is sending on is answered, not cut', 'DRAIN_GRACE_MS', int(0), D.drainGraceMs))
  .addOption(flag('--tokenizer-threads <n>', 'most tokenizer pool threads per gateway, for large client batches (started when needed)', 'TOKENIZER_THREADS', int(1), D.tokenizerThreads))
  .addOption(flag('--tokenizer-queue <n>', 'requests waiting for the tokenizer pool per gateway; past it, 429 at once (default: 256 per pool thread)', 'TOKENIZER_QUEUE', int(1)))
  .addOption(flag('--inline-tokenize-chars <n>', 'client batches up to this many characters are tokenized on the gateway thread itself (ASCII text the fast path takes counts an eighth)', 'INLINE_TOKENIZE_CHARS', int(0), D.inlineTokenizeChars))
  .addOption(flag('--grpc-threads <n>', 'gRPC on threads of its own, serving no HTTP (0: every gateway thread serves gRPC beside HTTP): docs/grpc.md', 'GRPC_THREADS', int(0), D.grpcThreads))
  .addOption(flag('--grpc-stream-max-inflight <n>', 'gRPC: most messages of one stream answered at once; past it the stream is read no further until answers go out', 'GRPC_STREAM_MAX_INFLIGHT', int(1), D.grpcStreamMaxInflight))
  .addOption(flag('--ws-max-inflight <n>', 'WebSocket: most requests in flight per socket (the highest credit)', 'WS_MAX_INFLIGHT', int(1), D.wsMaxInflight))
  .addOption(flag('--ws-max-buffered-bytes <n>', "WebSocket: unsent bytes above which a socket's requests are held back", 'WS_MAX_BUFFERED_BYTES', int(1), D.wsMaxBufferedBytes))
  .addOption(flag('--ws-max-frame-bytes <n>', 'WebSocket: largest frame; a larger one closes the socket', 'WS_MAX_FRAME_BYTES', int(1), D.wsMaxFrameBytes))
  .addOption(flag('--ws-idle-timeout-s <s>', 'WebSocket: idle seconds before a socket is closed (pings are sent meanwhile)', 'WS_IDLE_TIMEOUT_S', int(8), D.wsIdleTimeoutSeconds))
  .addOption(
    flag('--priority-weights <list>', 'priority classes and their fair shares, the first is the default (x-priority / "priority" picks one)', 'PRIORITY_WEIGHTS', priorityList, D.priorities.map((p) => ({ ...p }))),
  )
  .addOption(flag('--priority-ageing-ms <ms>', 'a request waiting this long puts its class first, so no class starves', 'PRIORITY_AGEING_MS', int(1), D.priorityAgeingMs))
  .addOption(flag('--slo-p99-ms <ms>', 'latency target: the batch window adapts to keep P99 under it, and admission sheds what cannot meet it (default: fixed --max-batch-delay-ms)', 'SLO_P99_MS', positive))
  .addOption(flag('--cache-mb <mib>', 'MiB of finished rows kept in shared memory, answered again by the gateway without a slot or the device (0: off): docs/cache.md', 'CACHE_MB', nonNegative, D.cacheMb))
  .addOption(flag('--api-key <key>', 'require this API key as "Authorization: Bearer <key>" on every route but health (and /metrics); repeatable or comma-separated; prefer the variable or --api-key-file (a flag shows in ps): docs/security.md', 'API_KEY', collect))
  .addOption(flag('--admin-api-key <key>', "the model repository's routes (/v2/repository/...) need one of these keys instead of an --api-key; repeatable or comma-separated: docs/model-repository.md", 'ADMIN_API_KEY', collect))
  .addOption(flag('--api-key-file <path>', 'require one of the API keys in this file (one a line, # comments)', 'API_KEY_FILE'))
  .addOption(flag('--metrics-auth [bool]', '/metrics needs an API key too', 'METRICS_AUTH', bool, D.metricsAuth).preset(true))
  .addOption(flag('--max-connections <n>', 'most connections per gateway thread: open WebSockets plus HTTP connections with a request in progress; past it 503', 'MAX_CONNECTIONS', int(1), D.maxConnections))
  .addOption(flag('--max-url-bytes <n>', 'longest URL (path and query); past it 414', 'MAX_URL_BYTES', int(16), D.maxUrlBytes))
  .addOption(flag('--max-header-bytes <n>', 'largest request head (request line and headers); past it 431 (uWS closes a head over 4 KiB that arrives in pieces, whatever this says)', 'MAX_HEADER_BYTES', int(64), D.maxHeaderBytes))
  .addOption(flag('--max-discard-bytes <n>', 'a refusal decided before the body has arrived (413, 401, 429, ...) reads and drops up to this many body bytes in all before it is answered, so a client that writes its whole body first reads it; a larger body: answered and closed at once', 'MAX_DISCARD_BYTES', int(0), D.maxDiscardBytes))
  .addOption(flag('--discard-timeout-ms <ms>', 'how long such a refusal waits for the rest of the body before it is answered and the connection closed', 'DISCARD_TIMEOUT_MS', int(1), D.discardTimeoutMs))
  .addOption(flag('--log-probes [bool]', 'access lines for health probes (/livez, /readyz, /health, /v2/health/*) and /metrics scrapes too', 'LOG_PROBES', bool, false).preset(true))
  .addOption(flag('--otlp-endpoint <url>', 'OpenTelemetry traces to this OTLP/HTTP endpoint, e.g. http://localhost:4318 (also OTEL_EXPORTER_OTLP_ENDPOINT; off when none is set: docs/tracing.md)', 'OTLP_ENDPOINT'))
  .addOption(flag('--otlp-service-name <name>', "the traces' service.name (also OTEL_SERVICE_NAME; default slabserve)", 'OTLP_SERVICE_NAME'))
  .addOption(flag('--log-level <level>', 'least level logged (events on stderr, an access line per request on stdout at info)', 'LOG_LEVEL', undefined, D.logLevel).choices(LOG_LEVELS))
  .addOption(flag('--log-format <format>', 'auto: readable lines where the output is a terminal, JSON lines elsewhere (containers, files); json; pretty', 'LOG_FORMAT', undefined, D.logFormat).choices(LOG_FORMATS))
  .action(async (f: ServeFlags, cmd: Command) => {
    const { model, maxBatchSize, maxBatchDelayMs, maxBatchTokens, buckets, padTo, priorityWeights, wsIdleTimeoutS, processes, devices, apiKey, apiKeyFile, adminApiKey, pinModel, loadModel, ...same } = f;
    const batching: ServerConfig['batching'] = {};
    if (maxBatchSize !== undefined) batching.maxBatchSize = maxBatchSize;
    if (maxBatchDelayMs !== undefined) batching.maxBatchDelayMs = maxBatchDelayMs;
    if (maxBatchTokens !== undefined) batching.maxBatchTokens = maxBatchTokens;
    if (buckets !== undefined) batching.buckets = buckets;
    if (padTo !== undefined) batching.padTo = padTo;
    // Events on stderr (startServer's lines are text, wrapped here; a gateway's are JSON already),
    // access lines on stdout straight from the gateway threads (accessLogFd); each JSON, or made
    // readable as --log-format says.
    const stderr = logDestination(2, same.logFormat ?? D.logFormat);
    const events = createLogger(same.logLevel ?? D.logLevel, 'main', { stream: stderr });
    const log = (line: string) => (line.charCodeAt(0) === 123 ? stderr.write(line + '\n') : events.info(line));
    const keys = apiKeys(apiKey, apiKeyFile);
    if ([...keys, ...(adminApiKey ?? [])].some((k) => k.length < 16)) events.warn('an API key shorter than 16 characters can be guessed: use long random keys (openssl rand -hex 32)');
    const startModels = modelsAtStart(model, loadModel, same.modelControlMode);
    const config: ServerConfig = {
      ...same,
      ...(startModels ? { models: startModels } : {}),
      batching,
      priorities: priorityWeights,
      wsIdleTimeoutSeconds: wsIdleTimeoutS,
      apiKeys: keys,
      ...(adminApiKey ? { adminApiKeys: adminApiKey } : {}),
      ...(pinModel ? { pinModels: pinModel } : {}),
      accessLogFd: 1,
      log,
    };
    // A cluster (--processes / --devices): the primary supervises; each worker is this same command.
    const given = (name: string) => !['default', undefined].includes(cmd.getOptionValueSource(name));
    const clusterOptions = { processes, devices, explicit: { device: given('device'), gatewayThreads: given('gatewayThreads'), intraOpThreads: given('intraOpThreads') } };
    const role = clusterRole(clusterOptions);
    if (role === 'primary') return runClusterPrimary(config, clusterOptions);
    const stop = new AbortController();
    const worker = role === 'worker' ? clusterWorker(log, stop) : null;
    // The handlers go first: a gateway can answer /readyz 200 before the last gateway has started
    // and startServer has returned, and a SIGTERM then must drain, not kill the process.
    turnOffMemoryReducer(); // every thread collects its start-up garbage once ready instead (src/shared/gc.ts)
    const starting = startServer({ ...config, ...worker?.overrides, signal: stop.signal });
    let signals = 0;
    const onSignal = (sig: string) => {
      signals++;
      if (signals > 1) {
        log(`slabserve: ${sig} again, exiting now`);
        // Not process.exit: it joins the threads, and a gateway still holding sockets then aborts the
        // process (SIGABRT, a native stack). End by the signal itself: status 128 + its number.
        process.removeAllListeners(sig);
        process.kill(process.pid, sig);
        return;
      }
      // The drain begins before it is announced, even mid-start (a gateway may already serve while the
      // next starts): a client that reads the line and then asks meets it, a 503 closing its connection.
      // The rest of the drain runs once started (a start that fails exits by itself below).
      stop.abort();
      const closing = starting.then((server) => server.close());
      log(`slabserve: ${sig}: draining (up to ${f.drainTimeoutMs} ms), send again to exit at once`);
      void closing.then(() => process.exit(0), () => {});
    };
    process.on('SIGTERM', () => onSignal('SIGTERM'));
    process.on('SIGINT', () => onSignal('SIGINT'));
    const server = await starting;
    worker?.started(server);
    try {
      await server.ready;
      collectStartupGarbage(); // this thread's; the others collect theirs when ready (src/shared/gc.ts)
    } catch (err) {
      await server.close();
      throw err;
    }
  });

commonOptions(program.command('embed').description('print the embedding of each text as JSON').argument('<text...>')).action(
  (texts: string[], flags: CommonFlags) =>
    withEngine(flags, async (e) => (await e.embed(texts, { truncate: flags.truncate, ...(flags.model ? { model: flags.model } : {}) })).map((v) => Array.from(v))),
);

commonOptions(program.command('classify').description('print the top label and score of each text as JSON').argument('<text...>')).action(
  (texts: string[], flags: CommonFlags) =>
    withEngine(flags, async (e) =>
      (await e.classify(texts, { truncate: flags.truncate, ...(flags.model ? { model: flags.model } : {}) })).map((c) => ({ label: c.label, score: c.score })),
    ),
);

program.parseAsync().catch((err: unknown) => {
  const e = err as Error;
  // The API's advice names its body field; on the command line it is a flag.
  const message = e instanceof InputTooLongError ? `input is ${e.length} tokens long, the model accepts at most ${e.maxLength}; pass --truncate to cut it` : e.message;
  process.stderr.write(`slabserve: ${e instanceof SlabserveError ? `${e.code}: ` : ''}${message}\n`);
  process.exitCode = 1;
});
