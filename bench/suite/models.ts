/**
 * models: the cases, model by model. The first model gets every case asked
 * for; the others (e.g. minilm-l6) the batching, efficiency and peer rows
 * again, batching and efficiency recorded as the `models` case. Within a
 * model the order is fixed: batching first (its batched server's phases are
 * what efficiency and curve start from), then efficiency, bucketing, curve,
 * scheduling, defaults, peer, instances (the first model only).
 */
import { runBatching } from './batching.js';
import { runBucketing } from './bucketing.js';
import type { SuiteContext } from './context.js';
import { runCurves } from './curve.js';
import { runEfficiency } from './efficiency.js';
import { runInstances } from './instances.js';
import { runDefaults } from './defaults.js';
import { runPeer } from './peer.js';
import { runScheduling } from './scheduling.js';

export async function runModelCases(ctx: SuiteContext): Promise<void> {
  for (const [i, m] of ctx.models.entries()) {
    const first = i === 0;
    const batchedHttp = await runBatching(ctx, m, first);
    await runEfficiency(ctx, m, first, batchedHttp);
    await runBucketing(ctx, m, first);
    await runCurves(ctx, m, first, batchedHttp);
    await runScheduling(ctx, m, first);
    await runDefaults(ctx, m, first);
    await runPeer(ctx, m, first);
    await runInstances(ctx, m, first);
  }
}
