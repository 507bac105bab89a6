/**
 * Fault and load tests against a real server: startServer() with testServerConfig
 * (real gateway thread, uWebSockets.js, the real inference thread and
 * onnxruntime on CPU, the generated tiny models), run in a child process
 * (test/fixtures/child-server.ts) so that a crash is a reported exit with its
 * stderr, and its resident memory can be read.
 *
 * What it checks:
 *  - Disconnect storm: 400 clients (240 HTTP keep-alive connections, 160
 *    WebSockets) send requests and go away at random points: in the middle of
 *    the request head, in the middle of a body (Content-Length or chunked),
 *    right after sending, while queued or running (FIN, destroy, or RST), a
 *    WebSocket closed or dropped with requests in flight, after cancels, or in
 *    the middle of a frame; some complete normally as a control. Every answer
 *    that does arrive equals the unbatched reference (test/helpers.ts);
 *    afterwards no slot is in use, nothing is queued, no thread error was
 *    logged, the disconnects were seen (cancellations by client_disconnect and
 *    ws_close, tokens saved), and a fresh request equals the reference.
 *  - Overload: capacity is estimated first (a closed loop that keeps every slot
 *    busy), then requests of 4 inputs arrive open-loop at three times that for
 *    5 s with 16 slots per model. Every request is answered within the client timeout:
 *    the admitted with the right row, the excess with 429 (or 503) in our
 *    error shape with Retry-After. Refusals never reach inference, by the
 *    server's own counters: it counted exactly the refusals this client
 *    received, it queued for the device exactly the requests answered 200, and
 *    the rows it ran are exactly their inputs. Timings (offered rate, medians,
 *    admitted share of capacity) are printed, never asserted: bench/ measures
 *    them. The server's RSS stays within a generous bound of its level before
 *    the overload, and afterwards it recovers fully (queue 0, slots 0, a normal
 *    request succeeds, correct). Run twice: with requests tokenized inline, and with
 *    requests over --inline-tokenize-chars, tokenized on the piscina pool (their slots are taken
 *    before tokenizing, so a refusal never waits in the pool's queue). Beside the second run, one
 *    keep-alive connection sends requests head first: while no slot is free the server answers
 *    429 before the body is sent (it never reads it), the body that follows is dropped, and the
 *    same connection then serves a request right; so does a fresh one; a pooled request that
 *    fails while tokenized (413) gives its slots back.
 *  - The tokenizer pool's queue (in process): past its bound a request is refused at once; one
 *    whose client went away leaves the queue; the rest are tokenized right.
 *
 * Replaying: each test prints `<name>: seed S` (test/helpers.ts makeRandom);
 * SLABSERVE_TEST_SEED=S npx vitest run test/faults.test.ts -t "<test name>"
 * draws the same clients, close points and texts (timing still varies: the
 * server's state at each close point is a race by nature).
 */
import net from 'node:net';
import { pack, unpack } from 'msgpackr';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { createTokenizePool } from '../dist/src/gateway/tokenize/pool.js';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { CancelledError, OverloadedError } from '../dist/src/shared/errors.js';
import { Cancellation } from '../dist/src/core/cancel.js';
import { ChildServer, eventually, sleep } from './fixtures/child-server.js';
import { chunk, requestHead, type Metrics } from './fixtures/http-client.js';
import { makeRandom, maxAbsDiff, Reference, testServerConfig, vocabularyWords } from './helpers.js';

const TOLERANCE = 1e-5;
const CLIENT_TIMEOUT_MS = 30_000;

let embedRef: Reference;
let intentRef: Reference;
let embedTok: TextTokenizer;
let intentTok: TextTokenizer;
let words: string[];
let labels: string[];
let dim: number;

beforeAll(async () => {
  embedRef = await Reference.open('tiny-embed');
  intentRef = await Reference.open('tiny-intent');
  embedTok = await loadTokenizer(embedRef.spec.tokenizerPath);
  intentTok = await loadTokenizer(intentRef.spec.tokenizerPath);
  words = vocabularyWords(embedRef.spec);
  labels = intentRef.spec.labels;
  dim = embedRef.spec.hiddenSize;
});

afterAll(async () => {
  await embedRef?.close();
  await intentRef?.close();
});

// ------------------------------------------------------------------ reference rows

const refEmbedding = async (text: string) => (await embedRef.rowOfText(embedTok, text)).slice(0, dim);
const refProbabilities = async (text: string) => (await intentRef.rowOfText(intentTok, text)).slice(0, labels.length);

/** A /predict answer for one input as probabilities by class id. */
function byClassId(got: { label: string; score: number }[]): Float32Array {
  const out = new Float32Array(labels.length).fill(NaN);
  for (const g of got) out[labels.indexOf(g.label)] = g.score;
  return out;
}

/** What is wrong with an answer to `texts` on `route` (rows must equal the reference), or null. */
async function wrongAnswer(route: '/embed' | '/predict', texts: string[], body: unknown): Promise<string | null> {
  if (!Array.isArray(body) || body.length !== texts.length) return `expected ${texts.length} rows, got ${JSON.stringify(body).slice(0, 200)}`;
  for (let i = 0; i < texts.length; i++) {
    const want = route === '/embed' ? await refEmbedding(texts[i]!) : await refProbabilities(texts[i]!);
    const got = route === '/embed' ? (body[i] as number[]) : byClassId(body[i] as { label: string; score: number }[]);
    const d = maxAbsDiff(got, want);
    if (!(d < TOLERANCE)) return `row ${i} off the reference by ${d}`;
  }
  return null;
}

const pick = <T>(rand: () => number, xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
const textOf = (rand: () => number, n: number) => Array.from({ length: n }, () => pick(rand, words)).join(' ');

// =================================================================== disconnect storm

const HTTP_KINDS = ['head', 'body', 'chunked', 'sent', 'queued', 'reset', 'complete'] as const;
const WS_KINDS = ['terminate-now', 'terminate-later', 'close-later', 'partial-frame', 'cancel-then-drop', 'complete'] as const;
type HttpKind = (typeof HTTP_KINDS)[number];
type WsKind = (typeof WS_KINDS)[number];

interface StormTally {
  http: Record<string, number>;
  ws: Record<string, number>;
  answers: number;
  /** Well-formed 429 / overloaded answers: right when the storm fills every slot (slots are held while a request is tokenized). */
  refused: number;
  wrong: string[];
  errors: string[];
}

/** Resolves once `socket` has received a complete HTTP response (Content-Length) after byte `from`, with it; null if it closes first. */
function readResponse(socket: net.Socket, state: { data: Buffer; closed: boolean }, timeoutMs: number): Promise<{ status: number; head: string; body: string } | null> {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const poll = () => {
      const d = state.data;
      const end = d.indexOf('\r\n\r\n');
      if (end >= 0) {
        const head = d.subarray(0, end).toString('latin1');
        const len = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0);
        if (d.length >= end + 4 + len) {
          state.data = d.subarray(end + 4 + len);
          return resolve({ status: Number(head.split(' ')[1]), head, body: d.subarray(end + 4, end + 4 + len).toString('utf8') });
        }
      }
      if (state.closed || socket.destroyed) return resolve(null);
      if (Date.now() - t0 > timeoutMs) return resolve(null);
      setTimeout(poll, 2);
    };
    poll();
  });
}

/** One HTTP keep-alive client: maybe a complete request first, then one that it abandons at its close point. */
async function httpClient(port: number, rand: () => number, kind: HttpKind, tally: StormTally): Promise<void> {
  const socket = net.connect(port, '127.0.0.1');
  const state = { data: Buffer.alloc(0), closed: false };
  socket.on('data', (d: Buffer) => (state.data = Buffer.concat([state.data, d])));
  socket.on('close', () => (state.closed = true));
  socket.on('error', () => {});
  try {
    await new Promise<void>((res, rej) => {
      socket.once('connect', res);
      socket.once('error', rej);
    });
    const request = () => {
      const route = rand() < 0.5 ? ('/embed' as const) : ('/predict' as const);
      const texts = Array.from({ length: 1 + Math.floor(rand() * 16) }, () => textOf(rand, 10 + Math.floor(rand() * 60)));
      const body = JSON.stringify({ inputs: texts });
      return { route, texts, body, head: requestHead('POST', route, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }) };
    };
    const check = async (r: ReturnType<typeof request>, got: { status: number; body: string } | null, what: string) => {
      if (!got) return tally.errors.push(`${what}: no answer on an open keep-alive connection`);
      if (got.status === 429 && (JSON.parse(got.body) as { type?: string }).type === 'overloaded') return tally.refused++;
      if (got.status !== 200) return tally.errors.push(`${what}: status ${got.status}: ${got.body.slice(0, 200)}`);
      tally.answers++;
      const wrong = await wrongAnswer(r.route, r.texts, JSON.parse(got.body));
      if (wrong) tally.wrong.push(`${what} ${r.route}: ${wrong}`);
    };
    // Half the clients reuse their connection: one complete exchange first.
    if (kind === 'complete' || rand() < 0.5) {
      const r = request();
      socket.write(r.head + r.body);
      await check(r, await readResponse(socket, state, CLIENT_TIMEOUT_MS), `http ${kind} (first request)`);
      if (kind === 'complete') return;
    }
    const r = request();
    const all = Buffer.from(r.head + r.body);
    switch (kind) {
      case 'head':
        socket.write(all.subarray(0, 1 + Math.floor(rand() * (r.head.length - 2))));
        break;
      case 'body':
        socket.write(all.subarray(0, r.head.length + Math.floor(rand() * r.body.length)));
        break;
      case 'chunked': {
        socket.write(requestHead('POST', r.route, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' }));
        const cut = Math.floor(rand() * r.body.length);
        socket.write(chunk(r.body.slice(0, cut)));
        if (rand() < 0.5) socket.write(Buffer.from('ff\r\n{"x'));
        break;
      }
      default:
        socket.write(all);
    }
    if (kind === 'queued' || kind === 'reset') await sleep(1 + rand() * 40);
    else if (rand() < 0.5) await new Promise((res) => setImmediate(res));
    const how = kind === 'reset' ? 'rst' : pick(rand, ['end', 'destroy', 'rst'] as const);
    tally.http[`${kind}/${how}`] = (tally.http[`${kind}/${how}`] ?? 0) + 1;
    if (how === 'end') socket.end();
    else if (how === 'destroy') socket.destroy();
    else socket.resetAndDestroy();
  } finally {
    if (!socket.destroyed) await sleep(20).then(() => socket.destroy());
  }
}

/** One WebSocket client: several requests in flight, then it goes away as `kind` says. */
async function wsClient(port: number, rand: () => number, kind: WsKind, tally: StormTally): Promise<void> {
  const ws = await new Promise<WebSocket>((res, rej) => {
    const w = new WebSocket(`ws://127.0.0.1:${port}/ws`);
    w.once('open', () => res(w));
    w.once('error', rej);
  });
  ws.on('error', () => {});
  const sent = new Map<string, { route: '/embed' | '/predict'; texts: string[] }>();
  const checks: Promise<void>[] = [];
  let answered = 0;
  ws.on('message', (data: Buffer) => {
    const f = unpack(data) as { id?: string; result?: unknown; error?: { type: string } };
    const req = typeof f.id === 'string' ? sent.get(f.id) : undefined;
    if (!req) return tally.errors.push(`ws ${kind}: an answer to no request: ${JSON.stringify(f).slice(0, 200)}`);
    answered++;
    if (f.error) {
      if (f.error.type === 'overloaded') tally.refused++;
      else if (f.error.type !== 'cancelled') tally.errors.push(`ws ${kind}: ${JSON.stringify(f.error)}`);
      return;
    }
    tally.answers++;
    checks.push(wrongAnswer(req.route, req.texts, f.result).then((w) => void (w && tally.wrong.push(`ws ${kind} ${req.route}: ${w}`))));
  });
  const closed = new Promise<void>((res) => ws.once('close', () => res()));
  const n = 1 + Math.floor(rand() * 12);
  for (let i = 0; i < n; i++) {
    const route = rand() < 0.5 ? ('/embed' as const) : ('/predict' as const);
    const texts = Array.from({ length: 1 + Math.floor(rand() * 12) }, () => textOf(rand, 10 + Math.floor(rand() * 60)));
    const id = `r${i}`;
    sent.set(id, { route, texts });
    ws.send(pack({ id, op: route.slice(1), inputs: texts }));
  }
  const socket = (ws as unknown as { _socket: net.Socket })._socket;
  tally.ws[kind] = (tally.ws[kind] ?? 0) + 1;
  switch (kind) {
    case 'terminate-now':
      ws.terminate();
      break;
    case 'terminate-later':
      await sleep(1 + rand() * 40);
      ws.terminate();
      break;
    case 'close-later':
      await sleep(1 + rand() * 40);
      ws.close(1000);
      break;
    case 'partial-frame':
      // A binary frame header announcing 4 KiB, masked, and a few of its bytes: then the TCP connection drops.
      await sleep(rand() * 20);
      socket.write(Buffer.from([0x82, 0xfe, 0x10, 0x00, 1, 2, 3, 4, 9, 9, 9]));
      await new Promise((res) => setImmediate(res));
      socket.destroy();
      break;
    case 'cancel-then-drop':
      for (let i = 0; i < n; i += 2) ws.send(pack({ op: 'cancel', id: `r${i}` }));
      await sleep(rand() * 20);
      ws.terminate();
      break;
    case 'complete': {
      const t0 = Date.now();
      while (answered < n && Date.now() - t0 < CLIENT_TIMEOUT_MS) await sleep(5);
      if (answered < n) tally.errors.push(`ws complete: ${answered} of ${n} answered within ${CLIENT_TIMEOUT_MS} ms`);
      ws.close(1000);
      break;
    }
  }
  await Promise.race([closed, sleep(5_000)]);
  ws.terminate();
  await Promise.all(checks);
}

describe('disconnect storm', () => {
  let server: ChildServer;
  const MODELS = ['tiny-embed', 'tiny-intent'];

  beforeAll(async () => {
    server = await ChildServer.start('storm', testServerConfig({ models: MODELS, maxClientBatchSize: 16, batching: { maxBatchTokens: 2048 } }));
  });

  afterAll(async () => {
    await server?.stop();
  });

  it('400 clients (HTTP keep-alive and WebSocket) go away at random points: no slot leaks, no thread error, every answer right, and the server answers correctly after', { timeout: 90_000 }, async () => {
    const rand = makeRandom('faults storm');
    const before = await server.scrape();
    const tally: StormTally = { http: {}, ws: {}, answers: 0, refused: 0, wrong: [], errors: [] };
    const clients: (() => Promise<void>)[] = [];
    for (let i = 0; i < 240; i++) {
      const kind = HTTP_KINDS[i % HTTP_KINDS.length]!;
      clients.push(() => httpClient(server.port, rand, kind, tally));
    }
    for (let i = 0; i < 160; i++) {
      const kind = WS_KINDS[i % WS_KINDS.length]!;
      clients.push(() => wsClient(server.port, rand, kind, tally));
    }
    // Shuffled, and spread over ~2 s so that some hundred are in flight at any moment.
    for (let i = clients.length - 1; i > 0; i--) {
      const j = Math.floor(rand() * (i + 1));
      [clients[i], clients[j]] = [clients[j]!, clients[i]!];
    }
    const starts = clients.map(() => rand() * 2_000);
    const t0 = Date.now();
    const results = await Promise.allSettled(clients.map((c, i) => sleep(starts[i]!).then(c)));
    const failed = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected').map((r) => String(r.reason));
    console.log(`faults storm: ${clients.length} clients in ${Date.now() - t0} ms; http ${JSON.stringify(tally.http)}; ws ${JSON.stringify(tally.ws)}; ${tally.answers} answers received, ${tally.refused} refused (429, all slots taken)`);
    server.assertAlive();
    expect(failed, 'clients that could not even connect').toEqual([]);
    expect(tally.errors.slice(0, 10)).toEqual([]);
    expect(tally.wrong.slice(0, 10)).toEqual([]);
    expect(tally.answers).toBeGreaterThan(0);

    const after = await server.expectHealthy(MODELS);
    // The disconnects were seen, and some while requests were still queued (their tokens never ran).
    const delta = (name: string, labels: Record<string, string> = {}) => after.sum(name, labels) - before.sum(name, labels);
    const seen = {
      clientDisconnect: delta('slabserve_cancellations_total', { reason: 'client_disconnect' }),
      wsClose: delta('slabserve_cancellations_total', { reason: 'ws_close' }),
      wsCancel: delta('slabserve_cancellations_total', { reason: 'ws_cancel' }),
      savedTokens: delta('slabserve_cancelled_tokens_total', { outcome: 'saved' }),
      skippedByDevice: delta('slabserve_requests_cancelled_total'),
    };
    console.log(`faults storm: cancellations ${JSON.stringify(seen)}`);
    expect(seen.clientDisconnect).toBeGreaterThan(0);
    expect(seen.wsClose).toBeGreaterThan(0);
    expect(seen.savedTokens).toBeGreaterThan(0);

    // A fresh request is answered, and right.
    const texts = [textOf(rand, 12), textOf(rand, 40)];
    for (const route of ['/embed', '/predict'] as const) {
      const r = await fetch(`${server.url}${route}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: texts }), signal: AbortSignal.timeout(CLIENT_TIMEOUT_MS) });
      expect(r.status).toBe(200);
      expect(await wrongAnswer(route, texts, await r.json())).toBeNull();
    }
    await server.expectHealthy(MODELS);
  });
});

// =================================================================== overload

interface Outcome {
  status: number;
  ms: number;
  at: number;
  texts?: string[];
  body?: unknown;
  retryAfter?: string | null;
  error?: string;
}

async function timedEmbed(base: string, texts: string[]): Promise<Outcome> {
  const t0 = performance.now();
  try {
    const r = await fetch(`${base}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: texts }), signal: AbortSignal.timeout(CLIENT_TIMEOUT_MS) });
    const body = (await r.json()) as unknown;
    return { status: r.status, ms: performance.now() - t0, at: t0, texts, body, retryAfter: r.headers.get('retry-after') };
  } catch (err) {
    return { status: 0, ms: performance.now() - t0, at: t0, texts, error: `${(err as Error).name}: ${(err as Error).message}` };
  }
}

/**
 * Median of the server's own request durations with `status` between two scrapes
 * (slabserve_request_duration_seconds, interpolated within its bucket), ms.
 */
function serverMedianMs(before: Metrics, after: Metrics, status: string): number {
  const name = 'slabserve_request_duration_seconds_bucket';
  const les = [...new Set(after.samples.filter((x) => x.name === name).map((x) => x.labels.le!))].map(Number).sort((a, b) => a - b);
  const cum = (le: number) => {
    const l = le === Infinity ? '+Inf' : String(le);
    return after.sum(name, { le: l, status }) - before.sum(name, { le: l, status });
  };
  const total = cum(Infinity);
  if (total === 0) return NaN;
  let lo = 0;
  let below = 0;
  for (const le of les) {
    const c = cum(le);
    if (c >= total / 2) return le === Infinity ? Infinity : (lo + ((le - lo) * (total / 2 - below)) / Math.max(1, c - below)) * 1000;
    lo = le;
    below = c;
  }
  return Infinity;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)]! : NaN;
};

/** What ran beside an overload: its requests (INPUTS inputs each) answered 200, and those answered 429. */
interface Beside {
  admitted: number;
  refused: number;
}

/** What an overload run measured: the figures printed, and every outcome. */
interface OverloadRun {
  figures: Record<string, number>;
  ok: Outcome[];
  refused: Outcome[];
}

describe('overload at three times capacity', () => {
  const SLOTS = 16;
  /** Inputs per request: each takes that many slots, so the server saturates at a request rate this client can triple. */
  const INPUTS = 4;
  // One onnxruntime thread: on a 2-core machine the default (one per core, spinning) leaves the
  // gateway thread, which answers the refusals, no core of its own. One gateway thread (testServerConfig's):
  // the head-first probe below orders events on it.
  const CONFIG = testServerConfig({ models: ['tiny-embed'], slotsPerModel: SLOTS, maxClientBatchSize: INPUTS, intraOpThreads: 1, batching: { maxBatchTokens: 2048 } });
  /** The server's --inline-tokenize-chars, its default (SERVER_DEFAULTS in the built server): requests with more characters, all inputs together, go to the tokenizer pool. */
  const INLINE_CHARS = CONFIG.inlineTokenizeChars;
  let server: ChildServer;

  beforeAll(async () => {
    expect(CONFIG.gatewayThreads).toBe(1);
    server = await ChildServer.start('overload', CONFIG);
  });

  afterAll(async () => {
    await server?.stop();
  });

  /**
   * Capacity by a closed loop (every slot busy), then requests from `request` open-loop at three times
   * that for 5 s while `during` runs (it returns how many of its requests, of INPUTS inputs each, were
   * answered 200 and how many 429). Checks what every overload must show: every request answered (200 or
   * a refusal in our shape with Retry-After), some refused and some admitted, every admitted row equal to
   * the reference, refusals that never reached inference (the server's counters: refusals counted = 429s
   * received, requests queued for the device = requests answered 200, rows run = their inputs), RSS
   * bounded. Prints the figures (rates and times: printed only).
   */
  async function overload(name: string, request: () => string[], during: (stopAt: number) => Promise<Beside> = async () => ({ admitted: 0, refused: 0 })): Promise<OverloadRun> {
    const closedLoop = async (ms: number) => {
      const outs: Outcome[] = [];
      const t0 = Date.now();
      await Promise.all(
        Array.from({ length: SLOTS / INPUTS }, async () => {
          while (Date.now() - t0 < ms) {
            const o = await timedEmbed(server.url, request());
            outs.push(o);
            if (o.status !== 200) await sleep(5); // a slot not yet freed: no busy retry loop
          }
        }),
      );
      return { outs, seconds: (Date.now() - t0) / 1000 };
    };
    await closedLoop(500);
    const cap = await closedLoop(2_500);
    const capacity = cap.outs.filter((o) => o.status === 200).length / cap.seconds;
    expect(cap.outs.filter((o) => o.status !== 200 && o.status !== 429).map((o) => `${o.status} ${o.error ?? ''}`)).toEqual([]);
    // The closed loop was served (a count: the rate derived from it only sizes the load below).
    expect(cap.outs.filter((o) => o.status === 200).length).toBeGreaterThan(0);
    await eventually('slots back after the capacity run', () => server.scrape(), (m) => m.sum('slabserve_slots_in_use', { model: 'tiny-embed' }) === 0);
    const rssBefore = server.rssBytes();
    const metricsBefore = await server.scrape();

    // Open loop at 3x capacity for 5 s: arrivals on a fixed schedule, whatever the answers do.
    const rate = 3 * capacity;
    const DURATION_MS = 5_000;
    const total = Math.round((rate * DURATION_MS) / 1000);
    const pending: Promise<Outcome>[] = [];
    let rssMax = rssBefore;
    const sampler = setInterval(() => {
      try {
        rssMax = Math.max(rssMax, server.rssBytes());
      } catch {
        /* the process is gone: reported below */
      }
    }, 100);
    const t0 = performance.now();
    try {
      const beside = during(t0 + DURATION_MS);
      while (pending.length < total) {
        const due = Math.min(total, Math.floor(((performance.now() - t0) / 1000) * rate) + 1);
        while (pending.length < due) pending.push(timedEmbed(server.url, request()));
        await sleep(2);
      }
      const offeredSeconds = (performance.now() - t0) / 1000;
      const outs = await Promise.all(pending);
      const besideRun = await beside;
      const spanSeconds = (Math.max(...outs.map((o) => o.at + o.ms)) - t0) / 1000;
      rssMax = Math.max(rssMax, server.rssBytes());
      clearInterval(sampler);
      const ok = outs.filter((o) => o.status === 200);
      const admittedInputs = (ok.length + besideRun.admitted) * INPUTS;
      const delta = (m: Metrics, name: string, labels: Record<string, string> = {}) => m.sum(name, labels) - metricsBefore.sum(name, labels);
      const rowsRun = (m: Metrics) => delta(m, 'slabserve_batch_size_sum', { model: 'tiny-embed' });
      // The inference thread counts a batch as it finishes it, beside the answers: wait for the count to catch up.
      const metricsAfter = await eventually('the batch count caught up with the answers', () => server.scrape(), (m) => rowsRun(m) >= admittedInputs);

      const refused = outs.filter((o) => o.status === 429 || o.status === 503);
      const received429 = refused.filter((o) => o.status === 429).length + besideRun.refused;
      /** What the server itself counted during the overload: refusals, requests queued for the device, inputs served. */
      const counted = {
        refusedOverloaded: delta(metricsAfter, 'slabserve_request_failures_total', { reason: 'overloaded' }),
        refusedUnavailable: delta(metricsAfter, 'slabserve_request_failures_total', { reason: 'unavailable' }),
        queuedForDevice: delta(metricsAfter, 'slabserve_request_queue_duration_seconds_count', { model: 'tiny-embed' }),
        inputsServed: delta(metricsAfter, 'slabserve_request_inputs_total', { model: 'tiny-embed' }),
        rowsRun: rowsRun(metricsAfter),
      };
      const other = outs.filter((o) => o.status !== 200 && o.status !== 429 && o.status !== 503);
      const admittedPerS = ok.length / spanSeconds;
      const figures = {
        capacityPerS: Math.round(capacity),
        offeredPerS: Math.round(total / offeredSeconds),
        requests: total,
        admitted: ok.length,
        refused429: refused.filter((o) => o.status === 429).length,
        refused503: refused.filter((o) => o.status === 503).length,
        other: other.length,
        admittedPerS: Math.round(admittedPerS),
        admittedShareOfCapacity: Math.round((admittedPerS / capacity) * 100) / 100,
        median200Ms: Math.round(median(ok.map((o) => o.ms)) * 10) / 10,
        median429Ms: Math.round(median(refused.map((o) => o.ms)) * 10) / 10,
        serverMedian200Ms: Math.round(serverMedianMs(metricsBefore, metricsAfter, '200') * 10) / 10,
        serverMedian429Ms: Math.round(serverMedianMs(metricsBefore, metricsAfter, '429') * 10) / 10,
        gatewayLoopLagP99Ms: Math.round(metricsAfter.sum('slabserve_gateway_event_loop_lag_seconds') * 1e4) / 10,
        rssBeforeMiB: Math.round(rssBefore / 2 ** 20),
        rssGrowthMiB: Math.round((rssMax - rssBefore) / 2 ** 20),
      };
      console.log(`faults overload (${name}): ${JSON.stringify(figures)}; the server counted ${JSON.stringify(counted)}`);
      server.assertAlive();

      // Every request was answered (none timed out, none lost), with 200 or a refusal.
      expect(other.map((o) => `${o.status} ${o.error ?? JSON.stringify(o.body).slice(0, 200)}`).slice(0, 10)).toEqual([]);
      // The load really was an overload: every slot was taken at some point (a 429 says so), and some
      // requests were still admitted. (The offered rate over wall time is printed, not compared.)
      expect(refused.length).toBeGreaterThan(0);
      expect(ok.length).toBeGreaterThan(0);
      // Refusals in our error shape, with Retry-After.
      for (const o of refused.slice(0, 50)) {
        expect(o.body).toEqual({ error: expect.any(String), error_type: o.status === 429 ? 'Overloaded' : 'Unhealthy', type: o.status === 429 ? 'overloaded' : 'unavailable', code: expect.any(String) });
        if (o.status === 429) expect(o.retryAfter).toMatch(/^\d+$/);
      }
      // Every admitted request got its own row.
      const wrong: string[] = [];
      for (const o of ok) {
        const w = await wrongAnswer('/embed', o.texts!, o.body);
        if (w) wrong.push(w);
      }
      expect(wrong.slice(0, 5)).toEqual([]);
      // Refused without reaching inference, by the server's own counters (its medians are printed above,
      // not compared: how long anything took is bench/'s to measure). It counted every refusal this client
      // received, and no other; it queued for the device exactly the requests answered 200 (a refusal never
      // entered the queue); and the rows it ran are exactly their inputs (none refused ran, none admitted
      // ran twice).
      expect({ refusedOverloaded: counted.refusedOverloaded, refusedUnavailable: counted.refusedUnavailable }).toEqual({
        refusedOverloaded: received429,
        refusedUnavailable: figures.refused503,
      });
      expect(counted.queuedForDevice).toBe(ok.length + besideRun.admitted);
      expect(counted.inputsServed).toBe(admittedInputs);
      expect(counted.rowsRun).toBe(admittedInputs);
      // Memory stays bounded: nothing piles up per refused or queued request.
      expect(rssMax - rssBefore).toBeLessThan(256 * 2 ** 20);
      return { figures, ok, refused };
    } finally {
      clearInterval(sampler);
    }
  }

  /** `count` texts of tiny-embed's vocabulary (then `tail`), each `minChars`..`maxChars` long, with their reference rows computed. */
  async function textPool(rand: () => number, count: number, minChars: number, maxChars: number, words: [number, number], tail = ''): Promise<string[]> {
    const pool: string[] = [];
    while (pool.length < count) {
      const t = textOf(rand, words[0] + Math.floor(rand() * (words[1] - words[0]))) + tail;
      if (t.length >= minChars && t.length <= maxChars) pool.push(t);
    }
    for (const t of pool) await refEmbedding(t);
    return pool;
  }

  it('excess is refused (429) without reaching inference, every admitted request is answered right, RSS stays bounded, and the server recovers', { timeout: 90_000 }, async () => {
    const rand = makeRandom('faults overload');
    // Requests under --inline-tokenize-chars (all inputs together): tokenized on the gateway's
    // event loop. (The next test sends requests that go through the tokenizer pool.)
    const pool = await textPool(rand, 12, 0, 240, [12, 28]);
    const request = () => Array.from({ length: INPUTS }, () => pick(rand, pool));
    expect(INPUTS * 240).toBeLessThanOrEqual(INLINE_CHARS);
    await overload('inline tokenizing', request);

    // Recovery: nothing queued, no slot in use, a normal request succeeds and is right.
    await server.expectHealthy(['tiny-embed']);
    const texts = request();
    const after = await timedEmbed(server.url, texts);
    expect(after.status).toBe(200);
    expect(await wrongAnswer('/embed', texts, after.body)).toBeNull();
  });

  it('requests tokenized on the pool are refused before inference too; a refusal sent before its body leaves the keep-alive connection serving', { timeout: 90_000 }, async () => {
    const rand = makeRandom('faults overload pooled');
    // Every request holds more than --inline-tokenize-chars (four texts of 280-400 characters, 35-60
    // tokens each, each with a non-ASCII word: the inline rule counts them whole, at the library's
    // pace): it is tokenized on the gateway's piscina pool, not on its event loop.
    const pool = await textPool(rand, 12, 280, 400, [34, 56], ' naïve');
    for (const t of pool) expect(embedTok.paceChars(t)).toBe(t.length);
    const request = () => Array.from({ length: INPUTS }, () => pick(rand, pool));
    expect(INPUTS * 280).toBeGreaterThan(INLINE_CHARS);

    // Beside the load, one keep-alive connection sends requests head first: while no slot is free the
    // server answers 429 without waiting for the body; the body sent after that answer is read and
    // dropped, and the next request on the connection is served.
    const socket = net.connect(server.port, '127.0.0.1');
    const state = { data: Buffer.alloc(0), closed: false };
    socket.on('data', (d: Buffer) => (state.data = Buffer.concat([state.data, d])));
    socket.on('close', () => (state.closed = true));
    socket.on('error', () => {});
    await new Promise<void>((res, rej) => {
      socket.once('connect', res);
      socket.once('error', rej);
    });
    const probe = { early: 0, afterBody: { 200: 0, 429: 0 } as Record<number, number>, errors: [] as string[] };
    /** Sends head-first requests until `stopAt`; returns how many were answered 200, and how many 429 (before or after their body). */
    const headFirst = async (stopAt: number): Promise<Beside> => {
      while (performance.now() < stopAt && probe.errors.length === 0) {
        const texts = request();
        const body = JSON.stringify({ inputs: texts });
        socket.write(requestHead('POST', '/embed', { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }));
        // Refused before its body, or waiting for it? Once the gateway thread has answered a request sent after
        // this head (/livez, on another connection: it reads its sockets in the order they became readable), it
        // has read this head, and an answer to it, if it gave one, was sent before that one.
        await (await fetch(`${server.url}/livez`, { signal: AbortSignal.timeout(CLIENT_TIMEOUT_MS) })).arrayBuffer();
        const early = state.data.length > 0 ? await readResponse(socket, state, CLIENT_TIMEOUT_MS) : null;
        if (early) {
          probe.early++;
          if (early.status !== 429) probe.errors.push(`an answer before the body: ${early.status} ${early.body.slice(0, 200)}`);
          else if (!/\r\nretry-after: *\d+/i.test(early.head)) probe.errors.push(`an early 429 without Retry-After: ${early.head}`);
          // The body follows anyway (HTTP framing: it was announced), in two writes.
          socket.write(body.slice(0, 100));
          await sleep(5);
          socket.write(body.slice(100));
        } else {
          if (state.closed) probe.errors.push('the server closed the connection before the body was sent');
          socket.write(body);
          const r = await readResponse(socket, state, CLIENT_TIMEOUT_MS);
          if (!r) probe.errors.push('no answer after the body');
          else if (r.status === 200) {
            const w = await wrongAnswer('/embed', texts, JSON.parse(r.body));
            if (w) probe.errors.push(`head-first request: ${w}`);
          } else if (r.status !== 429) probe.errors.push(`after the body: ${r.status} ${r.body.slice(0, 200)}`);
          if (r) probe.afterBody[r.status] = (probe.afterBody[r.status] ?? 0) + 1;
        }
        await sleep(10);
      }
      return { admitted: probe.afterBody[200] ?? 0, refused: probe.early + (probe.afterBody[429] ?? 0) };
    };
    try {
      const run = await overload('pooled tokenizing', request, headFirst);
      console.log(`faults overload (pooled tokenizing): head-first requests ${JSON.stringify(probe)}`);
      expect(probe.errors.slice(0, 5)).toEqual([]);
      // Some were refused before their body was read (the server is overloaded most of the time).
      expect(probe.early).toBeGreaterThan(0);
      expect(run.refused.length).toBeGreaterThan(0);

      // Recovery: nothing queued, no slot in use (no reservation leaked), then the same keep-alive
      // connection serves a normal request with the right row and nothing stray after it.
      await server.expectHealthy(['tiny-embed']);
      const texts = request();
      const body = JSON.stringify({ inputs: texts });
      state.data = Buffer.alloc(0);
      socket.write(requestHead('POST', '/embed', { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }) + body);
      const r = await readResponse(socket, state, CLIENT_TIMEOUT_MS);
      expect(r?.status, r?.body).toBe(200);
      expect(await wrongAnswer('/embed', texts, JSON.parse(r!.body))).toBeNull();
      // Nothing stray after it: the next answer on the connection is the next request's.
      socket.write(requestHead('GET', '/livez', {}));
      const next = await readResponse(socket, state, CLIENT_TIMEOUT_MS);
      expect({ status: next?.status, body: next?.body }).toEqual({ status: 200, body: JSON.stringify({ status: 'alive' }) });
      expect(state.data.length).toBe(0);
      expect(state.closed).toBe(false);
    } finally {
      socket.destroy();
    }

    // A fresh connection is served too; a pooled request that fails while tokenized (an input over the
    // model's 512 tokens, without truncate) gives its slots back.
    const fresh = await timedEmbed(server.url, request());
    expect(fresh.status).toBe(200);
    const tooLong = await timedEmbed(server.url, [...request().slice(1), textOf(rand, 700)]);
    expect(tooLong.status).toBe(413);
    await server.expectHealthy(['tiny-embed']);
  });
});

// =================================================================== the tokenizer pool's queue

describe("the tokenizer pool's queue", () => {
  it('refuses at once past its bound (429), lets a waiting request whose client went away leave, and tokenizes the rest in order, right', { timeout: 60_000 }, async () => {
    const rand = makeRandom('faults tokenizer queue');
    const pool = createTokenizePool(1, { maxQueue: 2 });
    try {
      const model = { plan: { spec: { tokenizerPath: embedRef.spec.tokenizerPath } } } as unknown as Parameters<typeof pool.tokenize>[0];
      const opts = { maxLength: embedRef.spec.maxLength, truncate: true };
      const batch = () => Array.from({ length: 64 }, () => textOf(rand, 60));
      const batches = Array.from({ length: 4 }, batch);
      const gone = new Cancellation();
      // All in one turn: the first runs, the next two wait (the bound), the fourth is refused at once.
      const running = pool.tokenize(model, batches[0]!, opts);
      const leaving = pool.tokenize(model, batches[1]!, opts, gone);
      const waiting = pool.tokenize(model, batches[2]!, opts);
      const refused = pool.tokenize(model, batches[3]!, opts);
      expect([pool.running, pool.waiting]).toEqual([1, 2]);
      await expect(refused).rejects.toBeInstanceOf(OverloadedError);
      gone.cancel('client_disconnect');
      await expect(leaving).rejects.toBeInstanceOf(CancelledError);
      expect(pool.waiting).toBe(1);
      for (const [i, p] of [[0, running] as const, [2, waiting] as const]) {
        const got = await p;
        expect(got.length).toBe(64);
        batches[i]!.forEach((t, k) => expect(Array.from(got[k]!.ids)).toEqual(Array.from(embedTok.encode(t, opts).ids)));
      }
      expect([pool.running, pool.waiting]).toEqual([0, 0]);
      // Room again once the queue has drained.
      expect((await pool.tokenize(model, batches[3]!, opts)).length).toBe(64);
    } finally {
      await pool.close();
    }
  });
});
