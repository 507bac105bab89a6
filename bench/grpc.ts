/**
 * Where gRPC belongs (docs/grpc.md): on the uWebSockets.js gateway threads
 * beside HTTP (`--grpc-threads 0`, the default) or on threads of its own
 * (`--grpc-threads 1`): one gateway thread serving both (the default on 2
 * cores), two serving both, one for each. Per
 * placement, in alternating rounds: HTTP alone (wrk), gRPC alone (Python
 * grpcio, bench/grpc-load.py), and both at once; req/s, P99, and the server's
 * CPU per request from /proc. Texts are distinct and the result cache off, so
 * every request runs on the device.
 *
 *   node dist/bench/grpc.js [--rounds 3] [--seconds 5] [--connections 32]
 */
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseOptions } from './args.js';
import { describeMachine, machineLine } from './machine.js';
import { startServerProcess, type ServerProcess } from './server-process.js';

const SPEC = {
  rounds: { type: 'int', min: 1, default: 3, help: 'alternating rounds per placement' },
  seconds: { type: 'int', min: 1, default: 5, help: 'length of each load window' },
  connections: { type: 'int', min: 1, default: 32, help: 'connections of each load generator' },
} as const;

const root = fileURLToPath(new URL('../..', import.meta.url));
const CLI = join(root, 'dist/src/cli.js');
const TEI_PROTO = join(root, 'proto/tei.proto');
const LOAD = join(root, 'bench/grpc-load.py');
const PYTHON = '/usr/bin/python3';

/** wrk's Lua: every request a distinct text. */
const WRK_SCRIPT = `counter = 0
request = function()
  counter = counter + 1
  local body = '{"inputs":"http request ' .. counter .. ' of thread ' .. tostring(wrk.thread) .. ' in the bench"}'
  return wrk.format("POST", "/embed", {["Content-Type"] = "application/json"}, body)
end
`;

interface Load {
  requests: number;
  seconds: number;
  p99Ms: number;
}

function run(cmd: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`${cmd} exited ${code}: ${err.slice(-500)}`))));
  });
}

async function wrk(origin: string, seconds: number, connections: number, script: string): Promise<Load> {
  const out = await run('wrk', ['-t2', `-c${connections}`, `-d${seconds}s`, '--latency', '-s', script, origin]);
  const ms = (v: string, unit: string) => Number(v) * (unit === 'us' ? 1e-3 : unit === 's' ? 1e3 : 1);
  const p99 = /99%\s+([\d.]+)(us|ms|s)/.exec(out);
  const total = /(\d+) requests in ([\d.]+)s/.exec(out);
  if (!p99 || !total) throw new Error(`cannot read wrk's output:\n${out}`);
  return { requests: Number(total[1]), seconds: Number(total[2]), p99Ms: ms(p99[1]!, p99[2]!) };
}

async function grpcLoad(port: number, seconds: number, connections: number): Promise<Load> {
  const r = JSON.parse(await run(PYTHON, [LOAD, `127.0.0.1:${port}`, String(seconds), String(connections), TEI_PROTO])) as { requests: number; errors: number; seconds: number; p99_ms: number };
  if (r.errors > 0) throw new Error(`${r.errors} gRPC calls failed`);
  return { requests: r.requests, seconds: r.seconds, p99Ms: r.p99_ms };
}

interface Row {
  placement: string;
  load: string;
  httpRps: number;
  httpP99: number;
  grpcRps: number;
  grpcP99: number;
  cpuUsPerReq: number;
}

async function measure(server: ServerProcess, grpcPort: number, load: 'http' | 'grpc' | 'both', o: { seconds: number; connections: number; script: string }): Promise<Omit<Row, 'placement'>> {
  const cpu0 = server.cpuMs()!;
  const [h, g] = await Promise.all([
    load !== 'grpc' ? wrk(server.origin, o.seconds, o.connections, o.script) : null,
    load !== 'http' ? grpcLoad(grpcPort, o.seconds, o.connections) : null,
  ]);
  const cpuMs = server.cpuMs()! - cpu0;
  const reqs = (h?.requests ?? 0) + (g?.requests ?? 0);
  return {
    load,
    httpRps: h ? h.requests / h.seconds : 0,
    httpP99: h?.p99Ms ?? 0,
    grpcRps: g ? g.requests / g.seconds : 0,
    grpcP99: g?.p99Ms ?? 0,
    cpuUsPerReq: (cpuMs * 1000) / reqs,
  };
}

async function main(): Promise<void> {
  const o = parseOptions('node dist/bench/grpc.js [options]', SPEC);
  const script = join(tmpdir(), 'slabserve-grpc-bench.lua');
  writeFileSync(script, WRK_SCRIPT);
  const placements = [
    { name: 'on the 1 gateway thread', args: ['--gateway-threads', '1', '--grpc-threads', '0'] },
    { name: 'on the 2 gateway threads', args: ['--gateway-threads', '2', '--grpc-threads', '0'] },
    { name: '1 gateway + 1 gRPC thread', args: ['--gateway-threads', '1', '--grpc-threads', '1'] },
  ];
  console.log(machineLine(describeMachine()));
  const rows: Row[] = [];
  for (let round = 0; round < o.rounds; round++) {
    for (const p of round % 2 === 0 ? placements : [...placements].reverse()) {
      const grpcPort = 18500 + round * placements.length + placements.indexOf(p);
      const server = await startServerProcess({ cliPath: CLI, args: ['--host', '127.0.0.1', '--port', '0', '--grpc-port', String(grpcPort), '--model', 'tiny-embed', '--device', 'cpu', ...p.args] });
      try {
        await measure(server, grpcPort, 'both', { ...o, seconds: 1, script }); // warm both paths
        for (const load of ['http', 'grpc', 'both'] as const) {
          const r = { placement: p.name, ...(await measure(server, grpcPort, load, { ...o, script })) };
          rows.push(r);
          console.log(`round ${round + 1} ${p.name}, ${load}: HTTP ${r.httpRps.toFixed(0)} req/s P99 ${r.httpP99.toFixed(1)} ms, gRPC ${r.grpcRps.toFixed(0)} req/s P99 ${r.grpcP99.toFixed(1)} ms, server ${r.cpuUsPerReq.toFixed(0)} us CPU/request`);
        }
      } finally {
        await server.stop();
      }
    }
  }
  const median = (v: number[]) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!;
  console.log(`\n| placement | load | HTTP req/s | HTTP P99 ms | gRPC req/s | gRPC P99 ms | server CPU us/request |\n|---|---|---:|---:|---:|---:|---:|`);
  for (const p of placements) {
    for (const load of ['http', 'grpc', 'both']) {
      const rs = rows.filter((r) => r.placement === p.name && r.load === load);
      const m = (k: keyof Row) => median(rs.map((r) => r[k] as number));
      console.log(`| ${p.name} | ${load} | ${m('httpRps').toFixed(0)} | ${m('httpP99').toFixed(1)} | ${m('grpcRps').toFixed(0)} | ${m('grpcP99').toFixed(1)} | ${m('cpuUsPerReq').toFixed(0)} |`);
    }
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
