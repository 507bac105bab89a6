/**
 * long-inputs: what chunking long inputs costs the short requests beside them
 * (docs/long-inputs.md). One server, the `short` workload's closed loop (wrk
 * over HTTP where installed) while a few clients send long texts (4 model
 * lengths) back to back, chunked (`long_inputs: "chunk"`: 5 windows each) or
 * truncated (`truncate: true`: one input each), in alternating rounds; and
 * with no long ones beside, for scale. The short requests' req/s and P99 are
 * compared; each side's long requests answered are noted. First model.
 */
import type { PhaseResult } from '../suite-results.js';
import { CLIENTS, type SuiteContext } from './context.js';
import { closedLoopMeta } from './phases.js';
import type { Input } from '../workloads.js';

/** Clients sending long texts beside the short loop. */
const LONG_CLIENTS = 2;
const SIDES = ['long ones chunked', 'long ones truncated', 'no long ones'] as const;

/** A text of `lengths` model lengths or a little more (its tokens counted from each piece's, special tokens left out), from the workload's own texts. */
function longText(inputs: Input[], maxLength: number, lengths: number): string {
  const out: string[] = [];
  for (let tokens = 0, i = 0; tokens < lengths * maxLength; i++) {
    const x = inputs[i % inputs.length]!;
    out.push(x.text);
    tokens += x.ids.length - 2;
  }
  return out.join(' ');
}

/** Long requests back to back from `clients` callers until stop(); resolves how many were answered 200, and how many not. */
function longLoop(origin: string, body: string, clients: number): { stop: () => Promise<{ ok: number; failed: number }> } {
  let running = true;
  const count = { ok: 0, failed: 0 };
  const loop = async () => {
    while (running) {
      const r = await fetch(`${origin}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body }).catch(() => null);
      if (r) await r.arrayBuffer();
      if (r?.status === 200) count.ok++;
      else count.failed++;
    }
  };
  const loops = Array.from({ length: clients }, loop);
  return {
    stop: async () => {
      running = false;
      await Promise.all(loops);
      return count;
    },
  };
}

export async function runLongInputs(ctx: SuiteContext): Promise<void> {
  if (!ctx.options.cases.has('long-inputs')) return;
  const m = ctx.models[0]!;
  const w = m.workloads.get('short')!;
  const text = longText(w.requests.flat(), m.spec.maxLength, 4);
  const bodies = [JSON.stringify({ inputs: text, long_inputs: 'chunk' }), JSON.stringify({ inputs: text, truncate: true }), null];
  const server = await ctx.startSlabserve('long inputs', m, ['--max-input-tokens', String(8 * m.spec.maxLength)]);
  try {
    const res = await ctx.ab(async (s, k) => {
      const body = bodies[s];
      const long = body ? longLoop(server.origin, body, LONG_CLIENTS) : null;
      let p: PhaseResult;
      try {
        p = await ctx.load(closedLoopMeta('long-inputs', m.name, w.name, SIDES[s]!, 'http', k, CLIENTS), server, w, { kind: 'closed', concurrency: CLIENTS });
      } finally {
        const n = await long?.stop();
        if (n) ctx.note('long-inputs', `round ${k}, ${SIDES[s]}: ${n.ok} long requests answered beside the short loop${n.failed ? `, ${n.failed} not` : ''}`);
      }
      return p;
    }, SIDES.length);
    const c = { case: 'long-inputs', question: 'What do long inputs chunked cost the short requests beside them?', model: m.name, workload: w.name, transport: 'http' } as const;
    const note = `${CLIENTS} short clients, ${LONG_CLIENTS} long clients (4 model lengths a text)`;
    for (const metric of ['rps', 'p99'] as const) {
      ctx.compare({ ...c, id: `long-inputs/${m.name}/${metric}`, metric, note }, { label: SIDES[0], phases: res[0]! }, { label: SIDES[1], phases: res[1]! });
      ctx.compare({ ...c, id: `long-inputs/${m.name}/${metric}/alone`, metric, note }, { label: SIDES[0], phases: res[0]! }, { label: SIDES[2], phases: res[2]! });
    }
  } finally {
    await server.stop();
  }
}
