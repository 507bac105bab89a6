/**
 * grpc: gRPC beside the other transports on one server, in alternating
 * rounds: HTTP (wrk), WebSocket (one socket, 64 in flight), gRPC unary (a
 * channel per caller) and gRPC streaming (one stream, 64 in flight) of TEI's
 * tei.v1.Embed. The gRPC load is @grpc/grpc-js in this process, messages
 * written by hand (one string field): no protobuf library's cost in the
 * client's CPU.
 */
import { credentials, Client } from '@grpc/grpc-js';
import { runClosedLoop } from '../closed-loop.js';
import type { PhaseResult } from '../suite-results.js';
import type { Workload } from '../workloads.js';
import { CLIENTS, type SuiteContext } from './context.js';
import { closedLoopMeta, phaseFromLoad, type PhaseMeta } from './phases.js';
import type { Target } from './targets.js';

/** tei.v1.EmbedRequest with `inputs` (field 1) set. */
function embedRequest(text: string): Buffer {
  const bytes = Buffer.from(text);
  const len: number[] = [];
  for (let n = bytes.length; ; n >>>= 7) {
    if (n < 128) {
      len.push(n);
      break;
    }
    len.push((n & 127) | 128);
  }
  return Buffer.concat([Buffer.from([0x0a, ...len]), bytes]);
}

const same = (b: Buffer) => b;

/** `clients` callers: each its own channel (unary), or all on one stream (answers come in order). */
function grpcCaller(port: number, clients: number, kind: 'unary' | 'stream') {
  const client = () => new Client(`127.0.0.1:${port}`, credentials.createInsecure(), { 'grpc.use_local_subchannel_pool': 1 });
  if (kind === 'unary') {
    const channels = Array.from({ length: clients }, client);
    let rr = 0;
    const call = (text: string) =>
      new Promise<void>((res, rej) => channels[rr++ % clients]!.makeUnaryRequest('/tei.v1.Embed/Embed', same, same, embedRequest(text), (err) => (err ? rej(err) : res())));
    return { call, close: () => channels.forEach((c) => c.close()) };
  }
  const one = client();
  const stream = one.makeBidiStreamRequest('/tei.v1.Embed/EmbedStream', same, same);
  const waiting: { res: () => void; rej: (e: Error) => void }[] = [];
  stream.on('data', () => waiting.shift()?.res());
  stream.on('error', (e: Error) => waiting.splice(0).forEach((w) => w.rej(e)));
  const call = (text: string) => new Promise<void>((res, rej) => waiting.push({ res, rej }) && stream.write(embedRequest(text)));
  return { call, close: () => (stream.end(), one.close()) };
}

/** One closed loop of gRPC calls on `w`'s texts, the server's CPU over its window. */
async function grpcPhase(ctx: SuiteContext, meta: PhaseMeta, target: Target & { server: { grpcPort: number | null } }, w: Workload, kind: 'unary' | 'stream'): Promise<PhaseResult> {
  const caller = grpcCaller(target.server.grpcPort!, CLIENTS, kind);
  const text = (n: number) => w.requests[n % w.requests.length]![0]!.text;
  let tokens = 0;
  try {
    const { warmupMs, durationMs } = ctx.options;
    const loop = await runClosedLoop({ clients: CLIENTS, warmupMs, durationMs, call: (n) => caller.call(text(n)), counted: (n) => (tokens += w.requests[n % w.requests.length]![0]!.ids.length), snapshot: () => target.cpuMs() });
    const { before, after, firstError, ...counts } = loop;
    const serverCpuMs = before !== null && after !== null ? after - before : null;
    const o = { ...counts, ...(firstError ? { firstError } : {}), generator: 'node' as const, inputs: loop.requests, tokens, rejected: 0, clientCpuMs: loop.cpuMs, serverCpuMs, countersMs: loop.windowMs };
    return ctx.record(phaseFromLoad(meta, o));
  } finally {
    caller.close();
  }
}

export async function runGrpc(ctx: SuiteContext): Promise<void> {
  if (!ctx.options.cases.has('grpc')) return;
  const m = ctx.models[0]!;
  const w = m.workloads.get('short')!;
  const server = await ctx.startSlabserve('slabserve', m, []);
  const closed = { kind: 'closed', concurrency: CLIENTS } as const;
  const sides = [
    { label: 'HTTP', transport: 'http', run: (meta: PhaseMeta) => ctx.load(meta, server, w, closed) },
    { label: 'WebSocket', transport: 'ws', run: (meta: PhaseMeta) => ctx.load(meta, server, w, closed) },
    { label: 'gRPC unary', transport: 'grpc', run: (meta: PhaseMeta) => grpcPhase(ctx, meta, server, w, 'unary') },
    { label: 'gRPC stream', transport: 'grpc', run: (meta: PhaseMeta) => grpcPhase(ctx, meta, server, w, 'stream') },
  ] as const;
  try {
    const res = await ctx.ab((s, k) => sides[s]!.run(closedLoopMeta('grpc', m.name, w.name, sides[s]!.label, sides[s]!.transport, k, CLIENTS)), sides.length);
    for (const s of [1, 2, 3]) {
      const c = { id: `grpc/${m.name}/${sides[s]!.label}`, case: 'grpc', question: 'gRPC and WebSocket against HTTP, req/s', model: m.name, workload: w.name, transport: sides[s]!.transport, metric: 'rps' } as const;
      ctx.compare(c, { label: sides[s]!.label, phases: res[s]! }, { label: 'HTTP', phases: res[0]! });
    }
  } finally {
    await server.stop();
  }
}
