/**
 * What tracing costs (docs/tracing.md), in alternating rounds, medians: a
 * server with tracing off, and one with it on (the default sampler, which
 * follows the caller's parent) exporting over http/protobuf to a receiver in
 * this process that answers at once. The traced server is loaded three ways
 * by wrk's script: every request with an unsampled traceparent (flags 00),
 * one in ten sampled, every one sampled; so the CPU of a sampled request is
 * the difference between two loads of the same process, not of two processes.
 * 64 connections, distinct short texts; req/s, P99, the server's CPU per request.
 *
 *   node dist/bench/tracing.js [--rounds 3] [--seconds 5] [--connections 64]
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseOptions } from './args.js';
import { describeMachine, machineLine } from './machine.js';
import { startServerProcess } from './server-process.js';
import { median, postScript, wrk } from './wrk.js';

const SPEC = {
  rounds: { type: 'int', min: 1, default: 3, help: 'alternating rounds' },
  seconds: { type: 'int', min: 1, default: 5, help: 'length of each load window' },
  connections: { type: 'int', min: 1, default: 64, help: 'wrk connections' },
} as const;

const root = fileURLToPath(new URL('../..', import.meta.url));
const CLI = join(root, 'dist/src/cli.js');

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

async function main(): Promise<void> {
  const o = parseOptions('node dist/bench/tracing.js [options]', SPEC);
  console.log(machineLine(describeMachine()));
  const rx = await receiver();
  // A fresh W3C traceparent per request; `every` in ten requests sampled (flags 01), the rest not (00).
  const scriptOf = (name: string, every: number) => {
    const path = join(tmpdir(), `slabserve-tracing-bench-${name}.lua`);
    const hex = (n: number) => Array.from({ length: n }, () => "string.format('%08x', math.random(0, 2147483647))").join(' .. ');
    writeFileSync(
      path,
      `counter = 0
request = function()
  counter = counter + 1
  local body = '{"inputs":"traced request ' .. counter .. ' of thread ' .. tostring(wrk.thread) .. ' in the bench"}'
  local flags = (counter % 10 < ${every}) and '01' or '00'
  local parent = '00-' .. ${hex(4)} .. '-' .. ${hex(2)} .. '-' .. flags
  return wrk.format("POST", "/embed", {["Content-Type"] = "application/json", ["traceparent"] = parent}, body)
end
`,
    );
    return path;
  };
  const base = ['--host', '127.0.0.1', '--port', '0', '--grpc-port', '0', '--model', 'tiny-embed', '--device', 'cpu'];
  const off = await startServerProcess({ cliPath: CLI, args: base });
  const on = await startServerProcess({ cliPath: CLI, args: [...base, '--otlp-endpoint', rx.url] });
  const sides = [
    { name: 'tracing off', sampled: 0, server: off, script: scriptOf('off', 0) },
    { name: 'on, no request sampled', sampled: 0, server: on, script: scriptOf('none', 0) },
    { name: 'on, 1 in 10 sampled', sampled: 0.1, server: on, script: scriptOf('tenth', 1) },
    { name: 'on, every request sampled', sampled: 1, server: on, script: scriptOf('all', 10) },
  ];
  try {
    for (const s of sides) await wrk(s.server.origin, 1, o.connections, s.script); // warm
    const rows: { name: string; rps: number; p99Ms: number; serverUs: number }[] = [];
    for (let round = 0; round < o.rounds; round++) {
      for (const s of round % 2 === 0 ? sides : [...sides].reverse()) {
        const cpu0 = s.server.cpuMs()!;
        const l = await wrk(s.server.origin, o.seconds, o.connections, s.script);
        const serverUs = ((s.server.cpuMs()! - cpu0) * 1000) / l.requests;
        rows.push({ name: s.name, rps: l.requests / l.seconds, p99Ms: l.p99Ms, serverUs });
        console.log(`round ${round + 1} ${s.name}: ${(l.requests / l.seconds).toFixed(0)} req/s, P99 ${l.p99Ms.toFixed(1)} ms, server ${serverUs.toFixed(0)} us CPU/request`);
      }
    }
    const m = (name: string, k: 'rps' | 'p99Ms' | 'serverUs') => median(rows.filter((r) => r.name === name).map((r) => r[k]));
    console.log(`\n| load | req/s | vs off | P99 ms | server CPU us/request | CPU per sampled request, us |\n|---|---:|---:|---:|---:|---:|`);
    const none = m('on, no request sampled', 'serverUs');
    for (const s of sides) {
      const extra = s.sampled > 0 ? ((m(s.name, 'serverUs') - none) / s.sampled).toFixed(0) : '';
      console.log(`| ${s.name} | ${m(s.name, 'rps').toFixed(0)} | ${(m(s.name, 'rps') / m('tracing off', 'rps')).toFixed(2)}x | ${m(s.name, 'p99Ms').toFixed(1)} | ${m(s.name, 'serverUs').toFixed(0)} | ${extra} |`);
    }
    console.log(`receiver got ${(rx.bytes() / 2 ** 20).toFixed(1)} MiB of spans`);
  } finally {
    await off.stop();
    await on.stop();
    rx.close();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
