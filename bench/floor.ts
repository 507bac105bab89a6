/**
 * The floor case: `slabserve serve` side by side with the floor server
 * (bench/floor-server.ts: read the body, tokenize, serialise a row; no
 * batching, no model), under the same closed-loop load, and the CPU each
 * spends per request, thread by thread:
 *
 *   slabserve  gateway (gateway-0), inference, onnxruntime (its intra-op pool),
 *              main, other (V8/libuv helpers), from slabserve_thread_cpu_seconds_total
 *   floor      main (its only JavaScript thread), other, from /proc/PID/task/STAT
 *
 * The gateway thread's CPU per request against the floor's is the price of
 * slabserve's request path around the batcher; the target is 1.5x.
 * Phases: HTTP and WebSocket x text and pre-tokenized ids x 1 and 64 clients
 * (64 over WebSocket: one socket, 64 in flight); sides alternate round by
 * round (slabserve first in even rounds); the median round is reported.
 *
 *   node dist/bench/floor.js [--rounds 3] [--duration-s 2] [--clients 1,64] [--transports http,ws] [--forms text,ids]
 *                            [--server-arg=--max-batch-size=1 ...] [--json PATH]
 * bench/suite.ts runs it as one of its cases (runFloorCase).
 */
import { writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadModelSpec } from '../src/shared/model-format/model-config.js';
import { processThreadIds, threadCpuNs } from '../src/shared/threads.js';
import { mulberry32 } from '../models/generator/rng.js';
import { parseOptions } from './args.js';
import { procCpuMs, startChildServer, startServerProcess, type ServerCounters } from './server-process.js';
import { runLoad, type LoadTarget } from './load.js';
import { floorRows, floorTable, type FloorPhase, type Side } from './floor-report.js';
import { makeWorkload, preTokenized, type Workload } from './workloads.js';

export { floorRows, floorTable, type FloorPhase, type FloorRow } from './floor-report.js';

export interface FloorCaseOptions {
  cliPath: string;
  modelsDir: string;
  model: string;
  rounds: number;
  warmupMs: number;
  durationMs: number;
  clients: number[];
  transports: ('http' | 'ws')[];
  forms: Workload['form'][];
  /** Extra `slabserve serve` flags. */
  serverArgs?: string[];
  seed?: number;
  onPhase?: (line: string) => void;
}

const us = (seconds: number) => Math.round(seconds * 1e6 * 10) / 10;

/** The floor server's thread CPU: its main thread (the pid) and every other thread. */
function floorThreadCpu(pid: number): Map<string, number> {
  const out = new Map<string, number>([
    ['main', 0],
    ['other', 0],
  ]);
  for (const tid of processThreadIds(pid)) {
    const ns = threadCpuNs(tid, pid);
    if (ns === null) continue;
    const name = tid === pid ? 'main' : 'other';
    out.set(name, out.get(name)! + ns / 1e9);
  }
  return out;
}

function onlyThreads(threadCpuS: Map<string, number>): ServerCounters {
  return { batches: 0, rows: 0, runSeconds: 0, realTokens: 0, paddedTokens: 0, failures: 0, batchSizeLe: new Map(), threadCpuS };
}

async function startFloor(cliDir: string, modelsDir: string, model: string): Promise<LoadTarget & { stop(): Promise<unknown> }> {
  const child = await startChildServer({
    args: [join(cliDir, 'floor-server.js'), '--models-dir', modelsDir, '--model', model],
    stream: 'stdout',
    ready: (line) => /floor: listening on (\S+)/.exec(line)?.[1] ?? null,
    startTimeoutMs: 30_000,
    what: 'floor server',
  });
  return {
    origin: child.origin,
    cpuMs: () => procCpuMs(child.pid),
    counters: async () => onlyThreads(floorThreadCpu(child.pid)),
    stop: () => child.stop(),
  };
}

/** Per-request CPU by thread, from two samples of the server's thread counters. */
function perRequest(before: Map<string, number>, after: Map<string, number>, requests: number): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [name, s] of after) out[name] = us((s - (before.get(name) ?? 0)) / Math.max(1, requests));
  return out;
}

export async function runFloorCase(opts: FloorCaseOptions): Promise<FloorPhase[]> {
  const spec = loadModelSpec(join(opts.modelsDir, opts.model));
  const text = await makeWorkload('short', spec, opts.seed ?? 1, 2048);
  const workloads = { text, ids: preTokenized(text) };
  const slab = await startServerProcess({
    cliPath: opts.cliPath,
    args: ['--host', '127.0.0.1', '--port', '0', '--models-dir', opts.modelsDir, '--model', opts.model, '--device', 'cpu', ...(opts.serverArgs ?? [])],
  });
  const floor = await startFloor(dirname(opts.cliPath).replace(/src$/, 'bench'), opts.modelsDir, opts.model);
  const targets: Record<Side, LoadTarget> = { slabserve: { origin: slab.origin, cpuMs: slab.cpuMs, counters: slab.counters }, floor };
  const phases: FloorPhase[] = [];
  const r = mulberry32(opts.seed ?? 1);
  try {
    for (let round = 0; round < opts.rounds; round++) {
      for (const transport of opts.transports) {
        for (const form of opts.forms) {
          for (const clients of opts.clients) {
            const sides: Side[] = round % 2 === 0 ? ['slabserve', 'floor'] : ['floor', 'slabserve'];
            for (const side of sides) {
              const o = await runLoad(
                {
                  target: targets[side],
                  model: opts.model,
                  transport,
                  workload: workloads[form],
                  arrivals: { kind: 'closed', concurrency: clients },
                  warmupMs: opts.warmupMs,
                  durationMs: opts.durationMs,
                  ...(transport === 'ws' ? { ws: { sockets: 1, depth: clients }, rowBytes: spec.hiddenSize * 4 } : {}),
                },
                r,
              );
              const phase: FloorPhase = {
                side,
                transport,
                form,
                clients,
                round,
                requests: o.requests,
                reqPerS: Math.round((o.requests / o.windowMs) * 1000),
                p50Ms: o.histogram.getValueAtPercentile(50) / 1000,
                p99Ms: o.histogram.getValueAtPercentile(99) / 1000,
                errors: o.errors,
                cpuUsPerRequest: perRequest(o.before!.threadCpuS, o.after!.threadCpuS, o.requests),
                clientUsPerRequest: us(o.clientCpuMs / 1000 / Math.max(1, o.requests)),
              };
              o.histogram.destroy();
              if (o.errors > 0) throw new Error(`${side} ${transport} ${form} x${clients}: ${o.errors} errors, first: ${o.firstError}`);
              phases.push(phase);
              opts.onPhase?.(describePhase(phase));
            }
          }
        }
      }
    }
  } finally {
    await Promise.allSettled([slab.stop(), floor.stop()]);
  }
  return phases;
}

function describePhase(p: FloorPhase): string {
  const cpu = Object.entries(p.cpuUsPerRequest)
    .map(([k, v]) => `${k} ${v}`)
    .join(', ');
  return `round ${p.round + 1} ${p.side} ${p.transport} ${p.form} x${p.clients}: ${p.reqPerS} req/s, P50 ${p.p50Ms.toFixed(2)} ms; us/request: ${cpu}`;
}

// ---------------------------------------------------------------- command line

async function main(): Promise<void> {
  const here = dirname(fileURLToPath(import.meta.url));
  const repoRoot = resolve(here, '..', '..');
  const a = parseOptions('node dist/bench/floor.js [options]', {
    'models-dir': { type: 'string', value: 'DIR', default: join(repoRoot, 'models'), help: 'where the model folder is' },
    model: { type: 'string', value: 'NAME', default: 'tiny-embed', help: 'model folder under --models-dir' },
    rounds: { type: 'int', min: 1, default: 3, help: 'rounds, alternating slabserve and the floor' },
    'duration-s': { type: 'number', min: 0.2, value: 'S', default: 2, help: 'measured seconds per phase' },
    'warmup-s': { type: 'number', min: 0, value: 'S', default: 0.5, help: 'warm-up seconds before each phase' },
    clients: { type: 'ints', min: 1, default: [1, 64], help: 'closed-loop clients' },
    transports: { type: 'strings', choices: ['http', 'ws'], default: ['http', 'ws'], help: 'transports' },
    forms: { type: 'strings', choices: ['text', 'ids'], default: ['text', 'ids'], help: 'request forms: texts, or pre-tokenized ids' },
    'server-arg': { type: 'repeated', value: '--FLAG=VALUE', help: 'passed on to slabserve serve (repeat for more)' },
    json: { type: 'string', value: 'PATH', help: 'also write the phases and rows as JSON' },
  });
  const phases = await runFloorCase({
    cliPath: join(repoRoot, 'dist', 'src', 'cli.js'),
    modelsDir: a['models-dir'],
    model: a.model,
    rounds: a.rounds,
    warmupMs: a['warmup-s'] * 1000,
    durationMs: a['duration-s'] * 1000,
    clients: a.clients,
    transports: a.transports,
    forms: a.forms,
    serverArgs: a['server-arg'].flatMap((x) => x.split('=').length > 1 && x.startsWith('--') ? [x.slice(0, x.indexOf('=')), x.slice(x.indexOf('=') + 1)] : [x]),
    onPhase: (line) => console.error(line),
  });
  const rows = floorRows(phases);
  console.log(floorTable(rows));
  if (a.json) writeFileSync(a.json, JSON.stringify({ phases, rows }, null, 2));
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exit(1);
  });
}
