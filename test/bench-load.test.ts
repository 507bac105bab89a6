/**
 * The benchmark's load generator and workloads (bench/load.ts, bench/workloads.ts):
 * the figures in the report are only as good as these. Checked against a
 * small node:http stand-in server whose behaviour the test controls.
 */
import http from 'node:http';
import { type AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { arrivalTimes, runLoad, type LoadTarget } from '../dist/bench/load.js';
import { makeWorkload, summarizeWorkload } from '../dist/bench/workloads.js';
import { mulberry32 } from '../dist/src/modelgen/rng.js';
import { loadModelSpec, type ModelSpec } from '../dist/src/shared/model-config.js';
import { join } from 'node:path';
import { modelsDir } from './helpers.js';

let spec: ModelSpec;
beforeAll(async () => {
  spec = loadModelSpec(join(modelsDir, 'tiny-embed'));
});

describe('arrival schedules', () => {
  it('Poisson arrivals have the asked mean rate and exponential gaps', () => {
    const times = arrivalTimes(500, 20_000, mulberry32(7));
    expect(times.length / 20).toBeGreaterThan(480);
    expect(times.length / 20).toBeLessThan(520);
    const gaps = times.slice(1).map((t, i) => t - times[i]!);
    const mean = gaps.reduce((a, b) => a + b, 0) / gaps.length;
    const sd = Math.sqrt(gaps.reduce((a, g) => a + (g - mean) ** 2, 0) / gaps.length);
    expect(sd / mean).toBeGreaterThan(0.9); // exponential: coefficient of variation 1 (a fixed rate would give 0)
    expect(sd / mean).toBeLessThan(1.1);
  });

  it('bursts keep the mean rate and put factor times the rate inside the bursts', () => {
    const bursts = { factor: 4, duty: 0.1, periodMs: 500 };
    const times = arrivalTimes(400, 30_000, mulberry32(8), bursts);
    expect(times.length / 30).toBeGreaterThan(370);
    expect(times.length / 30).toBeLessThan(430);
    const inside = times.filter((t) => t % 500 < 50).length;
    const insideRate = inside / (30 * 0.1);
    expect(insideRate / 400).toBeGreaterThan(3.5);
    expect(insideRate / 400).toBeLessThan(4.5);
    expect(() => arrivalTimes(100, 1000, mulberry32(1), { factor: 10, duty: 0.1, periodMs: 100 })).toThrow(/below 1/);
  });
});

describe('workloads', () => {
  it('the same seed gives the same texts; token counts stay in their ranges', async () => {
    const a = await makeWorkload('mixed', spec, 3, 400);
    const b = await makeWorkload('mixed', spec, 3, 400);
    const c = await makeWorkload('mixed', spec, 4, 400);
    expect(a.requests.map((r) => r[0]!.text)).toEqual(b.requests.map((r) => r[0]!.text));
    expect(a.requests[0]![0]!.text).not.toBe(c.requests[0]![0]!.text);
    const mixed = summarizeWorkload(a, spec.maxLength);
    expect(mixed.tokens.min).toBeGreaterThanOrEqual(8);
    expect(mixed.tokens.max).toBeLessThanOrEqual(spec.maxLength);
    expect(mixed.tokens.p50).toBeLessThan(40); // most short...
    expect(mixed.tokens.p99).toBeGreaterThan(128); // ...with a long tail
    const short = summarizeWorkload(await makeWorkload('short', spec, 3, 300), spec.maxLength);
    expect(short.tokens.min).toBeGreaterThanOrEqual(8);
    expect(short.tokens.max).toBeLessThanOrEqual(32);
    const batch = await makeWorkload('client-batch', spec, 3, 10);
    expect(batch.requests.every((r) => r.length === 16)).toBe(true);
    expect(JSON.parse(batch.bodies[0]!.toString()).inputs).toHaveLength(16);
  });
});

/** A stand-in for a server: answers POST /embed after `delay()` ms, or with `status()`. */
function standIn(delay: () => number, status: () => number = () => 200) {
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () =>
      setTimeout(() => {
        const s = status();
        res.writeHead(s, { 'content-type': 'application/json' });
        res.end(s === 200 ? '[[0.1,0.2]]' : '{"error":"busy","type":"overloaded","code":"X"}');
      }, delay()),
    );
  });
  return server;
}

describe('the load generator against a stand-in server', () => {
  let stall = false;
  let refuse = false;
  const server = standIn(
    () => (stall ? 400 : 1),
    () => (refuse ? 429 : 200),
  );
  let target: LoadTarget;
  beforeAll(async () => {
    await new Promise<void>((res) => server.listen(0, '127.0.0.1', res));
    target = { origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, cpuMs: () => null };
  });
  afterAll(() => new Promise<void>((res) => server.close(() => res())));

  it('open loop: a server stall shows in the latency of every arrival scheduled during it (coordinated omission corrected)', async () => {
    const w = await makeWorkload('short', spec, 5, 64);
    // the stand-in answers in ~1 ms, except that it holds answers 400 ms during 0.5..0.9 s
    const t1 = setTimeout(() => (stall = true), 500);
    const t2 = setTimeout(() => (stall = false), 900);
    const o = await runLoad({ target, model: 'm', transport: 'http', workload: w, arrivals: { kind: 'open', ratePerS: 200 }, warmupMs: 0, durationMs: 1500, connections: 4 }, mulberry32(9));
    clearTimeout(t1);
    clearTimeout(t2);
    // ~300 arrivals; ~80 of them during the stall, and with 4 connections the ones queued behind
    // the held answers wait too: measured from their scheduled time, well over 10% are slow
    expect(o.requests).toBeGreaterThan(250);
    expect(o.errors).toBe(0);
    const slow = o.histogram.getValueAtPercentile(85) / 1000;
    expect(slow).toBeGreaterThan(100);
    expect(o.histogram.getValueAtPercentile(30) / 1000).toBeLessThan(100); // the rest is fast
    expect(o.windowMs).toBe(1500);
    o.histogram.destroy();
  });

  it('closed loop: counts answers inside the window, refusals apart from errors', async () => {
    const w = await makeWorkload('short', spec, 6, 64);
    refuse = true;
    const refused = await runLoad({ target, model: 'm', transport: 'http', workload: w, arrivals: { kind: 'closed', concurrency: 4 }, warmupMs: 100, durationMs: 400 }, mulberry32(1));
    refuse = false;
    expect(refused.requests).toBe(0);
    expect(refused.rejected).toBeGreaterThan(0);
    expect(refused.errors).toBe(0);
    refused.histogram.destroy();
    const ok = await runLoad({ target, model: 'm', transport: 'http', workload: w, arrivals: { kind: 'closed', concurrency: 4 }, warmupMs: 100, durationMs: 400 }, mulberry32(1));
    expect(ok.requests).toBeGreaterThan(20);
    expect(ok.histogram.totalCount).toBe(ok.requests);
    expect(ok.inputs).toBe(ok.requests);
    expect(ok.tokens).toBeGreaterThanOrEqual(ok.requests * 8);
    ok.histogram.destroy();
  });
});
