/**
 * tracing: what tracing costs under load. The traced path alone first
 * (micro/tracing-path.ts), then servers with tracing off, a ratio sampler at
 * 0.1 and 1.0, and the default sampler fed unsampled and sampled traceparents,
 * the same HTTP closed loop (wrk) in alternating rounds. A sampled request's
 * extra cost is read from the gateway's and the inference thread's own CPU
 * counters: the whole process's moves with the batches each window formed.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { measureTracedPath } from '../micro/tracing-path.js';
import type { PhaseResult } from '../suite-results.js';
import { CLIENTS, type SuiteContext } from './context.js';
import { closedLoopMeta, median, round } from './phases.js';

/** An OTLP/HTTP receiver that reads each export and answers 200 at once; counts the bytes it got. */
async function receiver(): Promise<{ url: string; bytes: () => number; close: () => void }> {
  let bytes = 0;
  const server = createServer((req, res) => {
    req.on('data', (c: Buffer) => (bytes += c.length));
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, bytes: () => bytes, close: () => server.close() };
}

/** The gateway threads' and the inference thread's CPU per request, µs. */
const traced = (p: PhaseResult) => Object.entries(p.threadCpuUsPerRequest ?? {}).reduce((a, [t, us]) => (/^(gateway|inference)/.test(t) ? a + us : a), 0);

export async function runTracing(ctx: SuiteContext): Promise<void> {
  if (!ctx.options.cases.has('tracing')) return;
  const m = ctx.models[0]!;
  const path = await measureTracedPath(ctx.options.quick ? 20_000 : 100_000);
  ctx.note('tracing', `the traced path alone (micro/tracing-path.ts): ${path.cpuUs.toFixed(1)} µs of CPU per sampled request, ${path.spansPerRequest.toFixed(2)} spans and ${path.bytesPerRequest.toFixed(0)} bytes of protobuf each`);
  const rx = await receiver();
  const ratio = (arg: string) => ({ OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: arg });
  const off = await ctx.startSlabserve('tracing off', m, []);
  const on = await ctx.startSlabserve('tracing on', m, ['--otlp-endpoint', rx.url]);
  const tenth = await ctx.startSlabserve('ratio 0.1', m, ['--otlp-endpoint', rx.url], ratio('0.1'));
  const all = await ctx.startSlabserve('ratio 1.0', m, ['--otlp-endpoint', rx.url], ratio('1'));
  // traceparent: the share of requests that carry a sampled one (undefined: no header)
  const sides = [
    { label: 'tracing off', target: off, traceparent: 0 },
    { label: 'ratio 0.1', target: tenth, traceparent: undefined },
    { label: 'ratio 1.0', target: all, traceparent: undefined },
    { label: 'parents, none sampled', target: on, traceparent: 0 },
    { label: 'parents, all sampled', target: on, traceparent: 1 },
  ];
  const w = m.workloads.get('short')!;
  try {
    const res = await ctx.ab((s, k) => ctx.load(closedLoopMeta('tracing', m.name, w.name, sides[s]!.label, 'http', k, CLIENTS), sides[s]!.target, w, { kind: 'closed', concurrency: CLIENTS }, undefined, sides[s]!.traceparent), sides.length);
    const compare = (a: number, b: number) =>
      ctx.compare({ id: `tracing/${m.name}/${sides[a]!.label}`, case: 'tracing', question: 'What does tracing cost in req/s?', model: m.name, workload: w.name, transport: 'http', metric: 'rps' }, { label: sides[a]!.label, phases: res[a]! }, { label: sides[b]!.label, phases: res[b]! });
    for (const s of [1, 2, 3, 4]) compare(s, 0);
    // only where every request is sampled: a tenth of a difference this small is noise, divided by 0.1
    const extra = (a: number, b: number) => round(median(res[a]!.map(traced)) - median(res[b]!.map(traced)), 1);
    ctx.note('tracing', `a sampled request's extra CPU, gateway + inference threads: ${extra(2, 0)} µs (ratio 1.0 against off), ${extra(4, 3)} µs (sampled parents against unsampled)`);
    ctx.note('tracing', `the receiver got ${(rx.bytes() / 2 ** 20).toFixed(1)} MiB of spans`);
  } finally {
    await Promise.allSettled([off, on, tenth, all].map((t) => t.stop()));
    rx.close();
  }
}
