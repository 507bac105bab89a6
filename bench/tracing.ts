/**
 * What tracing costs (docs/tracing.md): three servers side by side, tracing
 * off, and on with a parent-based ratio of 0.1 and of 1.0 (requests carry no
 * traceparent, so the ratio decides), exporting over http/protobuf to a
 * receiver in this process that answers at once. wrk at 64 connections,
 * distinct short texts, alternating rounds, medians: req/s, P99, the server's
 * CPU per request, and from those the CPU of one sampled request (a request
 * span, its two children and its share of a batch span, exported).
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
import { startServerProcess, type ServerProcess } from './server-process.js';
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
  const script = join(tmpdir(), 'slabserve-tracing-bench.lua');
  writeFileSync(script, postScript('/embed', `'{"inputs":"traced request ' .. counter .. ' of thread ' .. tostring(wrk.thread) .. ' in the bench"}'`));
  const base = ['--host', '127.0.0.1', '--port', '0', '--grpc-port', '0', '--model', 'tiny-embed', '--device', 'cpu'];
  const sides: { name: string; ratio: number; server?: ServerProcess; env?: Record<string, string> }[] = [
    { name: 'tracing off', ratio: 0 },
    { name: 'ratio 0.1', ratio: 0.1, env: { OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.1' } },
    { name: 'ratio 1.0', ratio: 1, env: { OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '1' } },
  ];
  try {
    for (const s of sides) {
      const args = s.env ? [...base, '--otlp-endpoint', rx.url] : base;
      s.server = await startServerProcess({ cliPath: CLI, args, ...(s.env ? { env: s.env } : {}) });
      await wrk(s.server.origin, 1, o.connections, script); // warm
    }
    const rows: { name: string; rps: number; p99Ms: number; serverUs: number }[] = [];
    for (let round = 0; round < o.rounds; round++) {
      for (const s of round % 2 === 0 ? sides : [...sides].reverse()) {
        const cpu0 = s.server!.cpuMs()!;
        const l = await wrk(s.server!.origin, o.seconds, o.connections, script);
        const serverUs = ((s.server!.cpuMs()! - cpu0) * 1000) / l.requests;
        rows.push({ name: s.name, rps: l.requests / l.seconds, p99Ms: l.p99Ms, serverUs });
        console.log(`round ${round + 1} ${s.name}: ${(l.requests / l.seconds).toFixed(0)} req/s, P99 ${l.p99Ms.toFixed(1)} ms, server ${serverUs.toFixed(0)} us CPU/request`);
      }
    }
    const m = (name: string, k: 'rps' | 'p99Ms' | 'serverUs') => median(rows.filter((r) => r.name === name).map((r) => r[k]));
    console.log(`\n| tracing | req/s | vs off | P99 ms | server CPU us/request | CPU per sampled request, us |\n|---|---:|---:|---:|---:|---:|`);
    for (const s of sides) {
      const extra = s.ratio > 0 ? ((m(s.name, 'serverUs') - m('tracing off', 'serverUs')) / s.ratio).toFixed(0) : '';
      console.log(`| ${s.name} | ${m(s.name, 'rps').toFixed(0)} | ${(m(s.name, 'rps') / m('tracing off', 'rps')).toFixed(2)}x | ${m(s.name, 'p99Ms').toFixed(1)} | ${m(s.name, 'serverUs').toFixed(0)} | ${extra} |`);
    }
    console.log(`receiver got ${(rx.bytes() / 2 ** 20).toFixed(1)} MiB of spans`);
  } finally {
    for (const s of sides) await s.server?.stop();
    rx.close();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
