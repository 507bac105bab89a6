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
import { processThreadIds, threadCpuNs } from '../../src/shared/threads.js';
import { procCpuMs, startChildServer } from '../server-process.js';
import type { PhaseResult } from '../suite-results.js';
import { preTokenized } from '../workloads.js';
import { embedOnce } from '../ws-load.js';
import type { SuiteContext } from './context.js';
import { REPO_ROOT } from './paths.js';
import type { ModelSetup } from './setup.js';
import type { Target } from './targets.js';
import { gatewayUs } from './phases.js';

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

async function startFloor(m: ModelSetup): Promise<Target> {
  const child = await startChildServer({
    args: [join(REPO_ROOT, 'dist', 'bench', 'floor-server.js'), '--models-dir', m.dir, '--model', m.name],
    stream: 'stdout',
    ready: (line) => /floor: listening on (\S+)/.exec(line)?.[1] ?? null,
    startTimeoutMs: 30_000,
    what: 'floor server',
  });
  // its /ws answers must be rows of the model's width, or what it spends per request proves nothing
  const row = await embedOnce(child.origin, 'a floor check');
  if (row.length !== m.spec.hiddenSize) throw new Error(`floor server: /ws answered ${row.length} dimensions, the model has ${m.spec.hiddenSize}`);
  const noBatches = { batches: 0, rows: 0, runSeconds: 0, realTokens: 0, paddedTokens: 0, batchSizeLe: new Map() };
  return { label: 'floor', origin: child.origin, cpuMs: () => procCpuMs(child.pid), counters: async () => ({ ...noBatches, threadCpuS: floorThreadCpu(child.pid) }), stop: () => child.stop() };
}

/** Runs the case where asked: its phases and comparisons go with every other case's. */
export async function runFloor(ctx: SuiteContext): Promise<void> {
  if (!ctx.options.cases.has('floor')) return;
  const m = ctx.models[0]!;
  ctx.progress.log(`${m.name}: the floor (bench/floor-server.ts), ${ctx.options.rounds} round${ctx.options.rounds > 1 ? 's' : ''}`);
  const text = m.workloads.get('short')!;
  const workloads = { text, ids: { ...preTokenized(text), name: `${text.name} ids` } };
  const targets = [await ctx.startSlabserve('slabserve', m, []), await startFloor(m)];
  try {
    for (const transport of ['http', 'ws'] as const) {
      for (const form of ['text', 'ids'] as const) {
        for (const clients of [1, 64]) {
          // one WebSocket with every client's request in flight: the load generator's default for up to 64
          const sides = await ctx.closedRounds('floor', m.name, targets, transport, workloads[form], clients);
          const bad = sides.flat().find((p) => p.errors > 0);
          if (bad) throw new Error(`${bad.id}: ${bad.errors} errors, first: ${bad.firstError}`);
          if (transport === 'http' && clients === 64) compareGateway(ctx, m.name, form, sides);
        }
      }
    }
  } finally {
    await Promise.allSettled(targets.map((t) => t.stop()));
  }
}

/** slabserve's gateway threads against the floor server's main thread, CPU per request at 64 HTTP clients. */
function compareGateway(ctx: SuiteContext, model: string, form: 'text' | 'ids', [a, b]: PhaseResult[][]): void {
  ctx.compare(
    {
      id: `floor/${model}/${form}`,
      case: 'floor',
      question: `Gateway CPU per request against the floor (${form === 'ids' ? 'pre-tokenized' : 'texts'})`,
      model,
      workload: 'short',
      transport: 'http',
      metric: 'cpuUsPerRequest',
      note: '64 HTTP keep-alive clients; lower is better',
    },
    { label: 'slabserve gateway thread', phases: a! },
    { label: 'floor server', phases: b! },
    gatewayUs,
  );
}
