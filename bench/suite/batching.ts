/**
 * batching: what dynamic batching buys. The same server with its defaults and
 * with `--max-batch-size 1`, same load: 64 HTTP clients, 1 WebSocket x 64 in
 * flight, 8 clients x 16 texts, 1 client (P50). Its batched server's 64-client
 * phases are what efficiency and curve measure against, so it also runs for
 * those cases; for the models after the first, only the 64 HTTP clients row,
 * recorded as the `models` case. Before timing, every server and engine must
 * give raw onnxruntime's vectors within 1e-4, and /ws its POST /embed rows.
 */
import type { CaseName, Comparison, PhaseResult } from '../suite-results.js';
import { CLIENTS, type SuiteContext } from './context.js';
import type { EngineSide } from './engine.js';
import type { ModelSetup } from './setup.js';
import { checkAgainstRaw, checkWsAgainstHttp, postEmbed, type Target } from './targets.js';

const CLIENT_BATCH_CLIENTS = 8;

type Question = Omit<Comparison, 'a' | 'b' | 'ratio' | 'roundRatios'>;

/**
 * Runs the case for model `m` (`first`: the suite's first model) where any
 * case needs it; returns the batched server's 64-client HTTP phases, none
 * when it did not run.
 */
export async function runBatching(ctx: SuiteContext, m: ModelSetup, first: boolean): Promise<PhaseResult[]> {
  const cases = ctx.options.cases;
  if (!(cases.has('batching') || cases.has('efficiency') || cases.has('curve') || (cases.has('models') && !first))) return [];
  const batched = await ctx.startSlabserve('batched', m, []);
  const unbatched = cases.has('batching') || !first ? await ctx.startSlabserve('max-batch-size 1', m, ['--max-batch-size', '1']) : undefined;
  const full = first && unbatched !== undefined && cases.has('batching');
  const engines: EngineSide[] = [];
  try {
    if (full) engines.push(await ctx.openEngine('engine batched', m), await ctx.openEngine('engine max-batch-size 1', m, { maxBatchSize: 1 }));
    const sides = unbatched ? [batched, unbatched] : [batched];
    for (const s of sides) await checkAgainstRawOrStop(ctx, m, `${s.label} server`, (texts) => postEmbed(s.origin, texts));
    for (const e of engines) await checkAgainstRawOrStop(ctx, m, e.label, (texts) => e.engine.embed(texts, { model: m.name }));
    const c: CaseName = first ? 'batching' : 'models';
    const phases = await ctx.closedRounds(c, m.name, sides, 'http', m.workloads.get('short')!, CLIENTS, engines);
    const http = phases.slice(0, sides.length);
    if (unbatched) {
      const q: Question = { id: `batching/${m.name}/http`, case: c, question: 'What does dynamic batching buy?', model: m.name, workload: 'short', transport: 'http', metric: 'rps', note: `${CLIENTS} keep-alive clients, closed loop` };
      compareSides(ctx, q, http);
    }
    if (full) {
      compareWithEngine(ctx, m, http[0]!, phases.slice(sides.length));
      await runOtherShapes(ctx, m, sides);
    }
    return http[0]!;
  } finally {
    await batched.stop();
    await unbatched?.stop();
    for (const e of engines) await e.engine.close();
  }
}

/**
 * The in-process engine's rounds (batched, then max-batch-size 1), run beside the HTTP ones: how much
 * of it HTTP keeps, and its own batching gain. HTTP adds per-request work to both of its sides that
 * batching does not share (the gateway, the socket, the load generator), so its gain is expected
 * below the engine's: the engine's is the gain to read for what batching does to the model's runs.
 */
function compareWithEngine(ctx: SuiteContext, m: ModelSetup, httpBatched: PhaseResult[], engine: PhaseResult[][]): void {
  const where = { model: m.name, workload: 'short', case: 'batching' as const };
  ctx.compare(
    { id: `batching/${m.name}/http-vs-engine`, ...where, question: 'How much of the in-process engine does HTTP keep?', transport: 'http', metric: 'rps', note: `${CLIENTS} keep-alive clients against ${CLIENTS} in-process callers of engine.embed(text), the same texts, both batched` },
    { label: 'slabserve HTTP', phases: httpBatched },
    { label: 'in-process engine', phases: engine[0]! },
  );
  compareSides(
    ctx,
    { id: `batching/${m.name}/engine`, ...where, question: 'What does dynamic batching buy with no transport?', transport: 'in-process', metric: 'rps', note: `${CLIENTS} in-process callers of engine.embed(text): no transport work beside the batches (HTTP adds some to every request, which dilutes its gain)` },
    engine,
  );
}

/** A server or an engine must compute what raw onnxruntime computes before it is timed. */
async function checkAgainstRawOrStop(ctx: SuiteContext, m: ModelSetup, what: string, embed: (texts: string[]) => Promise<ArrayLike<number>[]>): Promise<void> {
  const diff = await checkAgainstRaw(embed, m.workloads.get('short')!, m.prepared);
  ctx.progress.log(`${m.name}: ${what} vectors equal raw onnxruntime within ${diff.toExponential(1)}`);
  if (diff > 1e-4) throw new Error(`${m.name}: the ${what} vectors differ from raw onnxruntime by ${diff}: not benchmarking a wrong answer`);
}

/** The first model's other load shapes: WebSocket, client batches, one lone client. */
async function runOtherShapes(ctx: SuiteContext, m: ModelSetup, sides: Target[]): Promise<void> {
  const short = m.workloads.get('short')!;
  for (const side of sides) {
    const diff = await checkWsAgainstHttp(side.origin, short);
    ctx.progress.log(`${m.name}: ${side.label} server /ws f32 rows equal its POST /embed vectors within ${diff.toExponential(1)}`);
    if (diff > 1e-5) throw new Error(`${m.name}: ${side.label} server's /ws rows differ from its POST /embed vectors by ${diff}: not benchmarking a wrong answer`);
  }
  const ws = await ctx.closedRounds('batching', m.name, sides, 'ws', short, CLIENTS);
  compareSides(
    ctx,
    { id: `batching/${m.name}/ws`, case: 'batching', question: 'What does dynamic batching buy over WebSocket?', model: m.name, workload: 'short', transport: 'ws', metric: 'rps', note: `1 socket x ${CLIENTS} in flight` },
    ws,
  );
  const clientBatches = await ctx.closedRounds('batching', m.name, sides, 'http', m.workloads.get('client-batch')!, CLIENT_BATCH_CLIENTS);
  compareSides(
    ctx,
    { id: `batching/${m.name}/client-batch`, case: 'batching', question: 'And for clients that send 16 texts per request?', model: m.name, workload: 'client-batch', transport: 'http', metric: 'inputsPerS', note: `${CLIENT_BATCH_CLIENTS} clients` },
    clientBatches,
  );
  const lone = await ctx.closedRounds('batching', m.name, sides, 'http', short, 1);
  compareSides(
    ctx,
    { id: `batching/${m.name}/latency-1-client`, case: 'batching', question: 'What does batching cost a lone client (P50)?', model: m.name, workload: 'short', transport: 'http', metric: 'p50', note: '1 client: below 1 means batching is faster' },
    lone,
  );
}

/** Batched (side 0) against max-batch-size 1 (side 1). */
function compareSides(ctx: SuiteContext, q: Question, phases: PhaseResult[][]): void {
  ctx.compare(q, { label: 'batched', phases: phases[0]! }, { label: 'max-batch-size 1', phases: phases[1]! });
}
