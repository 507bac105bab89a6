/**
 * peer: slabserve against the same model behind a small
 * @huggingface/transformers pipeline server (bench/peer-transformers.ts), one
 * request at a time per call: throughput at 16 clients and, for the first
 * model, a lone client's P50. Their vectors are compared first.
 */
import { join } from 'node:path';
import type { SuiteContext } from './context.js';
import type { ModelSetup } from './setup.js';
import { largestVectorDiff, startPeer } from './targets.js';

const PEER_CLIENTS = 16;

export async function runPeer(ctx: SuiteContext, m: ModelSetup, first: boolean): Promise<void> {
  if (!ctx.options.cases.has('peer')) return;
  const short = m.workloads.get('short')!;
  const peer = await startPeer(join(m.dir, m.name));
  const ours = await ctx.startSlabserve('slabserve batched', m, []);
  try {
    const diff = await largestVectorDiff(peer.origin, ours.origin, short.requests.slice(0, 4).map((q) => q[0]!.text));
    ctx.progress.log(`${m.name}: transformers.js vectors equal slabserve's within ${diff.toExponential(1)}`);
    for (const clients of first ? [PEER_CLIENTS, 1] : [PEER_CLIENTS]) {
      const res = await ctx.closedRounds('peer', m.name, [ours, peer], 'http', short, clients);
      ctx.compare(
        {
          id: `peer/${m.name}/${clients}`,
          case: 'peer',
          question: clients === 1 ? 'Latency of a lone client against transformers.js (P50)' : 'Throughput against transformers.js pipelines',
          model: m.name,
          workload: 'short',
          transport: 'http',
          metric: clients === 1 ? 'p50' : 'rps',
          note: `${clients} client${clients > 1 ? 's' : ''}; vectors equal within ${diff.toExponential(1)}`,
        },
        { label: 'slabserve', phases: res[0]! },
        { label: 'transformers.js', phases: res[1]! },
        (p) => (clients === 1 ? p.latencyMs.p50 : p.rps),
      );
    }
  } finally {
    await ours.stop();
    await peer.stop();
  }
}
