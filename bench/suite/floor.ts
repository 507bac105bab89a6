/**
 * floor: the gateway's CPU per request against a server doing only its
 * unavoidable work (bench/floor.ts runs both), HTTP and WebSocket, texts and
 * ids, 1 and 64 clients; the comparison is slabserve's gateway thread against
 * the floor server at 64 HTTP clients. First model, after every other case.
 */
import { floorRows, runFloorCase, type FloorPhase, type FloorRow } from '../floor.js';
import type { SuiteContext } from './context.js';
import { CLI } from './paths.js';
import { median, round } from './phases.js';

/** Runs the case where asked; returns the floor's rows for results.json. */
export async function runFloor(ctx: SuiteContext): Promise<FloorRow[] | undefined> {
  if (!ctx.options.cases.has('floor')) return undefined;
  const { rounds, warmupMs, durationMs, seed } = ctx.options;
  const m = ctx.models[0]!;
  ctx.progress.log(`${m.name}: the floor (bench/floor.ts), ${rounds} round${rounds > 1 ? 's' : ''}`);
  const floorPhases = await runFloorCase({
    cliPath: CLI,
    modelsDir: m.dir,
    model: m.name,
    rounds,
    warmupMs,
    durationMs,
    clients: [1, 64],
    transports: ['http', 'ws'],
    forms: ['text', 'ids'],
    seed,
    onPhase: (line) => ctx.progress.log(line),
  });
  const rows = floorRows(floorPhases);
  for (const form of ['text', 'ids'] as const) compareGateway(ctx, m.name, floorPhases, form);
  return rows;
}

/** slabserve's gateway threads against the floor server's main thread, CPU per request at 64 HTTP clients. */
function compareGateway(ctx: SuiteContext, model: string, floorPhases: FloorPhase[], form: FloorPhase['form']): void {
  const gateway = (p: FloorPhase) => Object.entries(p.cpuUsPerRequest).reduce((a, [k, v]) => a + (k.startsWith('gateway') ? v : 0), 0);
  const pick = (side: FloorPhase['side']) => floorPhases.filter((p) => p.side === side && p.transport === 'http' && p.form === form && p.clients === 64);
  const [a, b] = [pick('slabserve'), pick('floor')];
  const roundRatios = a.map((p, i) => round(gateway(p) / (b[i]?.cpuUsPerRequest.main ?? NaN), 3));
  ctx.comparisons.push({
    id: `floor/${model}/${form}`,
    case: 'floor',
    question: `Gateway CPU per request against the floor (${form === 'ids' ? 'pre-tokenized' : 'texts'})`,
    model,
    workload: 'short',
    transport: 'http',
    metric: 'cpuUsPerRequest',
    a: { label: 'slabserve gateway thread', value: round(median(a.map(gateway)), 1) },
    b: { label: 'floor server', value: round(median(b.map((p) => p.cpuUsPerRequest.main ?? NaN)), 1) },
    ratio: round(median(roundRatios), 3),
    roundRatios,
    note: '64 HTTP keep-alive clients; lower is better',
  });
}
