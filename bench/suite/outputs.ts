/**
 * outputs: what the outputs beyond the pooled row cost, on one server of
 * generated models, each route's req/s against its model's pooled row under
 * the same HTTP closed loop (BGE-M3's sparse, colbert and all three from one
 * pass; token states; SPLADE's sparse route; a ColBERT model's query and
 * document vectors), and late chunking: one 512-token text cut into 8 chunks
 * sent with `chunks` (the text runs once) against the 8 chunk texts as inputs.
 * The models have random weights: the cosines say how much the context moves
 * a chunk's row on such a model, not on a trained one.
 */
import { loadTokenizer } from '../../src/core/tokenizer/tokenizer.js';
import type { Workload } from '../workloads.js';
import type { SuiteContext } from './context.js';
import { closedLoopMeta, median } from './phases.js';
import { benchModels } from './setup.js';
import { startSlabserve } from './targets.js';

const MODELS = ['tiny-embed', 'tiny-m3', 'tiny-splade', 'tiny-colbert'];
const CLIENTS = 32;

/** Each route against the route at `base`: a model, a path, and the body's fields beside `model` and `inputs`. */
const ROUTES: { name: string; model: string; path: string; fields?: object; base: number }[] = [
  { name: 'tiny-m3 /embed (dense)', model: 'tiny-m3', path: '/embed', base: 0 },
  { name: 'tiny-m3 outputs [sparse]', model: 'tiny-m3', path: '/embed', fields: { outputs: ['sparse'] }, base: 0 },
  { name: 'tiny-m3 outputs [colbert]', model: 'tiny-m3', path: '/embed', fields: { outputs: ['colbert'] }, base: 0 },
  { name: 'tiny-m3 outputs [dense, sparse, colbert]', model: 'tiny-m3', path: '/embed', fields: { outputs: ['dense', 'sparse', 'colbert'] }, base: 0 },
  { name: 'tiny-embed /embed', model: 'tiny-embed', path: '/embed', base: 4 },
  { name: 'tiny-embed /embed_all (token states)', model: 'tiny-embed', path: '/embed_all', base: 4 },
  { name: 'tiny-splade /embed (30522-wide row)', model: 'tiny-splade', path: '/embed', base: 6 },
  { name: 'tiny-splade /embed_sparse', model: 'tiny-splade', path: '/embed_sparse', base: 6 },
  { name: 'tiny-colbert /embed_all document', model: 'tiny-colbert', path: '/embed_all', fields: { input_type: 'document' }, base: 4 },
  { name: 'tiny-colbert /embed_all query (32 tokens)', model: 'tiny-colbert', path: '/embed_all', fields: { input_type: 'query' }, base: 4 },
];

const body = (o: object) => Buffer.from(JSON.stringify(o));

/** About `tokens` tokens of `tokenizerPath`'s, cut into 8 pieces at word boundaries, with their [start, end) in code points. */
async function longText(tokenizerPath: string, tokens: number): Promise<{ text: string; chunks: [number, number][]; pieces: string[] }> {
  const tok = await loadTokenizer(tokenizerPath);
  const vocab = 'the order arrived late and the parcel was damaged so i asked for a refund but the support team said the payment would take ten days to return to my account'.split(' ');
  const words: string[] = [];
  for (let i = 0; tok.encode(words.join(' '), { maxLength: 100_000, truncate: false }).ids.length < tokens - 1; i++) words.push(vocab[(i * 7) % vocab.length]!);
  words.pop();
  const per = Math.ceil(words.length / 8);
  const pieces = Array.from({ length: 8 }, (_, k) => words.slice(k * per, (k + 1) * per).join(' ')).filter((p) => p.length > 0);
  let at = 0;
  const chunks = pieces.map((p): [number, number] => [at, (at += p.length + 1) - 1]);
  return { text: pieces.join(' '), chunks, pieces };
}

const cosine = (a: number[], b: number[]) => {
  let [ab, aa, bb] = [0, 0, 0];
  for (let k = 0; k < a.length; k++) [ab, aa, bb] = [ab + a[k]! * b[k]!, aa + a[k]! * a[k]!, bb + b[k]! * b[k]!];
  return ab / Math.sqrt(aa * bb);
};

export async function runOutputs(ctx: SuiteContext): Promise<void> {
  if (!ctx.options.cases.has('outputs')) return;
  const m = ctx.models[0]!;
  const short = m.workloads.get('short')!;
  const t = await startSlabserve('slabserve', ctx.options.device, benchModels(ctx.options, MODELS), MODELS.join(','), []);
  const closed = (clients: number) => ({ kind: 'closed', concurrency: clients }) as const;
  try {
    const ws: Workload[] = ROUTES.map((r) => ({ ...short, name: r.name, path: r.path, bodies: short.requests.map((q) => body({ model: r.model, inputs: q[0]!.text, ...r.fields })) }));
    const bytes = await Promise.all(ws.map(async (w) => (await fetch(`${t.origin}${w.path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: w.bodies[0] })).arrayBuffer()));
    ctx.note('outputs', `answer bytes per input (JSON): ${ROUTES.map((r, i) => `${r.name} ${bytes[i]!.byteLength}`).join('; ')}`);
    const res = await ctx.ab((s, k) => ctx.load(closedLoopMeta('outputs', ROUTES[s]!.model, 'short', ROUTES[s]!.name, 'http', k, CLIENTS), t, ws[s]!, closed(CLIENTS)), ROUTES.length);
    for (const [i, r] of ROUTES.entries()) {
      if (r.base === i) continue;
      const c = { id: `outputs/${r.name}`, case: 'outputs', question: 'What does an output cost in req/s?', model: r.model, workload: 'short', transport: 'http', metric: 'rps' } as const;
      ctx.compare(c, { label: r.name, phases: res[i]! }, { label: ROUTES[r.base]!.name, phases: res[r.base]! });
    }
    await lateChunking(ctx, t);
  } finally {
    await t.stop();
  }
}

/** `chunks` against the chunk texts: one client's latency, and 8 clients' chunk rows/s (inputs/s). */
async function lateChunking(ctx: SuiteContext, t: Awaited<ReturnType<typeof startSlabserve>>): Promise<void> {
  const { text, chunks, pieces } = await longText(ctx.models[0]!.spec.tokenizerPath, 512);
  const late = { model: 'tiny-embed', inputs: text, chunks };
  const apart = { model: 'tiny-embed', inputs: pieces };
  const [a, b] = await Promise.all([late, apart].map(async (x) => (await (await fetch(`${t.origin}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(x) })).json()) as number[][]));
  const cosines = a!.map((row, k) => cosine(row, b![k]!));
  const rows = pieces.map((p) => ({ text: p, ids: new Int32Array(0), typeIds: new Int32Array(0) }));
  const sides = [late, apart].map((x): Workload => ({ name: 'late chunking', description: '', requests: [rows], bodies: [body(x)], form: 'text' }));
  const labels = ['`chunks` (the text once)', 'the 8 chunk texts'];
  for (const [clients, metric] of [[1, 'p50'], [8, 'inputsPerS']] as const) {
    const res = await ctx.ab((s, k) => ctx.load(closedLoopMeta('outputs', 'tiny-embed', 'late chunking', labels[s]!, 'http', k, clients), t, sides[s]!, { kind: 'closed', concurrency: clients }), 2);
    const c = { id: `outputs/late-chunking/${metric}`, case: 'outputs', question: metric === 'p50' ? 'Late chunking: one request on an idle server' : 'Late chunking: chunk rows/s under 8 clients', model: 'tiny-embed', workload: 'late chunking', transport: 'http', metric } as const;
    ctx.compare(c, { label: labels[0]!, phases: res[0]! }, { label: labels[1]!, phases: res[1]! });
  }
  const cos = [Math.min(...cosines), median(cosines), Math.max(...cosines)].map((x) => x.toFixed(3));
  ctx.note('outputs', `late chunking, ${chunks.length} chunks of ${pieces.map((p) => p.split(' ').length).join('/')} words: cosine between a chunk's late row and its text embedded alone min ${cos[0]}, median ${cos[1]}, max ${cos[2]}; tokens run per request ~512 against ~${pieces.length * 2 + 510}`);
}
