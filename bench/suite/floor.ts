/**
 * floor: `slabserve serve` beside the floor server (bench/floor-server.ts: read
 * the body, tokenize, serialise a row; no batching, no model) under the same
 * closed loops, and the CPU each spends per request, thread by thread
 * (slabserve's from slabserve_thread_cpu_seconds_total, the floor's from
 * /proc). HTTP and WebSocket (one socket, 64 in flight), texts and ids, 1 and
 * 64 clients; the comparison is slabserve's gateway thread against the floor
 * at 64 HTTP clients. First model, after every other case.
 */
import { join } from 'node:path';
import { mulberry32 } from '../../models/generator/rng.js';
import { processThreadIds, threadCpuNs } from '../../src/shared/threads.js';
import { floorRows, gatewayUs, type FloorPhase, type FloorRow, type Side } from '../floor-report.js';
import { runLoad, type LoadTarget } from '../load.js';
import { procCpuMs, startChildServer, startServerProcess } from '../server-process.js';
import { preTokenized } from '../workloads.js';
import type { SuiteContext } from './context.js';
import { CLI, REPO_ROOT } from './paths.js';
import { median, perThread, round, roundOrder } from './phases.js';
import type { ModelSetup } from './setup.js';

const SIDES: Side[] = ['slabserve', 'floor'];
const us = (seconds: number) => round(seconds * 1e6, 1);

/** The floor server's thread CPU seconds: its main thread (the pid) and every other thread. */
function floorThreadCpu(pid: number): Map<string, number> {
  const out = new Map([
    ['main', 0],
    ['other', 0],
  ]);
  for (const tid of processThreadIds(pid)) {
    const name = tid === pid ? 'main' : 'other';
    out.set(name, out.get(name)! + (threadCpuNs(tid, pid) ?? 0) / 1e9);
  }
  return out;
}

async function startFloor(m: ModelSetup): Promise<LoadTarget & { stop(): Promise<unknown> }> {
  const child = await startChildServer({
    args: [join(REPO_ROOT, 'dist', 'bench', 'floor-server.js'), '--models-dir', m.dir, '--model', m.name],
    stream: 'stdout',
    ready: (line) => /floor: listening on (\S+)/.exec(line)?.[1] ?? null,
    startTimeoutMs: 30_000,
    what: 'floor server',
  });
  const noBatches = { batches: 0, rows: 0, runSeconds: 0, realTokens: 0, paddedTokens: 0, failures: 0, batchSizeLe: new Map() };
  return { origin: child.origin, cpuMs: () => procCpuMs(child.pid), counters: async () => ({ ...noBatches, threadCpuS: floorThreadCpu(child.pid) }), stop: () => child.stop() };
}

/** Runs the case where asked; returns the floor's rows for results.json. */
export async function runFloor(ctx: SuiteContext): Promise<FloorRow[] | undefined> {
  if (!ctx.options.cases.has('floor')) return undefined;
  const { rounds, warmupMs, durationMs, seed } = ctx.options;
  const m = ctx.models[0]!;
  ctx.progress.log(`${m.name}: the floor (bench/floor-server.ts), ${rounds} round${rounds > 1 ? 's' : ''}`);
  const text = m.workloads.get('short')!;
  const workloads = { text, ids: preTokenized(text) };
  const slab = await ctx.startSlabserve('slabserve', m, []);
  const floor = await startFloor(m);
  const targets: Record<Side, LoadTarget> = { slabserve: slab, floor };
  const phases: FloorPhase[] = [];
  const r = mulberry32(seed);
  try {
    for (let k = 1; k <= rounds; k++) {
      for (const transport of ['http', 'ws'] as const) {
        for (const form of ['text', 'ids'] as const) {
          for (const clients of [1, 64]) {
            for (const side of roundOrder(k, SIDES.length).map((i) => SIDES[i]!)) {
              const o = await runLoad(
                {
                  target: targets[side],
                  model: m.name,
                  transport,
                  workload: workloads[form],
                  arrivals: { kind: 'closed', concurrency: clients },
                  warmupMs,
                  durationMs,
                  generator: ctx.options.loadGenerator,
                  ...(transport === 'ws' ? { ws: { sockets: 1, depth: clients }, rowBytes: m.spec.hiddenSize * 4 } : {}),
                },
                r,
              );
              const p: FloorPhase = {
                side,
                transport,
                form,
                clients,
                round: k - 1,
                requests: o.requests,
                reqPerS: Math.round((o.requests / o.windowMs) * 1000),
                p50Ms: o.histogram.getValueAtPercentile(50) / 1000,
                p99Ms: o.histogram.getValueAtPercentile(99) / 1000,
                errors: o.errors,
                cpuUsPerRequest: perThread(o.before!.threadCpuS, o.after!.threadCpuS, o.requests),
                clientUsPerRequest: us(o.clientCpuMs / 1000 / Math.max(1, o.requests)),
              };
              o.histogram.destroy();
              if (o.errors > 0) throw new Error(`${side} ${transport} ${form} x${clients}: ${o.errors} errors, first: ${o.firstError}`);
              phases.push(p);
              const cpu = Object.entries(p.cpuUsPerRequest).map(([t, v]) => `${t} ${v}`);
              ctx.progress.log(`round ${k} ${side} ${transport} ${form} x${clients}: ${p.reqPerS} req/s, P50 ${p.p50Ms.toFixed(2)} ms; us/request: ${cpu.join(', ')}`);
            }
          }
        }
      }
    }
  } finally {
    await Promise.allSettled([slab.stop(), floor.stop()]);
  }
  for (const form of ['text', 'ids'] as const) compareGateway(ctx, m.name, phases, form);
  return floorRows(phases);
}

/** slabserve's gateway threads against the floor server's main thread, CPU per request at 64 HTTP clients. */
function compareGateway(ctx: SuiteContext, model: string, phases: FloorPhase[], form: FloorPhase['form']): void {
  const pick = (side: Side) => phases.filter((p) => p.side === side && p.transport === 'http' && p.form === form && p.clients === 64);
  const [a, b] = [pick('slabserve'), pick('floor')];
  const roundRatios = a.map((p, i) => round(gatewayUs(p.cpuUsPerRequest) / (b[i]?.cpuUsPerRequest.main ?? NaN), 3));
  ctx.comparisons.push({
    id: `floor/${model}/${form}`,
    case: 'floor',
    question: `Gateway CPU per request against the floor (${form === 'ids' ? 'pre-tokenized' : 'texts'})`,
    model,
    workload: 'short',
    transport: 'http',
    metric: 'cpuUsPerRequest',
    a: { label: 'slabserve gateway thread', value: round(median(a.map((p) => gatewayUs(p.cpuUsPerRequest))), 1) },
    b: { label: 'floor server', value: round(median(b.map((p) => p.cpuUsPerRequest.main ?? NaN)), 1) },
    ratio: round(median(roundRatios), 3),
    roundRatios,
    note: '64 HTTP keep-alive clients; lower is better',
  });
}
