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
import { defaultGatewayThreads, startServer, type ServerConfig } from './main/server.js';
import { createLogger, logDestination } from './gateway/log.js';
import { apiKeyProblem } from './gateway/security.js';
import { InputTooLongError, SlabserveError, ValidationError } from './shared/errors.js';
import { DTYPES, WEIGHTS_SOURCES, type Dtype, type WeightsSource } from './shared/model-format/model-config.js';
import { VERSION } from './version.js';
import { prefetchModels } from './main/hub/prefetch.js';
import { modelOverrides } from './main/plan-models.js';
import { BATCHING_OPTIONS, defaultText, DEFAULTS, envOf, OPTIONS, type OptionName, type OptionSpec, type PriorityClass } from './shared/options.js';
import { collectStartupGarbage, turnOffMemoryReducer } from './shared/gc.js';

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

/** How each kind of value is read from its flag or variable. */
function parserOf(spec: OptionSpec<unknown>): ((v: string, prev?: never) => unknown) | undefined {
  switch (spec.kind) {
    case 'int':
      return int(spec.min ?? -Infinity, spec.max);
    case 'number':
      return spec.exclusiveMin ? positive : nonNegative;
    case 'bool':
      return bool;
    case 'list':
      return collect;
    case 'intList':
      return intList;
    case 'priorities':
      return priorityList;
    case 'string':
      return undefined;
  }
}

/** An option of the table (src/shared/options.ts) as commander's: its flag, variable, parser, choices and default. */
function commanderOption(spec: OptionSpec<unknown>): Option {
  // A default a model folder may override is applied when the models are planned, not here.
  const applied = spec.default !== undefined && !spec.perModel;
  const said = defaultText(spec);
  const help = said !== undefined && !applied ? `${spec.help} (default: ${said})` : spec.help;
  const o = new Option(spec.flag, help).env(envOf(spec));
  const parse = parserOf(spec);
  if (parse) o.argParser(parse as (v: string, prev: unknown) => unknown);
  if (spec.choices) o.choices(spec.choices as string[]);
  if (applied) o.default(spec.kind === 'priorities' ? (spec.default as PriorityClass[]).map((p) => ({ ...p })) : spec.default, said);
  if (spec.kind === 'bool') o.preset(true);
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
    .addOption(new Option('--models-dir <dir>', `${OPTIONS.modelsDir.help} (default: ${OPTIONS.modelsDir.defaultHelp})`).env(envOf(OPTIONS.modelsDir)))
    .addOption(new Option('--model <name>', 'model to use (default: the first of the right task)').env(envOf(OPTIONS.models)))
    .addOption(new Option('--device <device>', OPTIONS.device.help).default(DEFAULTS.device).env(envOf(OPTIONS.device)))
    .addOption(new Option('--truncate', 'cut inputs longer than the model accepts').default(false).env(envOf(OPTIONS.truncate)));
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

/** What `serve`'s flags parse to, by the table's names (src/shared/options.ts). */
type ServeFlags = { [K in OptionName]?: unknown } & Pick<ServerConfig, 'drainTimeoutMs' | 'logFormat' | 'logLevel' | 'modelControlMode'> & {
  models?: string[];
  loadModel?: string[];
  processes?: number;
  devices?: string[];
  apiKeys?: string[];
  apiKeyFile?: string;
  adminApiKeys?: string[];
};

/** The models to load at start: --model's, or in explicit mode --load-model's (Triton's name; `*`: all); undefined: all. */
function modelsAtStart(model: string[] | undefined, loadModel: string[] | undefined, mode: string | undefined): string[] | undefined {
  if (loadModel === undefined) return model;
  if (mode !== 'explicit') throw new ValidationError('--load-model names the models loaded at start with --model-control-mode explicit; without it, use --model');
  if (model !== undefined) throw new ValidationError('--model and --load-model both name the models loaded at start: give one');
  return loadModel.includes('*') ? undefined : loadModel;
}

const serve = program.command('serve').description('serve the model repository over HTTP');
/** The table's name of each of serve's options, by commander's attribute name (--model is `models`). */
const nameOfAttribute = new Map<string, OptionName>();
for (const [name, spec] of Object.entries(OPTIONS) as [OptionName, OptionSpec<unknown>][]) {
  const option = commanderOption(spec);
  if (name === 'gatewayThreads') option.default(defaultGatewayThreads(), `${spec.defaultHelp}: ${defaultGatewayThreads()} here`);
  nameOfAttribute.set(option.attributeName(), name);
  serve.addOption(option);
}

/** Commander's values under the table's names. */
function serveFlags(parsed: Record<string, unknown>): ServeFlags {
  return Object.fromEntries(Object.entries(parsed).map(([attr, v]) => [nameOfAttribute.get(attr) ?? attr, v])) as ServeFlags;
}

serve
  .action(async (parsed: Record<string, unknown>, cmd: Command) => {
    const f = serveFlags(parsed);
    const { models, processes, devices, apiKeys: apiKey, apiKeyFile, adminApiKeys: adminApiKey, loadModel, ...rest } = f;
    const batching: ServerConfig['batching'] = {};
    const same: Record<string, unknown> = {};
    for (const [name, value] of Object.entries(rest)) {
      if (value === undefined) continue;
      if ((BATCHING_OPTIONS as readonly string[]).includes(name)) (batching as Record<string, unknown>)[name] = value;
      else same[name] = value;
    }
    // Events on stderr (startServer's lines are text, wrapped here; a gateway's are JSON already),
    // access lines on stdout straight from the gateway threads (accessLogFd); each JSON, or made
    // readable as --log-format says.
    const stderr = logDestination(2, f.logFormat ?? DEFAULTS.logFormat);
    const events = createLogger(f.logLevel ?? DEFAULTS.logLevel, 'main', { stream: stderr });
    const log = (line: string) => (line.charCodeAt(0) === 123 ? stderr.write(line + '\n') : events.info(line));
    const keys = apiKeys(apiKey, apiKeyFile);
    if ([...keys, ...(adminApiKey ?? [])].some((k) => k.length < 16)) events.warn('an API key shorter than 16 characters can be guessed: use long random keys (openssl rand -hex 32)');
    const startModels = modelsAtStart(models, loadModel, f.modelControlMode);
    const config: ServerConfig = {
      ...(same as Partial<ServerConfig>),
      ...(startModels ? { models: startModels } : {}),
      batching,
      apiKeys: keys,
      ...(adminApiKey ? { adminApiKeys: adminApiKey } : {}),
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

program
  .command('download')
  .description('fetch models by Hub id into the Hugging Face cache (HF_HUB_CACHE), or as plain folders with --models-dir, and exit: for image builds and machines that serve offline')
  .argument('<id...>', 'ORG/NAME[@REVISION] (a branch, tag or commit; default main)')
  .addOption(new Option('--models-dir <dir>', 'write plain folders DIR/NAME instead of the cache (serve them with serve --models-dir DIR)'))
  .addOption(new Option('--dtype <dtype>', `${OPTIONS.dtype.help} (default: ${defaultText(OPTIONS.dtype)})`).choices([...DTYPES]).env(envOf(OPTIONS.dtype)))
  .addOption(new Option('--device <device>', `the device it will serve on: auto fetches fp16 for CUDA (default: ${DEFAULTS.device})`).default(DEFAULTS.device).env(envOf(OPTIONS.device)))
  .addOption(new Option('--weights <source>', `${OPTIONS.weights.help} (default: ${defaultText(OPTIONS.weights)})`).choices([...WEIGHTS_SOURCES]).env(envOf(OPTIONS.weights)))
  .action(async (ids: string[], flags: { modelsDir?: string; dtype?: Dtype; device: string; weights?: WeightsSource }) => {
    const log = (line: string) => process.stderr.write(line + '\n');
    await prefetchModels(ids, { overrides: modelOverrides({ dtype: flags.dtype, device: flags.device, weights: flags.weights }), modelsDir: flags.modelsDir, log });
  });

program.parseAsync().catch((err: unknown) => {
  const e = err as Error;
  // The API's advice names its body field; on the command line it is a flag.
  const message = e instanceof InputTooLongError ? `input is ${e.length} tokens long, the model accepts at most ${e.maxLength}; pass --truncate to cut it` : e.message;
  process.stderr.write(`slabserve: ${e instanceof SlabserveError ? `${e.code}: ` : ''}${message}\n`);
  process.exitCode = 1;
});
