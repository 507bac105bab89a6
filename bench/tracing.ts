/**
 * What tracing costs under load (docs/tracing.md has the method and the
 * results): the traced path alone first (micro/tracing-path.ts), then servers
 * with tracing off, a ratio sampler at 0.1 and 1.0, and the default sampler fed
 * unsampled and sampled traceparents, in alternating rounds. A sampled
 * request's cost is read from the gateway's and the inference thread's own CPU
 * counters: the whole process's moves with the batches each window formed.
 *
 *   node dist/bench/tracing.js [--rounds 3] [--seconds 5] [--connections 64] [--path-requests 100000]
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseOptions } from './args.js';
import { machineLine } from './machine.js';
import { startServerProcess } from './server-process.js';
import { median, roundOrder } from './suite/phases.js';
import { measureTracedPath } from './micro/tracing-path.js';
import { postScript, wrk } from './wrk.js';

const SPEC = {
  rounds: { type: 'int', min: 1, default: 3, help: 'alternating rounds' },
  seconds: { type: 'int', min: 1, default: 5, help: 'length of each load window' },
  connections: { type: 'int', min: 1, default: 64, help: 'wrk connections' },
  'path-requests': { type: 'int', min: 1000, default: 100000, help: 'sampled requests through the traced path alone (micro/tracing-path.ts)' },
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

interface Row {
  name: string;
  rps: number;
  p99Ms: number;
  /** CPU per request: the whole process, its gateway threads, its inference thread (slabserve_thread_cpu_seconds_total). */
  serverUs: number;
  gatewayUs: number;
  inferenceUs: number;
}

/** CPU seconds of the threads whose label starts with `prefix`. */
const threadSum = (threads: Map<string, number>, prefix: string) => [...threads].reduce((sum, [name, s]) => (name.startsWith(prefix) ? sum + s : sum), 0);

async function main(): Promise<void> {
  const o = parseOptions('node dist/bench/tracing.js [options]', SPEC);
  console.log(machineLine());
  const path = await measureTracedPath(o['path-requests']);
  console.log(`the traced path alone (micro/tracing-path.ts): ${path.cpuUs.toFixed(1)} us of CPU per sampled request, ${path.spansPerRequest.toFixed(2)} spans and ${path.bytesPerRequest.toFixed(0)} bytes of protobuf each`);
  const rx = await receiver();
  // A fresh W3C traceparent per request; `every` in ten requests sampled (flags 01), the rest not (00).
  const scriptOf = (name: string, every: number) => {
    const path = join(tmpdir(), `slabserve-tracing-bench-${name}.lua`);
    const hex = (n: number) => Array.from({ length: n }, () => "string.format('%08x', math.random(0, 2147483647))").join(' .. ');
    const noHeader = 'return wrk.format("POST", "/embed", {["Content-Type"] = "application/json"}, body)';
    const withParent = (every: number) => `local flags = (counter % 10 < ${every}) and '01' or '00'
  local parent = '00-' .. ${hex(4)} .. '-' .. ${hex(2)} .. '-' .. flags
  return wrk.format("POST", "/embed", {["Content-Type"] = "application/json", ["traceparent"] = parent}, body)`;
    writeFileSync(
      path,
      `counter = 0
request = function()
  counter = counter + 1
  local body = '{"inputs":"traced request ' .. counter .. ' of thread ' .. tostring(wrk.thread) .. ' in the bench"}'
  ${every < 0 ? noHeader : withParent(every)}
end
`,
    );
    return path;
  };
  const base = ['--host', '127.0.0.1', '--port', '0', '--grpc-port', '0', '--model', 'tiny-embed', '--device', 'cpu'];
  const off = await startServerProcess({ cliPath: CLI, args: base });
  const traced = (env: Record<string, string>) => startServerProcess({ cliPath: CLI, args: [...base, '--otlp-endpoint', rx.url], env });
  const on = await traced({});
  const tenth = await traced({ OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.1' });
  const all = await traced({ OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: '1' });
  const noParent = scriptOf('no-parent', -1);
  const sides = [
    { name: 'tracing off', sampled: 0, server: off, script: scriptOf('off', 0) },
    { name: 'ratio 0.1', sampled: 0.1, server: tenth, script: noParent },
    { name: 'ratio 1.0', sampled: 1, server: all, script: noParent },
    { name: 'parents, none sampled', sampled: 0, server: on, script: scriptOf('none', 0) },
    { name: 'parents, all sampled', sampled: 1, server: on, script: scriptOf('all', 10) },
  ];
  try {
    for (const s of sides) await wrk(s.server.origin, 1, o.connections, s.script); // warm
    const rows: Row[] = [];
    for (let round = 0; round < o.rounds; round++) {
      for (const s of roundOrder(round + 1, sides.length).map((i) => sides[i]!)) {
        const cpu0 = s.server.cpuMs()!;
        const threads0 = (await s.server.counters('tiny-embed')).threadCpuS;
        const l = await wrk(s.server.origin, o.seconds, o.connections, s.script);
        const threads1 = (await s.server.counters('tiny-embed')).threadCpuS;
        const perRequest = (prefix: string) => (threadSum(threads1, prefix) - threadSum(threads0, prefix)) * 1e6 / l.requests;
        const row = { name: s.name, rps: l.requests / l.seconds, p99Ms: l.p99Ms, serverUs: ((s.server.cpuMs()! - cpu0) * 1000) / l.requests, gatewayUs: perRequest('gateway'), inferenceUs: perRequest('inference') };
        rows.push(row);
        console.log(`round ${round + 1} ${s.name}: ${row.rps.toFixed(0)} req/s, P99 ${l.p99Ms.toFixed(1)} ms, server ${row.serverUs.toFixed(0)} us CPU/request (gateway threads ${row.gatewayUs.toFixed(0)}, inference thread ${row.inferenceUs.toFixed(0)})`);
      }
    }
    const m = (name: string, k: Exclude<keyof Row, 'name'>) => median(rows.filter((r) => r.name === name).map((r) => r[k]));
    console.log(`\n| load | req/s | vs off | P99 ms | server CPU us/request | gateway threads | inference thread | a sampled request's extra CPU, gateway + inference, us |\n|---|---:|---:|---:|---:|---:|---:|---:|`);
    // A sampled request's extra: the same server's load of unsampled parents, or for a ratio the untraced server
    const baseline = (s: (typeof sides)[number]) => (s.server === on ? 'parents, none sampled' : 'tracing off');
    for (const s of sides) {
      const b = baseline(s);
      // Only where every request is sampled: a tenth of a difference this small is noise, divided by 0.1.
      const extra = s.sampled === 1 ? (m(s.name, 'gatewayUs') + m(s.name, 'inferenceUs') - m(b, 'gatewayUs') - m(b, 'inferenceUs')).toFixed(0) : '';
      console.log(`| ${s.name} | ${m(s.name, 'rps').toFixed(0)} | ${(m(s.name, 'rps') / m('tracing off', 'rps')).toFixed(2)}x | ${m(s.name, 'p99Ms').toFixed(1)} | ${m(s.name, 'serverUs').toFixed(0)} | ${m(s.name, 'gatewayUs').toFixed(0)} | ${m(s.name, 'inferenceUs').toFixed(0)} | ${extra} |`);
    }
    console.log(`receiver got ${(rx.bytes() / 2 ** 20).toFixed(1)} MiB of spans`);
  } finally {
    for (const server of [off, on, tenth, all]) await server.stop();
    rx.close();
    for (const s of sides) rmSync(s.script, { force: true });
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
