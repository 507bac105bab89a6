/**
 * Supervision end to end, on real servers: startServer() in this process (the
 * real inference thread, onnxruntime on CPU, the generated tiny-embed model,
 * uWebSockets.js gateways), the built CLI in a child process where signals
 * are sent, and a child-process server (fixtures/supervised-server.mjs) where
 * a broken supervisor would abort the whole process. Faults come from the
 * test hooks (SLABSERVE_TEST_HOOKS=1: server.testHooks), inert otherwise.
 *
 * Clients are node:http (one keep-alive agent per simulated client): it
 * reports a connection the server resets or closes, which is what these tests
 * must see; every request is bounded by a client timeout, so a request that
 * hangs is a failure with a name, not a test timeout.
 *
 * Every 200 is compared with the unbatched, unpadded onnxruntime reference
 * (test/helpers.ts), before, during and after each fault.
 */
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import http from 'node:http';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import type { InferenceFault } from '../dist/src/gpu-worker/thread.js';
import { startServer, type Server, type ServerConfig } from '../dist/src/main/server.js';
import { parseMetrics, type Metrics } from './fixtures/http-client.js';
import { expectCliRefuses, portOutsideEphemeral, serveCli } from './cli-process.js';
import { eventually, makeRandom, maxAbsDiff, randomTexts, Reference, sleep, testServerConfig, vocabularyWords } from './helpers.js';

// Read by startServer: the servers of this file carry the test hooks.
process.env.SLABSERVE_TEST_HOOKS = '1';

const DIM = 128;
const MAX_LENGTH = 64;
const TOLERANCE = 1e-5;
const BATCHING = { buckets: [16, 64], maxBatchSize: 16 };
/** onnxruntime threads of this file's server: two per session (so a pool thread exists on any machine), run at this nice value. */
const INTRA_OP_THREADS = 2;
const INTRA_OP_NICE = 7;
/** [unused0]: a valid id no text tokenizes to; the poison hook makes onnxruntime fail on inputs holding it. */
const POISON = 1;
/** Longest any client waits for an answer: past it the request counts as hung. */
const CLIENT_TIMEOUT_MS = 15_000;
/** The CLI children run without the test hooks this process turns on (they are inert there), ready within 40 s, killed after 60. */
const CLI_OPTS = { env: { SLABSERVE_TEST_HOOKS: '' }, readyWithinMs: 40_000, killAfterMs: 60_000 };
const FIXTURE = fileURLToPath(new URL('./fixtures/supervised-server.mjs', import.meta.url));

let ref: Reference;
let tok: TextTokenizer;
let words: string[];

beforeAll(async () => {
  ref = await Reference.open('tiny-embed');
  tok = await loadTokenizer(ref.spec.tokenizerPath);
  words = vocabularyWords(ref.spec);
});

afterAll(async () => {
  await ref?.close();
});

// ------------------------------------------------------------------ threads

interface ThreadInfo {
  tid: number;
  nice: number;
}

/** Nice value of a thread of this process (/proc/self/task/TID/stat, field 19), or of the process. */
function niceOf(tid: number | 'self'): number {
  const stat = readFileSync(tid === 'self' ? '/proc/self/stat' : `/proc/self/task/${tid}/stat`, 'latin1');
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[16]);
}

/** This process's threads by kernel name (comm). */
function threadsByName(): Map<string, ThreadInfo[]> {
  const out = new Map<string, ThreadInfo[]>();
  for (const tid of readdirSync('/proc/self/task').map(Number)) {
    try {
      const name = readFileSync(`/proc/self/task/${tid}/comm`, 'latin1').trimEnd();
      out.set(name, [...(out.get(name) ?? []), { tid, nice: niceOf(tid) }]);
    } catch {
      /* exited meanwhile */
    }
  }
  return out;
}

// ------------------------------------------------------------------ HTTP over node:http

type Outcome = { sentAt: number; doneAt: number } & ({ status: number; body: any; text: string } | { error: string }); // eslint-disable-line @typescript-eslint/no-explicit-any

/** One request; resolves with the answer, or with the error (reset, refused, closed, client timeout). Never rejects. */
function request(
  port: number,
  method: string,
  path: string,
  payload?: unknown,
  opts: { agent?: http.Agent; close?: boolean; timeoutMs?: number } = {},
): Promise<Outcome> {
  const sentAt = performance.now();
  const body = payload === undefined ? undefined : JSON.stringify(payload);
  return new Promise((resolve) => {
    let settled = false;
    const done = (o: { status: number; body: unknown; text: string } | { error: string }) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve({ sentAt, doneAt: performance.now(), ...o } as Outcome);
    };
    const headers: Record<string, string | number> = {};
    if (body !== undefined) {
      headers['content-type'] = 'application/json';
      headers['content-length'] = Buffer.byteLength(body);
    }
    if (opts.close) headers.connection = 'close';
    const req = http.request({ host: '127.0.0.1', port, method, path, headers, agent: opts.agent ?? false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let parsed: unknown = text;
        if ((res.headers['content-type'] ?? '').startsWith('application/json')) parsed = JSON.parse(text);
        done({ status: res.statusCode!, body: parsed, text });
      });
      res.on('error', (e: NodeJS.ErrnoException) => done({ error: `response ${e.code ?? e.message}` }));
    });
    req.on('error', (e: NodeJS.ErrnoException) => done({ error: e.code ?? e.message }));
    const timer = setTimeout(() => {
      done({ error: 'client timeout' });
      req.destroy();
    }, opts.timeoutMs ?? CLIENT_TIMEOUT_MS);
    req.end(body);
  });
}

async function scrape(port: number): Promise<Metrics> {
  const r = await request(port, 'GET', '/metrics');
  if (!('status' in r) || r.status !== 200) throw new Error(`/metrics: ${JSON.stringify(r)}`);
  return parseMetrics(r.text);
}


const slotsInUse = (m: Metrics) => m.sum('slabserve_slots_in_use');

async function expectSlotsFree(port: number): Promise<void> {
  await eventually('every slot free', () => scrape(port), (m) => m.has('slabserve_slots_in_use') && slotsInUse(m) === 0);
}

/** A free port outside the ephemeral range, which another test's port-0 bind cannot take meanwhile. */
const freePort = portOutsideEphemeral;

/** /readyz every 20 ms: its answers (or errors) over time. */
class ReadinessPoller {
  readonly samples: { at: number; status: number | string }[] = [];
  private stopped = false;
  private readonly done: Promise<void>;

  constructor(port: number) {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    this.done = (async () => {
      while (!this.stopped) {
        const r = await request(port, 'GET', '/readyz', undefined, { agent, timeoutMs: 5000 });
        this.samples.push({ at: r.sentAt, status: 'status' in r ? r.status : r.error });
        await sleep(20);
      }
      agent.destroy();
    })();
  }

  /** When /readyz first answered 503 after `since`, and when it answered 200 again after that (or undefined). */
  downThenUp(since: number): { downAt?: number; upAt?: number } {
    const down = this.samples.find((s) => s.at >= since && s.status === 503);
    const up = down ? this.samples.find((s) => s.at > down.at && s.status === 200) : undefined;
    return { ...(down ? { downAt: down.at } : {}), ...(up ? { upAt: up.at } : {}) };
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.done;
  }
}

// ------------------------------------------------------------------ reference results

/** The embedding the server must return for `text` (unbatched, unpadded onnxruntime). */
async function refEmbedding(text: string): Promise<Float32Array> {
  return (await ref.rowOfText(tok, text)).slice(0, DIM);
}

/** Every 200 of `outcomes` holds, for each of its texts, the reference embedding. */
async function expectReferenceRows(outcomes: (Outcome & { texts: string[] })[]): Promise<number> {
  let checked = 0;
  for (const o of outcomes) {
    if (!('status' in o) || o.status !== 200) continue;
    expect(o.body).toHaveLength(o.texts.length);
    for (let k = 0; k < o.texts.length; k++) {
      expect(maxAbsDiff(o.body[k], await refEmbedding(o.texts[k]!)), `row of "${o.texts[k]}"`).toBeLessThan(TOLERANCE);
      checked++;
    }
  }
  return checked;
}

const describeOutcome = (o: Outcome) => ('status' in o ? `${o.status}${o.body?.code ? ` ${o.body.code}` : ''}` : `error ${o.error}`);

function tally(outcomes: Outcome[]): Record<string, number> {
  const t: Record<string, number> = {};
  for (const o of outcomes) t[describeOutcome(o)] = (t[describeOutcome(o)] ?? 0) + 1;
  return t;
}

// =================================================================== the inference thread

describe('inference thread supervision (startServer, real onnxruntime, test hooks)', () => {
  let server: Server;
  let port: number;
  const logs: string[] = [];
  let texts: string[];

  beforeAll(async () => {
    const rand = makeRandom('supervision');
    texts = randomTexts(rand, words, 48, 12);
    server = await startServer(
      testServerConfig({
        models: ['tiny-embed'],
        batching: BATCHING,
        intraOpThreads: INTRA_OP_THREADS,
        intraOpNice: INTRA_OP_NICE,
        inferenceTimeoutMs: 2000,
        heartbeatTimeoutMs: 2000,
        log: (line) => logs.push(line),
      }),
    );
    await server.ready;
    port = server.port;
    expect(server.testHooks, 'SLABSERVE_TEST_HOOKS=1 must give the server its test hooks').toBeDefined();
    // The comparison can fail: each text's reference row is far from every other text's.
    const refs = await Promise.all(texts.map(refEmbedding));
    for (let i = 1; i < texts.length; i++) if (texts[i] !== texts[0]) expect(maxAbsDiff(refs[0]!, refs[i]!)).toBeGreaterThan(1e-3);
  });

  afterAll(async () => {
    await server?.close();
  });

  interface Run {
    outcomes: (Outcome & { texts: string[] })[];
    faultAt: number;
    downAt?: number;
    upAt?: number;
    before: Metrics;
    after: Metrics;
  }

  /**
   * 12 keep-alive clients send one-text requests in a loop (a short pause
   * after a 503), so no batch of theirs holds more than 12 rows. The fault is
   * armed for the next run of 16 rows, then 4 requests of 64 texts each are
   * sent: it lands in one of their batches, with the rest of them queued.
   * Runs until /readyz has gone 503 and back to 200, then a little longer.
   */
  async function faultUnderLoad(kind: InferenceFault): Promise<Run> {
    const before = await scrape(port);
    const poller = new ReadinessPoller(port);
    const outcomes: Run['outcomes'] = [];
    let stop = false;
    let next = 0;
    const clients = Array.from({ length: 12 }, async () => {
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      while (!stop) {
        const text = texts[next++ % texts.length]!;
        const o = await request(port, 'POST', '/embed', { inputs: text }, { agent });
        outcomes.push({ ...o, texts: [text] });
        if (!('status' in o) || o.status !== 200) await sleep(10);
      }
      agent.destroy();
    });
    const bigDone: Promise<unknown>[] = [];
    try {
      await eventually('answers before the fault', async () => outcomes.length, (n) => n >= 24);
      const faultAt = performance.now();
      await server.testHooks!.inferenceFault(kind, BATCHING.maxBatchSize);
      for (let b = 0; b < 4; b++) {
        const inputs = Array.from({ length: 64 }, (_, k) => texts[(b * 7 + k) % texts.length]!);
        bigDone.push(request(port, 'POST', '/embed', { inputs }).then((o) => outcomes.push({ ...o, texts: inputs })));
      }
      const { downAt, upAt } = await eventually('/readyz 503, then 200 again', async () => poller.downThenUp(faultAt), (r) => r.upAt !== undefined);
      await sleep(300);
      stop = true;
      await Promise.all([...clients, ...bigDone]);
      const after = await scrape(port);
      return { outcomes, faultAt, ...(downAt !== undefined ? { downAt } : {}), ...(upAt !== undefined ? { upAt } : {}), before, after };
    } finally {
      stop = true;
      await Promise.all([...clients, ...bigDone]);
      await poller.stop();
    }
  }

  /**
   * The server's threads as the kernel knows them: one "inference" and one
   * "gateway-0" at this process's priority, and onnxruntime's intra-op pool
   * (INTRA_OP_THREADS - 1 per session, at least) named "onnxruntime" at
   * INTRA_OP_NICE: what top -H shows, and what lets a gateway go before a
   * pool thread spinning through a run.
   */
  function expectThreadRoles(threads: Map<string, ThreadInfo[]>): void {
    const own = niceOf('self');
    const show = JSON.stringify(Object.fromEntries(threads));
    expect(threads.get('inference')?.map((t) => t.nice), show).toEqual([own]);
    expect(threads.get('gateway-0')?.map((t) => t.nice), show).toEqual([own]);
    const pool = threads.get('onnxruntime') ?? [];
    expect(pool.length, show).toBeGreaterThanOrEqual(INTRA_OP_THREADS - 1);
    for (const t of pool) expect(t.nice, show).toBe(Math.max(own, INTRA_OP_NICE));
    expect([...threads.keys()].filter((n) => n.startsWith('opening-')), show).toEqual([]); // every thread that opened sessions renamed itself
  }

  /** What every fault must leave: each request answered 200 (the reference row) or 503, slots back, a restart counted, later requests served. */
  async function expectRecovered(run: Run, reason: string, label: string): Promise<void> {
    const counts = tally(run.outcomes);
    const restarted = run.outcomes.filter((o) => 'status' in o && o.body?.code === 'SLABSERVE_INFERENCE_RESTARTED');
    console.log(
      `${label}: ${run.outcomes.length} requests: ${JSON.stringify(counts)}; /readyz 503 ${Math.round((run.downAt ?? NaN) - run.faultAt)} ms after the fault, ` +
        `200 again ${Math.round((run.upAt ?? NaN) - run.faultAt)} ms after it`,
    );
    // Every request got an answer: none hung, none reset.
    for (const o of run.outcomes) {
      expect('status' in o, `a request got no answer: ${describeOutcome(o)}`).toBe(true);
      if (!('status' in o)) continue;
      expect([200, 503], describeOutcome(o)).toContain(o.status);
      if (o.status === 503) {
        expect(o.body.type).toBe('unavailable');
        expect(['SLABSERVE_INFERENCE_RESTARTED', 'SLABSERVE_NOT_READY']).toContain(o.body.code);
      }
    }
    // A large request's batch was running when the fault landed: answered 503 as restarted.
    expect(restarted.length, JSON.stringify(counts)).toBeGreaterThan(0);
    expect(restarted.some((o) => o.texts.length === 64)).toBe(true);
    // Every 200, before, during and after, is the reference row.
    expect(await expectReferenceRows(run.outcomes)).toBeGreaterThan(0);
    // Readiness went down and came back.
    expect(run.downAt).toBeDefined();
    expect(run.upAt).toBeDefined();
    // One restart, for the right reason; the inputs it answered 503 are counted (at least one per restarted request).
    const d = (name: string, labels: Record<string, string> = {}) => run.after.sum(name, labels) - run.before.sum(name, labels);
    expect(d('slabserve_inference_restarts_total', { reason })).toBe(1);
    expect(d('slabserve_inference_restarts_total')).toBe(1);
    expect(d('slabserve_inference_restart_failed_inputs_total')).toBeGreaterThanOrEqual(restarted.length);
    expect(run.after.sum('slabserve_inference_threads_abandoned')).toBe(0);
    await expectSlotsFree(port);
    // Later requests are served, with the same rows as before.
    const later = await Promise.all(texts.slice(0, 8).map(async (t) => ({ ...(await request(port, 'POST', '/embed', { inputs: t })), texts: [t] })));
    for (const o of later) expect(describeOutcome(o)).toBe('200');
    expect(await expectReferenceRows(later)).toBe(8);
    expect(logs.some((l) => l.includes(`inference thread ${reason}`))).toBe(true);
    console.log(`${label}: ${logs.filter((l) => l.includes('ready again after')).pop()}`);
  }

  it('the inference thread throws (uncaught) under load: every request answered 200 or 503, slots back, /readyz 503 then 200, results as before', { timeout: 40_000 }, async () => {
    const run = await faultUnderLoad('throw');
    await expectRecovered(run, 'crash', 'throw');
  });

  it('the inference thread exits under load: the same; its replacement names its onnxruntime threads and lowers their priority as the first did', { timeout: 40_000 }, async () => {
    const first = threadsByName();
    expectThreadRoles(first);
    const run = await faultUnderLoad('exit');
    await expectRecovered(run, 'exit', 'exit');
    const now = threadsByName();
    expectThreadRoles(now);
    // New threads: the exited thread's pool went with it.
    const tids = (m: Map<string, ThreadInfo[]>, name: string) => (m.get(name) ?? []).map((t) => t.tid);
    expect(tids(now, 'inference')).not.toEqual(tids(first, 'inference'));
    for (const t of tids(now, 'onnxruntime')) expect(tids(first, 'onnxruntime')).not.toContain(t);
  });

  it('a batch run hangs past --inference-timeout-ms: the thread is terminated and replaced, the same outcome', { timeout: 40_000 }, async () => {
    const run = await faultUnderLoad('hang');
    await expectRecovered(run, 'run_timeout', 'hang');
    // Answered once the watchdog saw the run past the timeout, not before.
    const restarted = run.outcomes.filter((o) => 'status' in o && o.body?.code === 'SLABSERVE_INFERENCE_RESTARTED');
    for (const o of restarted) expect(o.doneAt - run.faultAt).toBeGreaterThanOrEqual(2000);
  });

  it('the loop stalls with no batch running (past --heartbeat-timeout-ms): requests waiting on the submit ring are answered 503 and the thread replaced', { timeout: 40_000 }, async () => {
    const before = await scrape(port);
    const faultAt = performance.now();
    await server.testHooks!.inferenceFault('stall');
    // The loop no longer takes anything in: these wait on the submit ring until the watchdog acts.
    const sent = texts.slice(0, 10);
    const outcomes = await Promise.all(sent.map(async (t) => ({ ...(await request(port, 'POST', '/embed', { inputs: t })), texts: [t] })));
    console.log(`stall: ${JSON.stringify(tally(outcomes))}, answered ${Math.round(Math.max(...outcomes.map((o) => o.doneAt)) - faultAt)} ms after the stall`);
    for (const o of outcomes) {
      expect(describeOutcome(o)).toBe('503 SLABSERVE_INFERENCE_RESTARTED');
      // Not before the heartbeat was 2 s old; it was last refreshed at most 250 ms before the stall.
      expect(o.doneAt - faultAt).toBeGreaterThanOrEqual(2000 - 300);
    }
    const after = await eventually('ready again', () => request(port, 'GET', '/readyz'), (r) => 'status' in r && r.status === 200);
    expect('status' in after).toBe(true);
    const m = await scrape(port);
    expect(m.sum('slabserve_inference_restarts_total', { reason: 'heartbeat_timeout' }) - before.sum('slabserve_inference_restarts_total', { reason: 'heartbeat_timeout' })).toBe(1);
    expect(m.sum('slabserve_inference_restart_failed_inputs_total') - before.sum('slabserve_inference_restart_failed_inputs_total')).toBe(10);
    await expectSlotsFree(port);
    const later = await Promise.all(sent.map(async (t) => ({ ...(await request(port, 'POST', '/embed', { inputs: t })), texts: [t] })));
    for (const o of later) expect(describeOutcome(o)).toBe('200');
    expect(await expectReferenceRows(later)).toBe(10);
  });

  it('a poisoned input batched with good ones: only it fails (422), the others get the reference rows; the batch is split to find it', { timeout: 40_000 }, async () => {
    const good = texts.slice(0, 24);
    for (const t of good) expect(tok.encode(t, { maxLength: MAX_LENGTH, truncate: false }).ids).not.toContain(POISON);
    await server.testHooks!.poisonToken(POISON);
    try {
      let split = 0;
      for (let round = 0; round < 4 && split < 2; round++) {
        const before = await scrape(port);
        // 25 requests at once: the first runs alone, the rest arrive while it runs and batch together.
        const sends = good.map((t) => request(port, 'POST', '/embed', { inputs: t }).then((o) => ({ ...o, texts: [t] })));
        sends.splice(12, 0, request(port, 'POST', '/embed', { inputs: [[101, 2023, POISON, 102]] }).then((o) => ({ ...o, texts: [] as string[] })));
        const outcomes = await Promise.all(sends);
        const poisoned = outcomes[12]!;
        const rest = outcomes.filter((_, i) => i !== 12);
        for (const o of rest) expect(describeOutcome(o)).toBe('200');
        expect(await expectReferenceRows(rest)).toBe(good.length);
        const after = await scrape(port);
        const d = (name: string) => after.sum(name) - before.sum(name);
        if (d('slabserve_batch_split_runs_total') > 0) {
          // It shared a batch: that batch was split until it stood alone; the others ran.
          split++;
          expect(describeOutcome(poisoned)).toBe('422 SLABSERVE_INPUT_FAILED');
          expect('status' in poisoned && poisoned.body.type).toBe('validation');
          expect(d('slabserve_inputs_failed_alone_total')).toBe(1);
          // At most 2n - 2 runs for a batch of n <= 16.
          expect(d('slabserve_batch_split_runs_total')).toBeLessThanOrEqual(30);
        } else {
          // It ran alone: nothing to tell the input from the device by, so a 500.
          expect(describeOutcome(poisoned)).toBe('500 SLABSERVE_INFERENCE_FAILED');
        }
        expect(d('slabserve_batch_failures_total')).toBeGreaterThanOrEqual(1);
      }
      console.log(`poison: split ${split} times in the rounds`);
      expect(split, 'the poisoned request never shared a batch with good ones').toBeGreaterThan(0);
      // A client request holding the poisoned input with good ones fails whole (answered whole or not at all).
      const mixed = await request(port, 'POST', '/embed', { inputs: [[101, 2023, 102], [101, POISON, 102], [101, 2024, 102]] });
      expect(describeOutcome(mixed)).toMatch(/^(422 SLABSERVE_INPUT_FAILED|500 SLABSERVE_INFERENCE_FAILED)$/);
      await expectSlotsFree(port);
    } finally {
      await server.testHooks!.poisonToken(-1);
    }
    // The hook off, the same ids run: the failure was the hook's.
    const clean = await request(port, 'POST', '/embed', { inputs: [[101, 2023, POISON, 102]] });
    expect(describeOutcome(clean)).toBe('200');
    expect(maxAbsDiff(('status' in clean && clean.body[0]) as number[], (await ref.row([101, 2023, POISON, 102])).slice(0, DIM))).toBeLessThan(TOLERANCE);
  });
});

// =================================================================== SIGTERM on the CLI

describe('--intra-op-nice (a child process)', () => {
  it('out of 0-19, as a flag or SLABSERVE_INTRA_OP_NICE, stops the CLI at once with the range', () => {
    expectCliRefuses(
      [
        [['--intra-op-nice', '20'], {}],
        [['--intra-op-nice', '-1'], {}],
        [[], { SLABSERVE_INTRA_OP_NICE: 'low' }],
      ],
      /--intra-op-nice .*expected an integer from 0 to 19/,
    );
  });
});

describe('SIGTERM and SIGINT on `slabserve serve` (a child process)', () => {
  it('SIGTERM under load: every request sent before it is answered 200 or 503 (none reset), the process exits 0', { timeout: 60_000 }, async () => {
    const rand = makeRandom('supervision sigterm');
    const texts = randomTexts(rand, words, 32, 12);
    const server = await serveCli(['--gateway-threads', '1', '--buckets', '16,64', '--max-batch-size', '16', '--drain-timeout-ms', '20000'], CLI_OPTS);
    const outcomes: (Outcome & { texts: string[] })[] = [];
    let signalAt = Infinity;
    let stop = false;
    let next = 0;
    const clients = Array.from({ length: 12 }, async (_, c) => {
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      while (!stop) {
        // One request in four holds 16 texts: work still in flight when the signal lands.
        const inputs = c % 4 === 0 ? Array.from({ length: 16 }, () => texts[next++ % texts.length]!) : [texts[next++ % texts.length]!];
        const o = await request(server.port, 'POST', '/embed', { inputs }, { agent });
        outcomes.push({ ...o, texts: inputs });
        // Stop at the first refusal or error after the signal: the server is going away.
        if (o.sentAt > signalAt && !('status' in o && o.status === 200)) break;
      }
      agent.destroy();
    });
    await eventually('answers before the signal', async () => outcomes.length, (n) => n >= 40);
    signalAt = performance.now();
    server.kill('SIGTERM');
    const exit = await server.exited;
    stop = true;
    await Promise.all(clients);
    const sentBefore = outcomes.filter((o) => o.sentAt < signalAt);
    const sentAfter = outcomes.filter((o) => o.sentAt >= signalAt);
    console.log(
      `SIGTERM: exit ${exit.code} ${Math.round(exit.at - signalAt)} ms after the signal; sent before it: ${JSON.stringify(tally(sentBefore))}; ` +
        `sent after it: ${JSON.stringify(tally(sentAfter))}`,
    );
    expect({ code: exit.code, signal: exit.signal }, server.stderr().slice(-600)).toEqual({ code: 0, signal: null });
    expect(server.stderr()).toContain('SIGTERM: draining');
    expect(server.stderr()).toContain('slabserve: stopped');
    // Every request sent before the signal was answered: 200 (it ran), or 503 (it arrived once draining had begun).
    for (const o of sentBefore) {
      expect('status' in o, `sent before the signal, no answer: ${describeOutcome(o)}`).toBe(true);
      if ('status' in o) expect(['200', '503 SLABSERVE_NOT_READY'], o.text).toContain(describeOutcome(o));
    }
    expect(sentBefore.filter((o) => 'status' in o && o.status === 200).length).toBeGreaterThanOrEqual(40);
    // Sent after it: refused (503), or the port is closed; never a hang.
    for (const o of sentAfter) expect(describeOutcome(o)).not.toBe('error client timeout');
    expect(await expectReferenceRows(outcomes)).toBeGreaterThan(0);
  });

  it('a second signal exits at once, by that signal (status 128 + n), without waiting for the drain', { timeout: 120_000 }, async () => {
    const rand = makeRandom('supervision second signal');
    const long = Array.from({ length: 64 }, () => Array.from({ length: 600 }, () => words[Math.floor(rand() * words.length)]).join(' '));
    const DRAIN_TIMEOUT_MS = 30_000;
    const server = await serveCli(['--gateway-threads', '1', '--drain-timeout-ms', String(DRAIN_TIMEOUT_MS)], CLI_OPTS);
    // Several requests of 64 inputs of 512 tokens: seconds of work for the drain to wait for.
    const heavy = Array.from({ length: 6 }, () => request(server.port, 'POST', '/embed', { inputs: long, truncate: true }, { timeoutMs: 30_000 }));
    // A hang bound only: tokenizing 384 inputs of 600 words took over 20 s once on a loaded 2-core machine.
    await eventually('the heavy requests queued', () => scrape(server.port), (m) => slotsInUse(m) >= 256, 60_000, (m) => slotsInUse(m));
    server.kill('SIGTERM');
    await eventually('draining', async () => server.stderr(), (s) => s.includes('SIGTERM: draining'));
    const secondAt = performance.now();
    server.kill('SIGINT');
    // A hang bound only, well below the drain timeout (a server that waited that long for the drain fails here).
    const exit = await Promise.race([server.exited, sleep(DRAIN_TIMEOUT_MS / 2).then(() => null)]);
    if (exit === null) {
      server.kill('SIGKILL');
      await server.exited;
      expect.fail(`the second signal did not end the process within ${DRAIN_TIMEOUT_MS / 2} ms: ${server.stderr().slice(-600)}`);
    }
    const outcomes = await Promise.all(heavy);
    console.log(`second signal: exit ${exit.code} ${exit.signal} ${Math.round(exit.at - secondAt)} ms after it; the heavy requests: ${JSON.stringify(tally(outcomes))}`);
    // Killed by the second signal itself (a shell shows status 130): not process.exit, which would join the
    // threads and abort on a gateway still holding sockets (SIGABRT).
    expect({ code: exit.code, signal: exit.signal }, server.stderr().slice(-600)).toEqual({ code: null, signal: 'SIGINT' });
    expect(server.stderr()).toContain('SIGINT again, exiting now');
    // It did not drain: the drain would have ended with "stopped" and code 0...
    expect(server.stderr()).not.toContain('slabserve: stopped');
    // ...and only once every admitted heavy request had its 200. The process went first: at least one of
    // them lost its connection instead, and every one of those ended after the second signal (ordering,
    // not a time). Any other answered one was answered 200, or refused (429) when it arrived.
    const cut = outcomes.filter((o) => !('status' in o));
    expect(cut.length, JSON.stringify(tally(outcomes))).toBeGreaterThan(0);
    for (const o of cut) expect(o.doneAt, describeOutcome(o)).toBeGreaterThan(secondAt);
    for (const o of outcomes) if ('status' in o) expect(describeOutcome(o)).toMatch(/^(200|429 SLABSERVE_OVERLOADED)$/);
  });
});

// =================================================================== a server in a child process

/** A server in a child process (fixtures/supervised-server.mjs), where a broken supervisor aborts that process, not the test runner. */
interface ChildServer {
  /** What it logged so far. */
  logs(): string[];
  /** How it exited (stderr's tail with it), or null while it runs. */
  exit(): { code: number | null; signal: string | null; stderr: string } | null;
  /** A command on its stdin (fixtures/supervised-server.mjs). */
  send(command: string): void;
  /** Closes it: it must exit 0 after server.close(), with nothing fatal. */
  expectClosed(): Promise<void>;
  kill(): void;
}

/** Starts `config` in a child process and resolves once it is ready; SIGKILLed after `killAfterMs` whatever happens. */
async function startChildServer(config: ServerConfig, killAfterMs: number): Promise<ChildServer> {
  const child = spawn(process.execPath, [FIXTURE, JSON.stringify({ ...config, log: undefined })], { stdio: ['pipe', 'pipe', 'pipe'] });
  const lines: { type: string; line?: string; message?: string }[] = [];
  let stderr = '';
  let buffered = '';
  child.stdout!.on('data', (d: Buffer) => {
    buffered += d;
    for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
      lines.push(JSON.parse(buffered.slice(0, nl)));
      buffered = buffered.slice(nl + 1);
    }
  });
  child.stderr!.on('data', (d: Buffer) => (stderr += d));
  let exit: { code: number | null; signal: string | null } | null = null;
  const exited = new Promise<{ code: number | null; signal: string | null }>((r) => child.on('exit', (code, signal) => r((exit = { code, signal }))));
  const guard = setTimeout(() => child.kill('SIGKILL'), killAfterMs);
  const kill = () => {
    clearTimeout(guard);
    child.kill('SIGKILL');
  };
  try {
    await eventually('the child server ready', async () => lines.map((l) => l.type), (t) => t.includes('ready') || t.includes('fatal'), 40_000);
    expect(lines.find((l) => l.type === 'fatal')?.message).toBeUndefined();
  } catch (err) {
    kill();
    throw err;
  }
  return {
    logs: () => lines.filter((l) => l.type === 'log').map((l) => l.line!),
    exit: () => exit && { ...exit, stderr: stderr.slice(-600) },
    send: (command) => child.stdin!.write(`${command}\n`),
    async expectClosed() {
      child.stdin!.write('close\n');
      const exit = await exited;
      expect({ code: exit.code, signal: exit.signal }, stderr.slice(-600)).toEqual({ code: 0, signal: null });
      expect(lines.some((l) => l.type === 'closed')).toBe(true);
    },
    kill,
  };
}

// =================================================================== a gateway thread

describe('gateway thread supervision (a child-process server: a broken supervisor aborts the process)', () => {
  it('a gateway thread dies of an uncaught error under load: its requests end (answered or connection reset, none hangs), its slots come back, a new thread rejoins the port', { timeout: 60_000 }, async () => {
    const rand = makeRandom('supervision gateway');
    const texts = randomTexts(rand, words, 32, 12);
    const port = await freePort();
    const config = testServerConfig({ models: ['tiny-embed'], batching: BATCHING, gatewayThreads: 2, port });
    const child = await startChildServer(config, 55_000);
    try {
      const before = await scrape(port);

      // Half the clients keep a connection; half open one per request (spread over both threads by the kernel).
      const outcomes: (Outcome & { texts: string[] })[] = [];
      let stop = false;
      let next = 0;
      const clients = Array.from({ length: 12 }, async (_, c) => {
        const agent = c % 2 === 0 ? new http.Agent({ keepAlive: true, maxSockets: 1 }) : undefined;
        while (!stop) {
          const inputs = [texts[next++ % texts.length]!];
          outcomes.push({ ...(await request(port, 'POST', '/embed', { inputs }, { ...(agent ? { agent } : { close: true }) })), texts: inputs });
        }
        agent?.destroy();
      });
      await eventually('answers before the fault', async () => outcomes.length, (n) => n >= 40);
      const faultAt = performance.now();
      child.send('gateway-fault 0');
      await eventually('the gateway thread listening again', async () => child.logs(), (ls) => ls.some((l) => l.includes('gateway thread 0 listening again')));
      const upAt = performance.now();
      await sleep(300);
      stop = true;
      await Promise.all(clients);

      const errors = outcomes.filter((o) => !('status' in o));
      console.log(`gateway: ${outcomes.length} requests: ${JSON.stringify(tally(outcomes))}; listening again ${Math.round(upAt - faultAt)} ms after the fault`);
      for (const o of outcomes) {
        // None hung; a request on the dying thread's connections may see its connection reset or closed, never a wrong answer.
        expect(describeOutcome(o)).not.toBe('error client timeout');
        if ('status' in o) expect(describeOutcome(o)).toBe('200');
        else expect(['ECONNRESET', 'ECONNREFUSED', 'EPIPE', 'socket hang up', 'response aborted', 'response ECONNRESET']).toContain(o.error);
      }
      expect(errors.every((o) => o.sentAt < upAt)).toBe(true);
      expect(await expectReferenceRows(outcomes)).toBeGreaterThan(40);

      const m = await eventually('every slot free', () => scrape(port), (x) => slotsInUse(x) === 0);
      expect(m.sum('slabserve_gateway_restarts_total', { reason: 'crash' }) - before.sum('slabserve_gateway_restarts_total', { reason: 'crash' })).toBe(1);
      // Both threads serve again: 48 requests on fresh connections all answered, and gateway 0 reports into the scrape.
      const fresh = await Promise.all(
        Array.from({ length: 48 }, async (_, i) => {
          const t = texts[i % texts.length]!;
          return { ...(await request(port, 'POST', '/embed', { inputs: t }, { close: true })), texts: [t] };
        }),
      );
      for (const o of fresh) expect(describeOutcome(o)).toBe('200');
      expect(await expectReferenceRows(fresh)).toBe(48);
      const m2 = await scrape(port);
      expect(m2.has('slabserve_gateway_event_loop_lag_seconds', { gateway: '0' })).toBe(true);
      expect(m2.has('slabserve_gateway_event_loop_lag_seconds', { gateway: '1' })).toBe(true);
      expect(m2.sum('slabserve_ready')).toBe(1);

      await child.expectClosed();
    } finally {
      child.kill();
    }
  });
});

// =================================================================== a run past the timeout, inside onnxruntime

describe('a batch runs past --inference-timeout-ms inside onnxruntime (a child-process server: terminated inside a native call, a thread aborts the process)', () => {
  /** Long enough that a batch of LONG_ROWS inputs of LONG_WORDS words runs past it on any CPU, short enough that a short batch never does. */
  const TIMEOUT_MS = 300;
  const LONG_ROWS = 128;
  const LONG_WORDS = 600;

  it('its thread is replaced once the run returns (the batch answered 503), the process lives, serves the reference rows, and exits 0', { timeout: 90_000 }, async () => {
    const rand = makeRandom('supervision native timeout');
    const port = await freePort();
    // One batch of 128 rows of 512 tokens (runs of 2 rows, one after another): seconds of onnxruntime on this 2-core VM.
    const config = testServerConfig({ models: ['tiny-embed'], port, inferenceTimeoutMs: TIMEOUT_MS, batching: { maxBatchSize: LONG_ROWS, maxBatchTokens: LONG_ROWS * 512 } });
    const child = await startChildServer(config, 80_000);
    try {
      // Every one cut to 512 tokens: all in the longest bucket, one batch.
      const long = Array.from({ length: LONG_ROWS }, () => Array.from({ length: LONG_WORDS }, () => words[Math.floor(rand() * words.length)]).join(' '));
      const cut = await request(port, 'POST', '/embed', { inputs: long, truncate: true }, { timeoutMs: 60_000 });
      expect(describeOutcome(cut)).toBe('503 SLABSERVE_INFERENCE_RESTARTED');
      const replaced = (ls: string[]) => ls.some((l) => l.includes('ready again after')) && ls.some((l) => l.includes('abandoned inference thread (epoch 0) has exited'));
      const logs = await eventually('the replacement ready and the old thread gone', async () => child.logs(), (ls) => replaced(ls) || child.exit() !== null, 30_000);
      expect(child.exit()).toBeNull(); // before native-gate.ts: SIGABRT, "terminate called after throwing an instance of 'Napi::Error'"
      expect(replaced(logs)).toBe(true);
      expect(logs.filter((l) => l.includes('inference thread run_timeout'))).toHaveLength(1);
      const m = await eventually('every slot free', () => scrape(port), (x) => slotsInUse(x) === 0);
      expect(m.sum('slabserve_inference_threads_abandoned')).toBe(0);
      const texts = randomTexts(rand, words, 16, 12);
      const later = await Promise.all(texts.map(async (t) => ({ ...(await request(port, 'POST', '/embed', { inputs: t })), texts: [t] })));
      for (const o of later) expect(describeOutcome(o)).toBe('200');
      expect(await expectReferenceRows(later)).toBe(16);
      await child.expectClosed();
    } finally {
      child.kill();
    }
  });
});
