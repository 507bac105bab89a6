/**
 * peer: slabserve against the same model behind a small
 * @huggingface/transformers pipeline server (bench/peer-transformers.ts), one
 * request at a time per call: throughput at 64 and 16 clients and, for the
 * first model, at 4 and 1 too, with the server CPU per request at 16, 4 and 1
 * and a lone client's P50 and P99. Their vectors are compared first.
 */
import { join } from 'node:path';
import type { SuiteContext } from './context.js';
import type { ModelSetup } from './setup.js';
import { largestVectorDiff, startPeer } from './targets.js';

/** Closed-loop clients: throughput at each; at the light loads also the CPU each request costs, and a lone client's latency. */
const PEER_CLIENTS = [64, 16, 4, 1];
/** The other models: the heavy loads only. */
const PEER_CLIENTS_OTHERS = [64, 16];

type Question = { metric: 'rps' | 'p50' | 'p99' | 'cpuUsPerRequest'; question: string };

/** What each client count asks of slabserve against the peer (the targets it is held to). */
function questionsAt(clients: number): Question[] {
  const cpu: Question = { metric: 'cpuUsPerRequest', question: 'Server CPU per request against transformers.js (light load)' };
  if (clients === 1) {
    return [
      { metric: 'rps', question: 'Throughput of a lone client against transformers.js' },
      { metric: 'p50', question: 'Latency of a lone client against transformers.js (P50)' },
      { metric: 'p99', question: 'Latency of a lone client against transformers.js (P99)' },
      cpu,
    ];
  }
  return [{ metric: 'rps', question: 'Throughput against transformers.js pipelines' }, ...(clients <= 16 ? [cpu] : [])];
}

export async function runPeer(ctx: SuiteContext, m: ModelSetup, first: boolean): Promise<void> {
  if (!ctx.options.cases.has('peer')) return;
  const short = m.workloads.get('short')!;
  const peer = await startPeer(join(m.dir, m.name));
  const ours = await ctx.startSlabserve('slabserve batched', m, []);
  try {
    const diff = await largestVectorDiff(peer.origin, ours.origin, short.requests.slice(0, 4).map((q) => q[0]!.text));
    ctx.progress.log(`${m.name}: transformers.js vectors equal slabserve's within ${diff.toExponential(1)}`);
    for (const clients of first ? PEER_CLIENTS : PEER_CLIENTS_OTHERS) {
      const res = await ctx.closedRounds('peer', m.name, [ours, peer], 'http', short, clients);
      for (const q of questionsAt(clients)) {
        ctx.compare(
          {
            id: `peer/${m.name}/${clients}/${q.metric}`,
            case: 'peer',
            question: q.question,
            model: m.name,
            workload: 'short',
            transport: 'http',
            metric: q.metric,
            note: `${clients} client${clients > 1 ? 's' : ''}; vectors equal within ${diff.toExponential(1)}`,
          },
          { label: 'slabserve', phases: res[0]! },
          { label: 'transformers.js', phases: res[1]! },
        );
      }
    }
  } finally {
    await ours.stop();
    await peer.stop();
  }
}
