/**
 * bench:quick's options, declared once (bench/args.ts writes --help from this
 * table), and what follows from them: which tables run, the WebSocket
 * configurations, the intra-op thread counts of the extra table.
 */
import { join } from 'node:path';
import { fail, parseOptions } from '../args.js';
import type { GeneratorChoice } from '../load.js';

export const USAGE = 'node dist/bench/quick.js [options]';

export function optionTable(repoRoot: string) {
  return {
    model: { type: 'string', value: 'NAME', default: 'tiny-embed', help: 'model folder under --models-dir' },
    'models-dir': { type: 'string', value: 'DIR', default: join(repoRoot, 'models'), help: 'where the models are' },
    'duration-s': { type: 'number', min: 0.1, value: 'S', default: 2, help: 'measured seconds per phase and round' },
    'warmup-s': { type: 'number', min: 0, value: 'S', default: 0.5, help: 'warm-up seconds before each measured phase' },
    rounds: { type: 'int', min: 1, default: 3, help: 'rounds per configuration, alternating order' },
    report: { type: 'string', choices: ['median', 'best'], value: 'median|best', default: 'median', help: 'which round each row shows (best = most seq/s)' },
    concurrency: { type: 'int', min: 1, default: 64, help: 'closed-loop callers for the engine phases' },
    'intra-op-threads': { type: 'int', min: 0, default: 0, help: "onnxruntime intra-op threads for the main table, raw and engine (0: onnxruntime's choice)" },
    device: { type: 'string', value: 'D', default: 'cpu', help: 'engine device' },
    requests: { type: 'int', min: 64, default: 4096, help: 'workload size: sequences generated from the seed' },
    seed: { type: 'int', min: 0, default: 1234, help: 'workload seed' },
    texts: { type: 'boolean', help: 'engine phases call engine.embed(text) (tokenization included) instead of runTokens on its ids' },
    ids: { type: 'boolean', help: 'workload of random token ids instead of texts (the old default; implies --skip-http)' },
    'extra-intra': { type: 'ints', min: 0, default: [1, 2], help: 'intra-op thread counts the extra table compares with --intra-op-threads' },
    'skip-extra': { type: 'boolean', help: 'skip the maxInflightBatches x intraOpThreads table' },
    'skip-http': { type: 'boolean', help: 'skip the HTTP table' },
    'http-only': { type: 'boolean', help: 'raw rows and the HTTP table only (no engine phases)' },
    'http-clients': { type: 'ints', min: 1, default: [1, 64], help: 'concurrent HTTP clients, one keep-alive connection each' },
    'load-generator': { type: 'string', choices: ['auto', 'wrk', 'node'], value: 'G', default: 'auto', help: "HTTP rows' load generator: wrk (apt-get install wrk), the Node one (node:http, about 6x the CPU per request), or wrk where installed" },
    ws: { type: 'strings', default: ['1x64', '4x16'], help: 'WebSocket rows against the batched server, SOCKETSxIN_FLIGHT each' },
    'skip-ws': { type: 'boolean', help: 'no WebSocket rows' },
    'skip-floor': { type: 'boolean', help: 'no floor table (slabserve beside the floor server: bench/floor.ts)' },
    json: { type: 'string', value: 'PATH', help: "also write every round's raw results as JSON" },
  } as const;
}

export type WsConfig = { sockets: number; depth: number };

/** The parsed options and the plan they make. */
export type QuickOptions = ReturnType<typeof parseQuickOptions>;

const unique = (xs: number[]) => xs.filter((v, i, a) => a.indexOf(v) === i);

function wsConfig(x: string): WsConfig {
  const m = /^(\d+)x(\d+)$/.exec(x);
  if (!m || Number(m[1]) < 1 || Number(m[2]) < 1) fail(`--ws: expected SOCKETSxIN_FLIGHT (e.g. 1x64), got "${x}"`);
  return { sockets: Number(m[1]), depth: Number(m[2]) };
}

export function parseQuickOptions(repoRoot: string, argv?: string[]) {
  const o = parseOptions(USAGE, optionTable(repoRoot), argv);
  if (o.ids && o.texts) fail('--ids and --texts exclude each other');
  if (o['http-only'] && (o['skip-http'] || o.ids)) fail('--http-only needs the HTTP rows: not with --skip-http or --ids');
  const http = !o['skip-http'] && !o.ids;
  const wsConfigs = o['skip-ws'] ? [] : o.ws.map(wsConfig);
  const intra = o['intra-op-threads'];
  return {
    model: o.model,
    modelsDir: o['models-dir'],
    durationMs: o['duration-s'] * 1000,
    warmupMs: o['warmup-s'] * 1000,
    rounds: o.rounds,
    report: o.report,
    concurrency: o.concurrency,
    intra,
    /** Intra-op thread counts of the extra table: --intra-op-threads first, then the others. */
    intras: unique([intra, ...o['extra-intra']]),
    device: o.device,
    requests: o.requests,
    seed: o.seed,
    texts: o.texts,
    ids: o.ids,
    /** Which tables run. */
    http,
    engines: !o['http-only'],
    extra: !o['skip-extra'] && !o['http-only'],
    ws: http && wsConfigs.length > 0,
    floor: http && !o['skip-floor'],
    httpClients: unique(o['http-clients']),
    loadGenerator: o['load-generator'] as GeneratorChoice,
    wsConfigs,
    json: o.json,
  };
}
