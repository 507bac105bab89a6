/**
 * The benchmark's load generator and workloads (bench/load.ts, bench/workloads.ts):
 * the figures in the report are only as good as these. Checked against a
 * small node:http stand-in server whose behaviour the test controls.
 */
import { existsSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { type AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { arrivalTimes } from '../dist/bench/arrivals.js';
import { histogramOfQuantiles, runLoad, type LoadTarget } from '../dist/bench/load.js';
import { toolOnPath } from './fixtures/system-tools.js';
import { makeWorkload, summarizeWorkload } from '../dist/bench/workloads.js';
import type { Histogram } from 'hdr-histogram-js';
import { mulberry32 } from '../dist/models/generator/rng.js';
import { loadModelSpec, type ModelSpec } from '../dist/src/shared/model-format/model-config.js';
import { join } from 'node:path';
import { makeRandom, modelsDir } from './helpers.js';

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
    expect(() => arrivalTimes(100, 1000, mulberry32(1), { factor: 11, duty: 0.1, periodMs: 100 })).toThrow(/at most 1/);
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

/**
 * A stand-in for a server, in this process (one clock with the generator): answers POST /embed with
 * `status` while it has `budget` answers left, and holds the rest until `allow` gives it more. It counts
 * what it answered, and calls `onFirst` when the first request has come in.
 */
class StandIn {
  status = 200;
  budget = Infinity;
  answered = 0;
  /** The bodies received, when set to a list. */
  bodies: string[] | null = null;
  onFirst: (() => void) | null = null;
  private readonly held: (() => void)[] = [];
  readonly server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d));
    req.on('end', () => {
      this.bodies?.push(body);
      const first = this.onFirst;
      this.onFirst = null;
      first?.();
      const answer = () => {
        this.answered++;
        res.writeHead(this.status, { 'content-type': 'application/json' });
        res.end(this.status === 200 ? '[[0.1,0.2]]' : '{"error":"busy","type":"overloaded","code":"X"}');
      };
      if (this.budget > 0) {
        this.budget--;
        answer();
      } else this.held.push(answer);
    });
  });

  /** Gives `budget` more answers (Infinity: answer everything from now on) and answers held requests with it. */
  allow(budget: number): void {
    this.budget = budget;
    while (this.budget > 0 && this.held.length > 0) {
      this.budget--;
      this.held.shift()!();
    }
  }
}

/** A stand-in listening while the tests of the calling describe block run; `target()` is where. */
function listeningStandIn(): { standIn: StandIn; target: () => LoadTarget } {
  const standIn = new StandIn();
  let target: LoadTarget;
  beforeAll(async () => {
    await new Promise<void>((res) => standIn.server.listen(0, '127.0.0.1', res));
    target = { origin: `http://127.0.0.1:${(standIn.server.address() as AddressInfo).port}`, cpuMs: () => null };
  });
  afterAll(() => new Promise<void>((res) => standIn.server.close(() => res())));
  return { standIn, target: () => target };
}

/** The generator's draws, replayed: runLoad takes one draw for its starting request, then the arrival schedule. */
function scheduleOf(seed: number, ratePerS: number, totalMs: number): number[] {
  const r = mulberry32(seed);
  r();
  return arrivalTimes(ratePerS, totalMs, r);
}

/** The recorded latencies in ms, ascending (each as the histogram has it: the top of its bucket). */
function recordedMs(h: Histogram): number[] {
  return Array.from({ length: h.totalCount }, (_, i) => h.getValueAtPercentile((100 * (i + 0.5)) / h.totalCount) / 1000);
}

describe('the load generator against a stand-in server', () => {
  const { standIn, target } = listeningStandIn();

  it('open loop: every scheduled arrival is counted, and a stall shows in the latency of every arrival scheduled during it (coordinated omission corrected)', async () => {
    const seed = Math.floor(makeRandom('bench-load open loop')() * 2 ** 31);
    const w = await makeWorkload('short', spec, 5, 64);
    const RATE = 200;
    const DURATION_MS = 1000;
    const STALL_MS = 300;
    // The stand-in holds every answer from the first request on, until STALL_MS after that request came in
    // (by the clock, not by a timer's word: a timer may fire a little early).
    standIn.status = 200;
    standIn.answered = 0;
    standIn.allow(0);
    let release: ReturnType<typeof setTimeout> | undefined;
    standIn.onFirst = () => {
      const at = performance.now() + STALL_MS;
      const tick = () => (performance.now() >= at ? standIn.allow(Infinity) : (release = setTimeout(tick, at - performance.now())));
      release = setTimeout(tick, STALL_MS);
    };
    const o = await runLoad({ target: target(), model: 'm', transport: 'http', workload: w, arrivals: { kind: 'open', ratePerS: RATE }, warmupMs: 0, durationMs: DURATION_MS, connections: 4 }, mulberry32(seed));
    clearTimeout(release);
    standIn.onFirst = null;
    standIn.allow(Infinity);
    try {
      const times = scheduleOf(seed, RATE, DURATION_MS);
      const latencies = recordedMs(o.histogram);
      // Each answer came after the release, which came STALL_MS after the first request reached the stand-in,
      // which was sent no earlier than its schedule: so an arrival scheduled at t waited, from its schedule,
      // at least times[0] + STALL_MS - t (a bound by causality: a slow machine only adds to it). Measured
      // from the actual send, or with sends held back during the stall, the arrivals queued behind the held
      // answers would show almost nothing.
      const bounds = times.map((t) => Math.max(0, times[0]! + STALL_MS - t)).sort((a, b) => a - b);
      const during = bounds.filter((b) => b > 0).length;
      console.log(`bench-load open loop: ${times.length} arrivals scheduled, ${during} of them during the stall; p50 ${latencies[Math.floor(latencies.length / 2)]} ms, p90 ${latencies[Math.floor(latencies.length * 0.9)]} ms`);
      // Every arrival of the schedule (the same seed's, replayed) was sent, answered and counted, once.
      expect({ requests: o.requests, rejected: o.rejected, errors: o.errors, firstError: o.firstError }).toEqual({ requests: times.length, rejected: 0, errors: 0, firstError: undefined });
      expect(o.histogram.totalCount).toBe(times.length);
      expect(standIn.answered).toBe(times.length);
      expect(o.windowMs).toBe(DURATION_MS);
      expect(during).toBeGreaterThan(10);
      // So the i-th smallest latency is at least the i-th smallest bound (0.01 ms: latencies are recorded in whole µs).
      const under = latencies.flatMap((l, i) => (l < bounds[i]! - 0.01 ? [`#${i}: ${l} ms < ${bounds[i]!.toFixed(3)} ms`] : []));
      expect(under.slice(0, 10)).toEqual([]);
    } finally {
      o.histogram.destroy();
    }
  });

  it('closed loop (the Node generator): counts the answers received inside the window (none before it, none after), refusals apart from errors', async () => {
    const w = await makeWorkload('short', spec, 6, 64);
    const IN_WINDOW = 40;
    /**
     * A closed loop of 4 callers whose stand-in holds every answer until the window opens, then gives
     * exactly IN_WINDOW answers, then holds again until the window has closed. The window (1 s) is there
     * for those IN_WINDOW instant answers to arrive: it is only too short if the process hangs.
     */
    const run = async (status: number) => {
      standIn.status = status;
      standIn.allow(0);
      standIn.answered = 0;
      let marks = 0;
      let answeredBefore = -1;
      let answeredInside = -1;
      const windowTarget: LoadTarget = {
        origin: target().origin,
        // Called just before the window's start is taken, and just after its end: the stand-in follows it.
        cpuMs: () => {
          if (marks++ === 0) {
            answeredBefore = standIn.answered;
            setImmediate(() => standIn.allow(IN_WINDOW));
          } else {
            answeredInside = standIn.answered;
            setImmediate(() => standIn.allow(Infinity));
          }
          return null;
        },
      };
      const o = await runLoad({ target: windowTarget, model: 'm', transport: 'http', workload: w, arrivals: { kind: 'closed', concurrency: 4 }, warmupMs: 100, durationMs: 1000, generator: 'node' }, mulberry32(1));
      expect({ marks, answeredBefore, answeredInside }).toEqual({ marks: 2, answeredBefore: 0, answeredInside: IN_WINDOW });
      // Callers kept sending after the window: answered, not counted.
      expect(standIn.answered).toBeGreaterThan(IN_WINDOW);
      return o;
    };

    const refused = await run(429);
    try {
      expect({ requests: refused.requests, rejected: refused.rejected, errors: refused.errors }).toEqual({ requests: 0, rejected: IN_WINDOW, errors: 0 });
      expect(refused.histogram.totalCount).toBe(0);
    } finally {
      refused.histogram.destroy();
    }
    const ok = await run(200);
    try {
      expect({ requests: ok.requests, rejected: ok.rejected, errors: ok.errors }).toEqual({ requests: IN_WINDOW, rejected: 0, errors: 0 });
      expect(ok.histogram.totalCount).toBe(IN_WINDOW);
      expect(ok.inputs).toBe(IN_WINDOW); // 'short': one input per request
      expect(ok.tokens).toBeGreaterThanOrEqual(IN_WINDOW * 8);
      expect(ok.tokens).toBeLessThanOrEqual(IN_WINDOW * 32);
    } finally {
      ok.histogram.destroy();
    }
  });
});

describe('wrk as the HTTP closed loop', () => {
  beforeAll(() => {
    toolOnPath('wrk');
  }, 120_000);

  const { standIn, target } = listeningStandIn();

  it('sends the workload\'s bodies in turn, counts the answers of the measured run and their latencies, and says it ran', async () => {
    const w = await makeWorkload('short', spec, 7, 32);
    standIn.status = 200;
    standIn.allow(Infinity);
    standIn.bodies = [];
    let measuredFrom = -1;
    let measuredTo = -1;
    // The window opens after the warm-up run and closes after the measured one: the stand-in's count then.
    let marks = 0;
    const counted: LoadTarget = { origin: target().origin, cpuMs: () => ((marks++ === 0 ? (measuredFrom = standIn.answered) : (measuredTo = standIn.answered)), null) };
    const o = await runLoad({ target: counted, model: 'm', transport: 'http', workload: w, arrivals: { kind: 'closed', concurrency: 4 }, warmupMs: 1000, durationMs: 1000 }, mulberry32(2));
    try {
      const sent = standIn.bodies;
      standIn.bodies = null;
      expect(o.generator).toBe('wrk');
      expect(measuredFrom).toBeGreaterThan(0); // the warm-up ran first, outside the window
      // The stand-in answered each request wrk counted; at most one per connection more (in flight when wrk stopped).
      const answered = measuredTo - measuredFrom;
      expect(o.requests).toBeLessThanOrEqual(answered);
      expect(o.requests).toBeGreaterThanOrEqual(answered - 4);
      expect({ errors: o.errors, inputs: o.inputs }).toEqual({ errors: 0, inputs: o.requests });
      expect(o.histogram.totalCount).toBe(o.requests);
      // Every body is one of the workload's, and with as many requests as bodies or more, every body went out.
      const bodies = new Set(w.bodies.map((b) => b.toString('utf8')));
      expect(sent.filter((b) => !bodies.has(b))).toEqual([]);
      expect(new Set(sent).size).toBe(Math.min(bodies.size, sent.length));
      expect(existsSync(join(tmpdir(), `slabserve-bench-${process.pid}.lua`))).toBe(false); // its script is gone with its run
    } finally {
      o.histogram.destroy();
    }
  });

  it('an answer other than 2xx is an error, never a request', async () => {
    const w = await makeWorkload('short', spec, 8, 16);
    standIn.status = 503;
    standIn.allow(Infinity);
    const o = await runLoad({ target: target(), model: 'm', transport: 'http', workload: w, arrivals: { kind: 'closed', concurrency: 2 }, warmupMs: 0, durationMs: 1000 }, mulberry32(3));
    standIn.status = 200;
    try {
      expect(o.requests).toBe(0);
      expect(o.errors).toBeGreaterThan(0);
      expect(o.firstError).toMatch(/answers were not 2xx/);
    } finally {
      o.histogram.destroy();
    }
  });
});

describe('wrk\'s latency summary as a histogram', () => {
  it('keeps the count and every 0.1 percentile of the latencies it came from', () => {
    const r = makeRandom('bench-load quantiles');
    const n = 20_000 + Math.floor(r() * 10_000);
    const lat = Array.from({ length: n }, () => Math.round(200 + 5000 * -Math.log(1 - r()))).sort((a, b) => a - b);
    // wrk's percentile(p): the smallest value with at least round(p/100 x n + 0.5) values at or below it.
    const at = (p: number) => lat[Math.min(n, Math.round((p / 100) * n + 0.5)) - 1]!;
    const quantiles = Array.from({ length: 1000 }, (_, k) => (k === 999 ? lat[n - 1]! : at((k + 1) / 10)));
    const h = histogramOfQuantiles(quantiles, n);
    try {
      expect(h.totalCount).toBe(n);
      for (const p of [50, 90, 99, 99.9]) {
        const got = h.getValueAtPercentile(p);
        expect(Math.abs(got - at(p)) / at(p), `p${p}: ${got} against ${at(p)}`).toBeLessThan(0.01); // HDR's 3 digits, and 0.1-percentile steps
      }
      expect(h.maxValue).toBeGreaterThanOrEqual(lat[n - 1]!);
    } finally {
      h.destroy();
    }
  });
});
