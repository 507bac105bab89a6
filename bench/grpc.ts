/**
 * gRPC against the other transports (docs/grpc.md has the method and the
 * results), in alternating rounds: `--mode transports`, one server under HTTP
 * (wrk), WebSocket, gRPC unary and gRPC streaming loads one after another;
 * `--mode placements`, gRPC on the gateway thread, on two that serve both, or on
 * a thread of its own, under HTTP, gRPC and both at once. Texts are distinct and
 * the result cache off, so every request runs on the device.
 *
 *   node dist/bench/grpc.js [--mode transports|placements] [--rounds 3] [--seconds 5] [--connections 64]
 */
import { rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseOptions } from './args.js';
import { runLoad } from './load.js';
import { machineLine } from './machine.js';
import { startServerProcess, type ServerProcess } from './server-process.js';
import { median, roundOrder } from './suite/phases.js';
import type { Workload } from './workloads.js';
import { postScript, run, wrk, type Load } from './wrk.js';

const SPEC = {
  mode: { type: 'string', default: 'transports', choices: ['transports', 'placements'], help: 'what to compare' },
  rounds: { type: 'int', min: 1, default: 3, help: 'alternating rounds' },
  seconds: { type: 'int', min: 1, default: 5, help: 'length of each load window' },
  connections: { type: 'int', min: 1, default: 64, help: 'connections (or messages in flight) of each load' },
} as const;

const root = fileURLToPath(new URL('../..', import.meta.url));
const CLI = join(root, 'dist/src/cli.js');
const TEI_PROTO = join(root, 'proto/tei.proto');
const LOAD = join(root, 'bench/grpc-load.py');
const PYTHON = '/usr/bin/python3';
const MODEL = 'tiny-embed';

/** wrk's Lua: every request a distinct text. */
const WRK_SCRIPT = postScript('/embed', `'{"inputs":"http request ' .. counter .. ' of thread ' .. tostring(wrk.thread) .. ' in the bench"}'`);

async function grpcLoad(port: number, seconds: number, connections: number, mode: 'unary' | 'stream'): Promise<Load> {
  const r = JSON.parse(await run(PYTHON, [LOAD, `127.0.0.1:${port}`, String(seconds), String(connections), TEI_PROTO, mode])) as { requests: number; errors: number; seconds: number; p99_ms: number; cpu_s: number };
  if (r.errors > 0) throw new Error(`${r.errors} gRPC calls failed`);
  return { requests: r.requests, seconds: r.seconds, p99Ms: r.p99_ms, clientCpuMs: r.cpu_s * 1000 };
}

/** The WebSocket load's texts, distinct as the others' (made once: the loop takes request i of them). */
let wsTexts: Workload | undefined;
const wsWorkload = () =>
  (wsTexts ??= {
    name: 'short',
    description: 'distinct short texts',
    requests: Array.from({ length: 200_000 }, (_, i) => [{ text: `ws request number ${i} of the bench`, ids: [], typeIds: [] }]),
    bodies: [],
    form: 'text',
  } as unknown as Workload);

/** `depth` requests in flight on one socket, each a distinct text (bench/load.ts's thin WebSocket client). */
async function wsLoad(server: ServerProcess, seconds: number, depth: number): Promise<Load> {
  const o = await runLoad({ target: server, model: MODEL, transport: 'ws', workload: wsWorkload(), arrivals: { kind: 'closed', concurrency: depth }, ws: { sockets: 1, depth }, warmupMs: 500, durationMs: seconds * 1000 }, Math.random);
  try {
    if (o.errors > 0) throw new Error(`${o.errors} WebSocket requests failed: ${o.firstError}`);
    return { requests: o.requests, seconds: o.windowMs / 1000, p99Ms: o.histogram.getValueAtPercentile(99) / 1000, clientCpuMs: o.clientCpuMs };
  } finally {
    o.histogram.destroy();
  }
}


/** A load's figures with the server's CPU over it. */
async function measured(server: ServerProcess, load: () => Promise<Load>) {
  const cpu0 = server.cpuMs()!;
  const l = await load();
  const serverCpuMs = server.cpuMs()! - cpu0;
  return { ...l, rps: l.requests / l.seconds, serverUs: (serverCpuMs * 1000) / l.requests, clientUs: (l.clientCpuMs * 1000) / l.requests };
}

async function transports(o: { rounds: number; seconds: number; connections: number }, script: string): Promise<void> {
  const grpcPort = 18400 + Math.floor(Math.random() * 90);
  const server = await startServerProcess({ cliPath: CLI, args: ['--host', '127.0.0.1', '--port', '0', '--grpc-port', String(grpcPort), '--model', MODEL, '--device', 'cpu'] });
  const c = o.connections;
  const loads = [
    { name: `HTTP (wrk, ${c} connections)`, load: (s: number) => wrk(server.origin, s, c, script) },
    { name: `WebSocket (${c} in flight on 1 socket)`, load: (s: number) => wsLoad(server, s, c) },
    { name: `gRPC unary (${c} channels)`, load: (s: number) => grpcLoad(grpcPort, s, c, 'unary') },
    { name: `gRPC stream (${c} in flight on 1 stream)`, load: (s: number) => grpcLoad(grpcPort, s, c, 'stream') },
  ];
  const rows: { name: string; rps: number; p99Ms: number; serverUs: number; clientUs: number }[] = [];
  try {
    for (const l of loads) await l.load(1); // warm every path
    for (let round = 0; round < o.rounds; round++) {
      for (const l of roundOrder(round + 1, loads.length).map((i) => loads[i]!)) {
        const r = { name: l.name, ...(await measured(server, () => l.load(o.seconds))) };
        rows.push(r);
        console.log(`round ${round + 1} ${l.name}: ${r.rps.toFixed(0)} req/s, P99 ${r.p99Ms.toFixed(1)} ms, server ${r.serverUs.toFixed(0)} us CPU/request, client ${r.clientUs.toFixed(0)} us`);
      }
    }
  } finally {
    await server.stop();
  }
  const http = median(rows.filter((r) => r.name === loads[0]!.name).map((r) => r.rps));
  console.log(`\n| transport | req/s | vs HTTP | P99 ms | server CPU us/request | client CPU us/request |\n|---|---:|---:|---:|---:|---:|`);
  for (const l of loads) {
    const rs = rows.filter((r) => r.name === l.name);
    const m = (k: 'rps' | 'p99Ms' | 'serverUs' | 'clientUs') => median(rs.map((r) => r[k]));
    console.log(`| ${l.name} | ${m('rps').toFixed(0)} | ${(m('rps') / http).toFixed(2)}x | ${m('p99Ms').toFixed(1)} | ${m('serverUs').toFixed(0)} | ${m('clientUs').toFixed(0)} |`);
  }
}

async function placements(o: { rounds: number; seconds: number; connections: number }, script: string): Promise<void> {
  const where = [
    { name: 'on the 1 gateway thread', args: ['--gateway-threads', '1', '--grpc-threads', '0'] },
    { name: 'on the 2 gateway threads', args: ['--gateway-threads', '2', '--grpc-threads', '0'] },
    { name: '1 gateway + 1 gRPC thread', args: ['--gateway-threads', '1', '--grpc-threads', '1'] },
  ];
  const rows: { placement: string; load: string; httpRps: number; httpP99: number; grpcRps: number; grpcP99: number; serverUs: number }[] = [];
  for (let round = 0; round < o.rounds; round++) {
    for (const p of roundOrder(round + 1, where.length).map((i) => where[i]!)) {
      const grpcPort = 18500 + round * where.length + where.indexOf(p);
      const server = await startServerProcess({ cliPath: CLI, args: ['--host', '127.0.0.1', '--port', '0', '--grpc-port', String(grpcPort), '--model', MODEL, '--device', 'cpu', ...p.args] });
      const both = (load: string, seconds: number) =>
        Promise.all([load !== 'grpc' ? wrk(server.origin, seconds, o.connections, script) : null, load !== 'http' ? grpcLoad(grpcPort, seconds, o.connections, 'unary') : null]);
      try {
        await both('both', 1); // warm both paths
        for (const load of ['http', 'grpc', 'both']) {
          const cpu0 = server.cpuMs()!;
          const [h, g] = await both(load, o.seconds);
          const reqs = (h?.requests ?? 0) + (g?.requests ?? 0);
          const r = { placement: p.name, load, httpRps: h ? h.requests / h.seconds : 0, httpP99: h?.p99Ms ?? 0, grpcRps: g ? g.requests / g.seconds : 0, grpcP99: g?.p99Ms ?? 0, serverUs: ((server.cpuMs()! - cpu0) * 1000) / reqs };
          rows.push(r);
          console.log(`round ${round + 1} ${p.name}, ${load}: HTTP ${r.httpRps.toFixed(0)} req/s P99 ${r.httpP99.toFixed(1)} ms, gRPC ${r.grpcRps.toFixed(0)} req/s P99 ${r.grpcP99.toFixed(1)} ms, server ${r.serverUs.toFixed(0)} us CPU/request`);
        }
      } finally {
        await server.stop();
      }
    }
  }
  console.log(`\n| placement | load | HTTP req/s | HTTP P99 ms | gRPC req/s | gRPC P99 ms | server CPU us/request |\n|---|---|---:|---:|---:|---:|---:|`);
  for (const p of where) {
    for (const load of ['http', 'grpc', 'both']) {
      const rs = rows.filter((r) => r.placement === p.name && r.load === load);
      const m = (k: 'httpRps' | 'httpP99' | 'grpcRps' | 'grpcP99' | 'serverUs') => median(rs.map((r) => r[k]));
      console.log(`| ${p.name} | ${load} | ${m('httpRps').toFixed(0)} | ${m('httpP99').toFixed(1)} | ${m('grpcRps').toFixed(0)} | ${m('grpcP99').toFixed(1)} | ${m('serverUs').toFixed(0)} |`);
    }
  }
}

async function main(): Promise<void> {
  const o = parseOptions('node dist/bench/grpc.js [options]', SPEC);
  const script = join(tmpdir(), 'slabserve-grpc-bench.lua');
  writeFileSync(script, WRK_SCRIPT);
  console.log(machineLine());
  try {
    if (o.mode === 'placements') await placements(o, script);
    else await transports(o, script);
  } finally {
    rmSync(script, { force: true });
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
