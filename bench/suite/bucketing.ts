/**
 * bucketing: what length buckets buy on mixed lengths (8-512 tokens). The
 * default buckets padded to the bucket, against one FIFO queue with each batch
 * padded to its longest input (`--buckets <max length> --pad-to longest`), and
 * the buckets padded to their longest input; 64 clients each. First model only.
 */
import { CLIENTS, type SuiteContext } from './context.js';
import type { ModelSetup } from './setup.js';
import type { Target } from './targets.js';

export async function runBucketing(ctx: SuiteContext, m: ModelSetup, first: boolean): Promise<void> {
  if (!first || !ctx.options.cases.has('bucketing')) return;
  const configs: [string, string[]][] = [
    ['length buckets', ['--pad-to', 'bucket']],
    ['FIFO padded to longest', ['--buckets', String(m.spec.maxLength), '--pad-to', 'longest']],
    ['buckets + pad to longest', ['--pad-to', 'longest']],
  ];
  const targets: Target[] = [];
  try {
    for (const [label, extra] of configs) targets.push(await ctx.startSlabserve(label, m, extra));
    const res = await ctx.closedRounds('bucketing', m.name, targets, 'http', m.workloads.get('mixed')!, CLIENTS);
    const side = (i: number) => ({ label: configs[i]![0], phases: res[i]! });
    const q = { case: 'bucketing' as const, model: m.name, workload: 'mixed', transport: 'http' as const };
    ctx.compare({ ...q, id: `bucketing/${m.name}/tokens`, question: 'What do length buckets buy on mixed lengths?', metric: 'tokensPerS', note: `${CLIENTS} clients, 8-512 tokens` }, side(0), side(1));
    ctx.compare({ ...q, id: `bucketing/${m.name}/padding`, question: 'Padding efficiency (real / computed tokens)', metric: 'paddingEfficiency' }, side(0), side(1));
    ctx.compare({ ...q, id: `bucketing/${m.name}/longest`, question: 'Buckets padded to their longest input, against to the bucket', metric: 'tokensPerS' }, side(2), side(0));
  } finally {
    for (const t of targets) await t.stop();
  }
}
