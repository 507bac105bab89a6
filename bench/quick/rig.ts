/**
 * What bench:quick measures, opened once and kept for every round: raw
 * onnxruntime sessions and their padded batches, one engine per engine
 * configuration, and two `slabserve serve` child processes (batching on, and
 * --max-batch-size 1), each checked before timing. close() releases all of it.
 */
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import type * as ort from 'onnxruntime-node';
import { createEngine, ENGINE_DEFAULTS, type Engine } from '../../src/main/engine.js';
import { prepareModel } from '../../src/gpu-worker/graph.js';
import { mulberry32 as rng } from '../../models/generator/rng.js';
import type { ModelSpec } from '../../src/shared/model-format/model-config.js';
import { openRawSession, rawBatches, type RawBatch } from '../raw-ort.js';
import { startServerProcess, type ServerProcess } from '../server-process.js';
import { checkServer, checkWs } from './checks.js';
import type { QuickOptions } from './options.js';
import type { Seq } from './workload.js';

/** Batch sizes of the raw rows. */
export const RAW_BATCHES = [1, 8, 32];
export const DEFAULT_INFLIGHT = ENGINE_DEFAULTS.maxInflightBatches;
export const HTTP_BATCHED = 'http batched';
export const HTTP_MBS1 = 'http maxBatchSize=1';

export interface EngineConfig {
  name: string;
  maxBatchSize?: number;
  maxInflightBatches: number;
  intraOpThreads: number;
}

export interface Rig {
  rawSession: ort.InferenceSession;
  /** Extra raw b=32 sessions, one per other intra-op setting. */
  rawAlt: Map<number, ort.InferenceSession>;
  rawSets: Map<number, RawBatch[]>;
  engineConfigs: EngineConfig[];
  engines: Map<string, Engine>;
  servers: Map<string, ServerProcess>;
  serverArgs: string[];
  /** Set-up times and check lines, for the JSON output. */
  setup: { rawMs: number; engineStartMs: number; serverReadyMs: number; serverChecks: Record<string, string> };
  /** f32 bytes of one row over /ws (0 without WebSocket rows). */
  wsRowBytes: number;
}

/** The engine configurations: the main table's two, then the extra table's maxInflightBatches x intraOpThreads. */
export function engineConfigs(o: QuickOptions): EngineConfig[] {
  const out: EngineConfig[] = [];
  if (o.engines) {
    out.push(
      { name: 'engine batched', maxInflightBatches: DEFAULT_INFLIGHT, intraOpThreads: o.intra },
      { name: 'engine maxBatchSize=1', maxBatchSize: 1, maxInflightBatches: DEFAULT_INFLIGHT, intraOpThreads: o.intra },
    );
  }
  if (o.extra) {
    for (const intra of o.intras) {
      for (const inflight of [1, 2]) {
        if (intra === o.intra && inflight === DEFAULT_INFLIGHT) continue; // that is 'engine batched'
        out.push({ name: `engine inflight=${inflight} intra=${intra}`, maxInflightBatches: inflight, intraOpThreads: intra });
      }
    }
  }
  return out;
}

/** Opens the raw sessions and the engines; starts the servers first so their warm-up overlaps the engines' (each keeps one core busy). */
export async function openRig(o: QuickOptions, spec: ModelSpec, seqs: Seq[], buckets: number[], cliPath: string): Promise<Rig> {
  const t = performance.now();
  const prepared = prepareModel(readFileSync(spec.onnxPath), spec);
  const rawSession = await openRawSession(prepared, o.device, o.intra);
  const rawAlt = new Map<number, ort.InferenceSession>();
  if (o.extra) for (const intra of o.intras.slice(1)) rawAlt.set(intra, await openRawSession(prepared, o.device, intra));
  const rawSets = new Map(RAW_BATCHES.map((b) => [b, rawBatches(seqs, buckets, b, prepared, rng(o.seed + b))]));
  const rawMs = performance.now() - t;

  // `slabserve serve` as a user runs it, on loopback.
  const serverArgs = ['--host', '127.0.0.1', '--port', '0', '--models-dir', o.modelsDir, '--model', o.model, '--device', o.device, '--intra-op-threads', String(o.intra), '--max-inflight-batches', String(DEFAULT_INFLIGHT)];
  const t3 = performance.now();
  const starting = o.http
    ? ([
        [HTTP_BATCHED, startServerProcess({ cliPath, args: serverArgs })],
        [HTTP_MBS1, startServerProcess({ cliPath, args: [...serverArgs, '--max-batch-size', '1'] })],
      ] as const)
    : [];
  for (const [, p] of starting) p.catch(() => {}); // awaited below
  const configs = engineConfigs(o);
  const t2 = performance.now();
  const engines = await openEngines(o, configs);
  const engineStartMs = configs.length ? (performance.now() - t2) / configs.length : 0;
  const rig: Rig = { rawSession, rawAlt, rawSets, engineConfigs: configs, engines, servers: new Map(), serverArgs, setup: { rawMs, engineStartMs, serverReadyMs: 0, serverChecks: {} }, wsRowBytes: 0 };
  if (!o.http) return rig;
  try {
    for (const [name, p] of starting) rig.servers.set(name, await p);
    rig.setup.serverReadyMs = performance.now() - t3;
    for (const [name, server] of rig.servers) rig.setup.serverChecks[name] = await checkServer(o, name, server, seqs, engines.get('engine batched'));
    if (o.ws) {
      const c = await checkWs(o, rig.servers.get(HTTP_BATCHED)!, seqs);
      rig.setup.serverChecks.ws = c.line;
      rig.wsRowBytes = c.rowBytes;
    }
  } catch (err) {
    for (const [, p] of starting) await p.then((server) => server.stop(1000)).catch(() => {});
    for (const e of engines.values()) await e.close();
    throw err;
  }
  return rig;
}

/**
 * Every engine stays open for all rounds (an idle engine's inference thread only wakes every 250 ms),
 * so no phase pays for start-up. Opened one after the other: start-up is mostly warm-up runs, CPU-bound.
 */
async function openEngines(o: QuickOptions, configs: EngineConfig[]): Promise<Map<string, Engine>> {
  const engines = new Map<string, Engine>();
  for (const c of configs) {
    const engine = await createEngine({
      modelsDir: o.modelsDir,
      models: [o.model],
      device: o.device,
      maxInflightBatches: c.maxInflightBatches,
      intraOpThreads: c.intraOpThreads,
      ...(c.maxBatchSize ? { batching: { maxBatchSize: c.maxBatchSize } } : {}),
      log: () => {},
    });
    engines.set(c.name, engine);
  }
  return engines;
}

/** Stops the servers (SIGTERM: they drain; every load client is closed by then), closes the engines, releases the sessions. */
export async function closeRig(rig: Rig): Promise<Record<string, { code: number | null; signal: string | null }>> {
  const exits: Record<string, { code: number | null; signal: string | null }> = {};
  for (const [name, server] of rig.servers) {
    const exit = await server.stop();
    exits[name] = exit;
    if (exit.code !== 0) console.error(`warning: the ${name} server exited with code ${exit.code}, signal ${exit.signal} after SIGTERM`);
  }
  for (const e of rig.engines.values()) await e.close();
  await rig.rawSession.release();
  for (const session of rig.rawAlt.values()) await session.release();
  return exits;
}

/** The set-up lines printed before the rounds. */
export function rigLines(o: QuickOptions, rig: Rig, buckets: number[]): string[] {
  const first = rig.engines.values().next().value;
  const { rawMs, engineStartMs, serverReadyMs, serverChecks } = rig.setup;
  const b = first?.info()[0]!.batching;
  const lines = [
    `set-up: raw sessions + batches ${(rawMs / 1000).toFixed(1)}s` +
      (first && b
        ? `; createEngine ${(engineStartMs / 1000).toFixed(1)}s each x ${rig.engineConfigs.length} (engine device: ${first.device.label}, ${first.device.name}); ` +
          `engine batching: maxBatchSize ${b.maxBatchSize}, maxBatchDelayMs ${b.maxBatchDelayMs}, maxBatchTokens ${b.maxBatchTokens}, buckets ${buckets.join(',')}`
        : ''),
  ];
  if (o.http) {
    const line = (name: string) => rig.servers.get(name)!.startLines.find((l) => l.includes('maxBatchSize=')) ?? '';
    lines.push(
      `set-up: ${rig.servers.size} x slabserve serve ${rig.serverArgs.join(' ')} [--max-batch-size 1], ready ${(serverReadyMs / 1000).toFixed(1)}s after start${o.engines ? ' (alongside the engines)' : ''}; ` +
        `${line(HTTP_BATCHED).replace(/^slabserve: /, '')} | ${line(HTTP_MBS1).replace(/^slabserve: model \S+ /, '')}`,
      `check: ${Object.entries(serverChecks).map(([n, c]) => `${n}: ${c}`).join('; ')}`,
    );
  }
  return lines;
}

