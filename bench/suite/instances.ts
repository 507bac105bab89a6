/**
 * instances: what a model's instances (--model-instances, src/gpu-worker/model-instances.ts)
 * buy. The same server with its defaults (on CPU, one instance per core for a narrow model) and
 * with `--model-instances 1`, same load: 64, 16, 4 and 1 HTTP clients, req/s and the server's CPU
 * per request at each. The first model only (a wide model gets one instance by default).
 */
import type { SuiteContext } from './context.js';
import type { ModelSetup } from './setup.js';

export const INSTANCES_CLIENTS = [64, 16, 4, 1];

export async function runInstances(ctx: SuiteContext, m: ModelSetup, first: boolean): Promise<void> {
  if (!ctx.options.cases.has('instances') || !first) return;
  const short = m.workloads.get('short')!;
  const auto = await ctx.startSlabserve('instances auto', m, []);
  const one = await ctx.startSlabserve('model-instances 1', m, ['--model-instances', '1']);
  try {
    for (const clients of INSTANCES_CLIENTS) {
      const res = await ctx.closedRounds('instances', m.name, [auto, one], 'http', short, clients);
      for (const metric of ['rps', 'cpuUsPerRequest'] as const) {
        ctx.compare(
          {
            id: `instances/${m.name}/${clients}/${metric}`,
            case: 'instances',
            question: metric === 'rps' ? 'What do model instances buy?' : 'What do model instances cost in CPU per request?',
            model: m.name,
            workload: 'short',
            transport: 'http',
            metric,
            note: `${clients} client${clients > 1 ? 's' : ''}, closed loop`,
          },
          { label: 'instances auto', phases: res[0]! },
          { label: 'model-instances 1', phases: res[1]! },
        );
      }
    }
  } finally {
    await auto.stop();
    await one.stop();
  }
}
