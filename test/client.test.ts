/**
 * SlabClient (WebSocket) and SlabHttpClient against fake servers that speak
 * the protocol with random delays (so answers come out of order), then
 * against the real server (src/gateway/ws/api.ts and the HTTP routes).
 *
 * Nothing here asserts on time: timeouts only bound waits, and every wait is
 * for an event (a frame seen by the fake server, a promise settling).
 */
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket as NodeWebSocket } from 'ws';
import {
  backoffDelay,
  decodeF32,
  decodeRows,
  parseRetryAfter,
  SlabAbortError,
  SlabClient,
  SlabClientError,
  SlabConnectionError,
  SlabHttpClient,
  SlabUnauthorizedError,
  fromHttpError,
  toWebSocketUrl,
  typeOfStatus,
  wsKeyProtocol,
  type SlabClientEvent,
  type SlabClientOptions,
  type WebSocketConstructor,
} from '../dist/src/client/index.js';
import { mulberry32 } from '../dist/models/generator/rng.js';
import { fakePredictions, fakeRerank, fakeRow, fakeTokens, FakeHttpServer, FakeWsServer, type FakeWsOptions } from './fixtures/fake-slab-server.js';
import { loadTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { portOutsideEphemeral } from './cli-process.js';
import { PlainReference } from './helpers.js';

const seed = Number(process.env.SLABSERVE_TEST_SEED ?? Math.floor(Math.random() * 2 ** 31));
console.log(`client.test: seed ${seed}`);
const rand = mulberry32(seed);

/** The error a promise rejects with (fails the test if it resolves). */
async function rejection(p: Promise<unknown>): Promise<SlabClientError> {
  try {
    await p;
  } catch (err) {
    return err as SlabClientError;
  }
  throw new Error('expected the call to reject, it resolved');
}

/** Marks a promise handled now (it is awaited later, after it may have rejected). */
/** Polls a condition the client exposes (state, counters) until it holds. */
async function until(cond: () => boolean): Promise<void> {
  while (!cond()) await new Promise((r) => setTimeout(r, 2));
}

function later<T>(p: Promise<T>): Promise<T> {
  p.catch(() => {});
  return p;
}

/** Real-server rows: batching changes the padded shape, so low bits may differ. */
function expectRowsClose(a: Float32Array[], b: Float32Array[]): void {
  expect(a.length).toBe(b.length);
  a.forEach((row, i) => {
    expect(row.length).toBe(b[i]!.length);
    const worst = row.reduce((m, v, j) => Math.max(m, Math.abs(v - b[i]![j]!)), 0);
    expect(worst).toBeLessThan(1e-4);
  });
}

const f32 = (row: number[]) => Array.from(Float32Array.from(row));
const words = ['where', 'is', 'my', 'parcel', 'refund', 'cancel', 'plan', 'password', 'hello', 'agent'];
const randomText = () => Array.from({ length: 1 + Math.floor(rand() * 6) }, () => words[Math.floor(rand() * words.length)]).join(' ');

describe('SlabClient over a fake /ws server', () => {
  let server: FakeWsServer;
  const clients: SlabClient[] = [];
  const connect = async (opts: SlabClientOptions = {}, srv: FakeWsServer = server) => {
    const c = await SlabClient.connect(srv.url, opts);
    clients.push(c);
    return c;
  };
  const start = async (opts: Omit<FakeWsOptions, 'rand'> = {}) => {
    server = await FakeWsServer.start({ rand, ...opts });
    return server;
  };

  afterEach(async () => {
    await Promise.all(clients.splice(0).map((c) => c.close()));
    await server?.close();
  });

  it('pipelines hundreds of requests on one socket and matches out-of-order answers by id', async () => {
    await start({ maxDelayMs: 15 });
    const client = await connect({ credit: 32 });
    const checks: Promise<void>[] = [];
    for (let i = 0; i < 300; i++) {
      const kind = i % 6;
      const texts = Array.from({ length: 1 + (i % 3) }, randomText);
      if (kind === 0) checks.push(client.embed(texts).then((rows) => expect(rows.map((r) => Array.from(r))).toEqual(texts.map((t) => f32(fakeRow(t))))));
      else if (kind === 1) checks.push(client.embed(texts[0]!).then((rows) => expect(rows.map((r) => Array.from(r))).toEqual([f32(fakeRow(texts[0]!))])));
      else if (kind === 2) checks.push(client.predict(texts[0]!).then((p) => expect(p).toEqual(fakePredictions(texts[0]!))));
      else if (kind === 3) checks.push(client.predict(texts).then((p) => expect(p).toEqual(texts.map(fakePredictions))));
      else if (kind === 4) checks.push(client.rerank(texts[0]!, texts, { returnText: true }).then((h) => expect(h).toEqual(fakeRerank(texts[0]!, texts, true))));
      else checks.push(client.tokenize(texts).then((t) => expect(t).toEqual(texts.map(fakeTokens))));
    }
    await Promise.all(checks);
    expect(server.connections).toBe(1);
    expect(server.creditViolations).toBe(0);
    expect(server.maxInflightSeen).toBeGreaterThan(1);
    expect(server.maxInflightSeen).toBeLessThanOrEqual(32);
    // Answered out of order: some request was answered before one sent earlier.
    const order = server.answered as number[];
    expect(order.some((id, i) => i > 0 && id < order[i - 1]!)).toBe(true);
    // Ids are unique among requests in flight (here: unique overall).
    const ids = server.requests().map((r) => r.msg.id);
    expect(new Set(ids).size).toBe(300);
  });

  it('never has more requests in flight than the credit the server granted; queues the rest locally', async () => {
    await start({ maxCredit: 4, maxDelayMs: 5 });
    const client = await connect(); // asks for 256
    expect(server.received[0]!.msg).toEqual({ op: 'hello', credit: 256 });
    expect(client.server?.credit).toBe(4);
    const calls = Array.from({ length: 60 }, (_, i) => client.embed(`text ${i}`));
    expect(client.inflight).toBe(4);
    expect(client.queued).toBe(56);
    await Promise.all(calls);
    expect(server.maxInflightSeen).toBeLessThanOrEqual(4);
    expect(server.creditViolations).toBe(0);
    expect(client.queued).toBe(0);

    // A client asking for less than the server allows gets what it asked for.
    const small = await connect({ credit: 3 });
    expect(small.server?.credit).toBe(3);
    await Promise.all(Array.from({ length: 30 }, (_, i) => small.predict(`more ${i}`)));
    expect(server.creditViolations).toBe(0);
  });

  it('refuses calls past maxQueued with a typed error; close() rejects what waits', async () => {
    await start();
    const client = await connect({ credit: 2, maxQueued: 3 });
    const waiting = Array.from({ length: 5 }, () => later(client.embed('hang')));
    const refused = await rejection(client.embed('one too many'));
    expect(refused).toBeInstanceOf(SlabClientError);
    expect(refused.type).toBe('overloaded');
    expect(refused.code).toBe('SLABSERVE_CLIENT_QUEUE_FULL');
    await client.close();
    for (const p of waiting) {
      const err = await rejection(p);
      expect(err).toBeInstanceOf(SlabConnectionError);
      expect(err.code).toBe('SLABSERVE_CLIENT_CLOSED');
    }
    expect(client.state).toBe('closed');
    expect((await rejection(client.embed('after close'))).code).toBe('SLABSERVE_CLIENT_CLOSED');
  });

  it('abort sends a cancel frame and rejects at once, even if the server never answers', async () => {
    await start();
    const client = await connect({ credit: 1 });
    const ac = new AbortController();
    const call = client.embed('blackhole', { signal: ac.signal });
    const sent = await server.waitFor((r) => r.msg.op === 'embed');
    ac.abort(new Error('user left'));
    const err = await rejection(call);
    expect(err).toBeInstanceOf(SlabAbortError);
    expect(err.name).toBe('AbortError');
    expect(err.type).toBe('cancelled');
    expect(err.code).toBe('SLABSERVE_ABORTED');
    expect((err.cause as Error).message).toBe('user left');
    await server.waitFor((r) => r.msg.op === 'cancel' && r.msg.id === sent.msg.id);
    // The server still holds its slot until it answers: the credit stays taken.
    expect(client.inflight).toBe(1);
    const next = later(client.embed('queued behind it'));
    expect(client.queued).toBe(1);
    await client.close();
    await rejection(next);
  });

  it('a cancelled request frees its credit when the server answers it', async () => {
    await start();
    const client = await connect({ credit: 1 });
    const ac = new AbortController();
    const call = later(client.embed('hang', { signal: ac.signal }));
    const sent = await server.waitFor((r) => r.msg.op === 'embed');
    const next = client.embed('next one'); // waits for the credit
    ac.abort();
    expect((await rejection(call)).code).toBe('SLABSERVE_ABORTED');
    expect(Array.from((await next)[0]!)).toEqual(f32(fakeRow('next one')));
    expect(server.received.filter((r) => r.msg.op === 'cancel').map((r) => r.msg.id)).toEqual([sent.msg.id]);
  });

  it('aborting a call still queued sends nothing; an aborted signal rejects before sending', async () => {
    await start();
    const client = await connect({ credit: 1 });
    const blocker = later(client.embed('hang'));
    const ac = new AbortController();
    const queued = client.embed('never sent', { signal: ac.signal });
    expect(client.queued).toBe(1);
    ac.abort();
    expect(await rejection(queued)).toBeInstanceOf(SlabAbortError);
    expect(client.queued).toBe(0);
    const pre = new AbortController();
    pre.abort();
    expect((await rejection(client.predict('also never sent', { signal: pre.signal }))).code).toBe('SLABSERVE_ABORTED');
    await client.close();
    await rejection(blocker);
    const texts = server.requests().flatMap((r) => r.msg.inputs as string);
    expect(texts).toEqual(['hang']);
    expect(server.received.some((r) => r.msg.op === 'cancel')).toBe(false);
  });

  it('timeoutMs goes out as deadline_ms; the server’s timeout error comes back typed', async () => {
    await start();
    const client = await connect();
    const err = await rejection(client.embed('hang', { timeoutMs: 200 }));
    expect(err.type).toBe('timeout');
    expect(err.code).toBe('SLABSERVE_DEADLINE_EXCEEDED');
    const frame = (await server.waitFor((r) => r.msg.op === 'embed')).msg;
    expect(typeof frame.deadline_ms).toBe('number');
    expect(frame.deadline_ms).toBeGreaterThan(0);
    expect(frame.deadline_ms).toBeLessThanOrEqual(200);

    // The client's default applies to calls that name none; tokenize carries no deadline_ms.
    const withDefault = await connect({ timeoutMs: 5000 });
    await withDefault.predict('with a default');
    await withDefault.tokenize('no deadline here');
    const p = server.requests().find((r) => r.msg.op === 'predict')!.msg;
    expect(p.deadline_ms).toBeGreaterThan(0);
    expect(p.deadline_ms).toBeLessThanOrEqual(5000);
    expect('deadline_ms' in server.requests().find((r) => r.msg.op === 'tokenize')!.msg).toBe(false);
    // Without a timeout, no deadline_ms: the server's default applies.
    await client.embed('plain');
    expect('deadline_ms' in server.requests().find((r) => r.msg.inputs === 'plain')!.msg).toBe(false);
  });

  it('gives up on a sent request the server never answers (and cancels it); times out calls still queued', async () => {
    await start();
    const client = await connect({ credit: 1, timeoutGraceMs: 20 });
    const lost = client.embed('blackhole', { timeoutMs: 30 });
    const queued = later(client.embed('behind the blackhole', { timeoutMs: 30 }));
    const err = await rejection(lost);
    expect(err.type).toBe('timeout');
    expect(err.code).toBe('SLABSERVE_CLIENT_TIMEOUT');
    const sent = await server.waitFor((r) => r.msg.op === 'embed');
    await server.waitFor((r) => r.msg.op === 'cancel' && r.msg.id === sent.msg.id);
    const q = await rejection(queued);
    expect(q.code).toBe('SLABSERVE_CLIENT_TIMEOUT');
    expect(server.requests().length).toBe(1); // the queued one was never sent
  });

  it('maps error frames to typed errors', async () => {
    await start();
    const client = await connect();
    const overloaded = await rejection(client.embed('fail:overloaded:SLABSERVE_OVERLOADED'));
    expect(overloaded).toBeInstanceOf(SlabClientError);
    expect(overloaded.name).toBe('SlabClientError');
    expect(overloaded.type).toBe('overloaded');
    expect(overloaded.code).toBe('SLABSERVE_OVERLOADED');
    expect(overloaded.retryAfterSeconds).toBe(2);
    expect(overloaded.retryable).toBe(true);
    expect(overloaded.message).toBe('fake overloaded');
    expect(typeof overloaded.requestId).toBe('number');
    expect(overloaded.status).toBe(429); // the status the same error has over HTTP
    const tooLong = await rejection(client.predict(['ok', 'fail:too_long:SLABSERVE_INPUT_TOO_LONG']));
    expect([tooLong.type, tooLong.code, tooLong.retryable]).toEqual(['too_long', 'SLABSERVE_INPUT_TOO_LONG', false]);
    const notFound = await rejection(client.rerank('fail:not_found:SLABSERVE_MODEL_NOT_FOUND', ['a']));
    expect([notFound.type, notFound.code]).toEqual(['not_found', 'SLABSERVE_MODEL_NOT_FOUND']);
    // The socket is fine afterwards.
    expect((await client.embed('still here')).length).toBe(1);
    expect(server.connections).toBe(1);
  });

  it('asks for f32 rows by default and decodes them; number[][] answers decode the same', async () => {
    await start();
    const client = await connect();
    const texts = ['where is my parcel', 'a', 'refund please'];
    const bin = await client.embed(texts);
    const json = await client.embed(texts, { encoding: 'json', normalize: false, truncate: true, model: 'm' });
    const [a, b] = server.requests().map((r) => r.msg);
    expect(a!.encoding).toBe('f32');
    expect(b).toMatchObject({ normalize: false, truncate: true, model: 'm' });
    expect('encoding' in b!).toBe(false);
    expect(bin.every((r) => r instanceof Float32Array)).toBe(true);
    expect(bin.map((r) => Array.from(r))).toEqual(json.map((r) => Array.from(r)));
    expect(bin.map((r) => Array.from(r))).toEqual(texts.map((t) => f32(fakeRow(t))));
    // Little-endian bytes, at any offset (msgpack bin fields are views into the frame).
    const frame = new Uint8Array([9, 0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x80, 0xbf]);
    expect(Array.from(decodeF32(frame.subarray(1)))).toEqual([1.5, -1]);
    expect(decodeF32(frame.subarray(1)).buffer).not.toBe(frame.buffer);
    expect(Array.from(decodeRows([[1, 2]])[0]!)).toEqual([1, 2]);
    expect(() => decodeF32(frame.subarray(0, 3))).toThrow(/multiple of 4/);
  });

  it('refuses a request larger than the server’s max_frame_bytes without losing the socket', async () => {
    await start({ maxFrameBytes: 512 });
    const client = await connect();
    const err = await rejection(client.embed('x'.repeat(2000)));
    expect([err.type, err.code]).toEqual(['payload_too_large', 'SLABSERVE_CLIENT_FRAME_TOO_LARGE']);
    expect((await client.embed('small')).length).toBe(1);
    expect(server.requests().length).toBe(1);
    expect(server.connections).toBe(1);
  });

  it('reconnects with backoff after the server drops the socket; in-flight calls reject, later ones succeed', async () => {
    await start();
    const events: SlabClientEvent[] = [];
    const client = await connect({ reconnect: { initialDelayMs: 10, maxDelayMs: 40, jitter: 0 }, onEvent: (e) => events.push(e) });
    const inflight = [later(client.embed('hang')), later(client.predict('hang')), later(client.tokenize('hang'))];
    await server.waitFor(() => server.requests().length === 3);
    server.refuse = 3; // the next three attempts fail
    server.dropAll();
    for (const p of inflight) {
      const err = await rejection(p);
      expect(err).toBeInstanceOf(SlabConnectionError);
      expect(err.type).toBe('connection');
      expect(err.code).toBe('SLABSERVE_CONNECTION_LOST');
      expect(err.message).toMatch(/may or may not have run/);
    }
    expect(client.state).toBe('reconnecting');
    // Made while reconnecting: waits for the new socket.
    const row = await client.embed('after the drop');
    expect(Array.from(row[0]!)).toEqual(f32(fakeRow('after the drop')));
    expect(client.state).toBe('open');
    expect(server.connections).toBe(2);
    const attempts = events.filter((e) => e.type === 'reconnecting').map((e) => (e as { delayMs: number }).delayMs);
    expect(attempts).toEqual([10, 20, 40, 40]); // doubling, capped; jitter 0
    expect(events.filter((e) => e.type === 'reconnect_failed').length).toBe(3);
    expect(events.map((e) => e.type)).toContain('disconnect');
    expect(events.at(-1)).toEqual({ type: 'open', reconnected: true, credit: 64 });
    // The new socket said hello again.
    expect(server.received.filter((r) => r.msg.op === 'hello').map((r) => r.connection)).toEqual([1, 2]);
  });

  it('retryOnReconnect resends the requests that were in flight on the dropped socket', async () => {
    await start();
    const client = await connect({ retryOnReconnect: true, reconnect: { initialDelayMs: 5, jitter: 0 } });
    const call = client.embed('hang1'); // hangs on the first connection only
    const before = await server.waitFor((r) => r.msg.op === 'embed');
    server.dropAll();
    expect(Array.from((await call)[0]!)).toEqual(f32(fakeRow('hang1')));
    const resent = server.requests().filter((r) => r.msg.inputs === 'hang1');
    expect(resent.map((r) => [r.connection, r.msg.id])).toEqual([
      [1, before.msg.id],
      [2, before.msg.id],
    ]);
  });

  it('gives up after maxAttempts, and closes at once with reconnect: false', async () => {
    await start();
    const events: SlabClientEvent[] = [];
    const client = await connect({ reconnect: { initialDelayMs: 5, maxAttempts: 2, jitter: 0 }, onEvent: (e) => events.push(e) });
    server.refuse = 1000;
    server.dropAll();
    await until(() => client.state === 'reconnecting');
    const waiting = client.embed('waits for a socket that never comes');
    const err = await rejection(waiting);
    expect(err).toBeInstanceOf(SlabConnectionError);
    expect(err.code).toBe('SLABSERVE_CONNECTION_FAILED');
    expect(client.state).toBe('closed');
    expect(events.at(-1)?.type).toBe('gave_up');
    expect((await rejection(client.embed('later'))).code).toBe('SLABSERVE_CONNECTION_FAILED');

    server.refuse = 0;
    const once = await connect({ reconnect: false });
    const inflight = later(once.embed('hang'));
    await server.waitFor((r) => r.msg.inputs === 'hang' && r.connection === server.connections);
    server.dropAll();
    expect((await rejection(inflight)).code).toBe('SLABSERVE_CONNECTION_LOST');
    expect(once.state).toBe('closed');
    expect((await rejection(once.embed('later'))).code).toBe('SLABSERVE_CONNECTION_FAILED');
  });

  it('connect() rejects with a connection error when the first connection fails', async () => {
    await start();
    server.refuse = 1;
    const err = await rejection(SlabClient.connect(server.url));
    expect(err).toBeInstanceOf(SlabConnectionError);
    expect(err.code).toBe('SLABSERVE_CONNECTION_FAILED');
  });

  it('uses an injected WebSocket constructor, and takes http:// URLs', async () => {
    await start();
    let made = 0;
    class Counting extends NodeWebSocket {
      constructor(url: string, protocols?: string | string[]) {
        super(url, protocols);
        made++;
      }
    }
    const client = await connect({ WebSocket: Counting });
    expect(made).toBe(1);
    expect((await client.embed('x')).length).toBe(1);
    const viaHttpUrl = await SlabClient.connect(`http://127.0.0.1:${server.port}`);
    clients.push(viaHttpUrl);
    expect(viaHttpUrl.url).toBe(`ws://127.0.0.1:${server.port}/ws`);
    expect(toWebSocketUrl('https://example.com/')).toBe('wss://example.com/ws');
    expect(toWebSocketUrl('ws://h:1/custom')).toBe('ws://h:1/custom');
  });
});

describe('backoff', () => {
  it('doubles from initialDelayMs up to maxDelayMs, with up to `jitter` of each delay taken off at random', () => {
    const o = { initialDelayMs: 100, maxDelayMs: 1000, factor: 2 };
    expect([1, 2, 3, 4, 5, 6].map((a) => backoffDelay(a, { ...o, jitter: 0 }))).toEqual([100, 200, 400, 800, 1000, 1000]);
    expect(backoffDelay(3, { ...o, jitter: 0.5 }, () => 0)).toBe(400);
    expect(backoffDelay(3, { ...o, jitter: 0.5 }, () => 0.999999)).toBe(200);
    for (let i = 0; i < 100; i++) {
      const d = backoffDelay(1 + (i % 8), { ...o, jitter: 1 });
      expect(d).toBeGreaterThanOrEqual(0);
      expect(d).toBeLessThanOrEqual(1000);
    }
  });
});

describe('SlabHttpClient over a fake HTTP server', () => {
  let server: FakeHttpServer;
  beforeAll(async () => {
    server = await FakeHttpServer.start();
  });
  afterAll(async () => {
    await server.close();
  });

  for (const format of ['msgpack', 'json'] as const) {
    it(`answers with the same result types as the WebSocket client (${format})`, async () => {
      const http = SlabClient.http(server.url, { format, headers: { authorization: 'Bearer t' } });
      expect(http).toBeInstanceOf(SlabHttpClient);
      const texts = ['where is my parcel', 'refund'];
      const rows = await http.embed(texts, { normalize: true });
      expect(rows.every((r) => r instanceof Float32Array)).toBe(true);
      expect(rows.map((r) => Array.from(r))).toEqual(texts.map((t) => f32(fakeRow(t))));
      expect(await http.predict('one text')).toEqual(fakePredictions('one text'));
      expect(await http.predict(texts)).toEqual(texts.map(fakePredictions));
      expect(await http.rerank('refund', texts, { returnText: true, rawScores: false })).toEqual(fakeRerank('refund', texts, true));
      expect(await http.tokenize(texts, { addSpecialTokens: false })).toEqual(texts.map(fakeTokens));
      const sent = server.requests.slice(-5);
      expect(sent.map((r) => r.path)).toEqual(['/embed', '/predict', '/predict', '/rerank', '/tokenize']);
      expect(sent[0]!.contentType).toBe(format === 'msgpack' ? 'application/msgpack' : 'application/json');
      expect(sent[0]!.accept).toBe(format === 'msgpack' ? 'application/msgpack' : 'application/json');
      expect(sent[0]!.body).toEqual({ inputs: texts, normalize: true });
      expect(sent[3]!.body).toEqual({ query: 'refund', texts, return_text: true, raw_scores: false });
      expect(sent[4]!.body).toEqual({ inputs: texts, add_special_tokens: false });
    });
  }

  it('maps HTTP error answers (status, {error, type, code}, Retry-After) to typed errors', async () => {
    const http = new SlabHttpClient(server.url);
    const overloaded = await rejection(http.embed('fail:overloaded:SLABSERVE_OVERLOADED'));
    expect(overloaded).toBeInstanceOf(SlabClientError);
    expect([overloaded.type, overloaded.code, overloaded.status, overloaded.retryAfterSeconds]).toEqual(['overloaded', 'SLABSERVE_OVERLOADED', 429, 3]);
    expect(overloaded.message).toBe('fake overloaded');
    const tooLong = await rejection(new SlabHttpClient(server.url, { format: 'json' }).predict('fail:too_long:SLABSERVE_INPUT_TOO_LONG'));
    expect([tooLong.type, tooLong.code, tooLong.status]).toEqual(['too_long', 'SLABSERVE_INPUT_TOO_LONG', 413]);
    const timeout = await rejection(http.predict('fail:timeout:SLABSERVE_DEADLINE_EXCEEDED'));
    expect([timeout.type, timeout.status, timeout.retryable]).toEqual(['timeout', 504, true]);
    const noRoute = await rejection(new SlabHttpClient(`${server.url}/v0`).embed('x'));
    expect([noRoute.type, noRoute.code, noRoute.status]).toEqual(['not_found', 'SLABSERVE_ROUTE_NOT_FOUND', 404]);
    // Not the API's error shape (a proxy in between): the status decides.
    const plain = await rejection(http.embed('plain503'));
    expect([plain.type, plain.code, plain.status, plain.message]).toEqual(['unavailable', 'SLABSERVE_HTTP_503', 503, 'upstream down']);
    expect(parseRetryAfter('120')).toBe(120);
    expect(parseRetryAfter(new Date(Date.now() + 30_000).toUTCString())).toBeGreaterThanOrEqual(28);
    expect(parseRetryAfter('soon')).toBeUndefined();
  });

  it('timeoutMs, abort, network failures and close()', async () => {
    const http = new SlabHttpClient(server.url);
    const t = await rejection(http.embed('hang', { timeoutMs: 50 }));
    expect([t.type, t.code]).toEqual(['timeout', 'SLABSERVE_CLIENT_TIMEOUT']);
    const ac = new AbortController();
    const call = http.embed('hang', { signal: ac.signal });
    await new Promise<void>((res) => {
      const check = () => (server.requests.filter((r) => (r.body.inputs as string) === 'hang').length === 2 ? res() : setTimeout(check, 5));
      check();
    });
    ac.abort();
    const a = await rejection(call);
    expect(a).toBeInstanceOf(SlabAbortError);
    expect(a.name).toBe('AbortError');
    // A port nobody listens on.
    const gone = await FakeHttpServer.start();
    const port = gone.port;
    await gone.close();
    const n = await rejection(new SlabHttpClient(`http://127.0.0.1:${port}`).embed('x'));
    expect(n).toBeInstanceOf(SlabConnectionError);
    expect(n.code).toBe('SLABSERVE_CONNECTION_FAILED');
    await http.close();
    expect((await rejection(http.embed('x'))).code).toBe('SLABSERVE_CLIENT_CLOSED');
  });
});

// ---- the real server ------------------------------------------------------

const root = fileURLToPath(new URL('..', import.meta.url));
/** npm test builds the server and generates the models first (its pretest); run alone, a missing one is said, not skipped. */
function expectRealServerBuilt(): void {
  for (const f of ['dist/src/gateway/ws/api.js', 'models/tiny-embed/model.onnx', 'models/tiny-intent/model.onnx', 'models/tiny-rerank/model.onnx']) {
    if (!existsSync(`${root}${f}`)) throw new Error(`${f} is missing: run npm test (or npm run build && npm run models)`);
  }
}

describe('SlabClient against the real server (/ws and HTTP)', () => {
  type Server = { url: string; ready: Promise<unknown>; close(): Promise<void> };
  let server: Server;
  let ws: SlabClient;
  let http: SlabHttpClient;

  beforeAll(async () => {
    expectRealServerBuilt();
    const main = (await import('../dist/src/main/server.js')) as unknown as {
      startServer(config: Record<string, unknown>): Promise<Server>;
      SERVER_DEFAULTS: Record<string, unknown>;
    };
    // The default models by name: a models/ folder may also hold larger ones generated on request (models/README.md).
    server = await main.startServer({ ...main.SERVER_DEFAULTS, models: ['tiny-embed', 'tiny-intent', 'tiny-rerank'], host: '127.0.0.1', port: 0, device: 'cpu', gatewayThreads: 1, batching: {}, log: () => {} });
    await server.ready;
    ws = await SlabClient.connect(server.url, { credit: 8 });
    http = SlabClient.http(server.url);
  });
  afterAll(async () => {
    await ws?.close();
    await server?.close();
  });

  it('says hello: the credit asked for, the frame and batch limits, the version', () => {
    expect(ws.server).toMatchObject({ credit: 8, maxClientBatchSize: expect.any(Number), maxFrameBytes: expect.any(Number), version: expect.any(String) });
  });

  it('embeds over /ws (f32 rows) exactly as over HTTP (number arrays), and as JSON rows over /ws', async () => {
    const texts = ['where is my parcel?', 'cancel my plan', 'I want my money back'];
    const [bin, json, viaHttp] = await Promise.all([ws.embed(texts), ws.embed(texts, { encoding: 'json' }), http.embed(texts)]);
    expect(bin.length).toBe(3);
    expect(bin[0]!.length).toBe(128);
    expectRowsClose(bin, viaHttp);
    expectRowsClose(bin, json);
  });

  it('pipelines many requests on one socket within the credit; answers match their inputs', async () => {
    const texts = Array.from({ length: 120 }, randomText);
    const expected = await http.predict(texts.slice(0, 60));
    const results = await Promise.all(texts.slice(0, 60).map((t) => ws.predict(t)));
    // Same scores per label (not compared by rank: batching may reorder near-ties).
    const byLabel = (list: { label: string; score: number }[]) => Object.fromEntries(list.map((x) => [x.label, x.score]));
    results.forEach((r, i) => {
      const want = byLabel(expected[i]!);
      for (const [label, score] of Object.entries(byLabel(r))) expect(score).toBeCloseTo(want[label]!, 4);
    });
    const rows = await Promise.all(texts.map((t) => ws.embed(t)));
    const direct = await http.embed(texts.slice(0, 60));
    expectRowsClose(rows.slice(0, 60).map((r) => r[0]!), direct);
  });

  it('maps the server’s errors the same over /ws and HTTP', async () => {
    const a = await rejection(ws.embed('x', { model: 'no-such-model' }));
    const b = await rejection(http.embed('x', { model: 'no-such-model' }));
    // One error, one status, over either transport (an error frame carries none: the client gives HTTP's).
    expect([a.type, a.code, a.status]).toEqual(['not_found', 'SLABSERVE_MODEL_NOT_FOUND', 404]);
    expect([b.type, b.code, b.status]).toEqual(['not_found', 'SLABSERVE_MODEL_NOT_FOUND', 404]);
    const tooMany = Array.from({ length: (ws.server?.maxClientBatchSize ?? 64) + 1 }, () => 'x');
    const c = await rejection(ws.predict(tooMany));
    const cHttp = await rejection(http.predict(tooMany));
    expect([c.type, c.code, c.status]).toEqual(['validation', 'SLABSERVE_INVALID_INPUT', 422]);
    expect(cHttp.status).toBe(422);
    const d = await rejection(ws.embed(Array(2000).fill('parcel').join(' ')));
    expect([d.type, d.status]).toEqual(['too_long', 413]);
    // The socket survives every one of them.
    expect((await ws.embed('still fine')).length).toBe(1);
  });

  it('cancels: the abort rejects at once and the socket keeps working', async () => {
    const ac = new AbortController();
    const calls = Array.from({ length: 8 }, (_, i) => ws.embed(`cancel me ${i} ${'word '.repeat(50)}`, { signal: ac.signal }).then(() => 'done', (e: SlabClientError) => e.code));
    ac.abort();
    const outcomes = await Promise.all(calls);
    expect(outcomes.every((o) => o === 'SLABSERVE_ABORTED')).toBe(true);
    // Credit comes back as the server answers the cancelled requests (cancelled, or their results).
    expect((await Promise.all(Array.from({ length: 16 }, (_, i) => ws.embed(`after ${i}`)))).length).toBe(16);
  });

  it('sends timeoutMs as deadline_ms and gets answers within it', async () => {
    const rows = await ws.embed('with a deadline', { timeoutMs: 10_000 });
    expect(rows[0]!.length).toBe(128);
  });

  it('decodes token ids over both transports: a string for one list, one per list for several, special tokens as asked', async () => {
    const text = 'where is my parcel?';
    const [tokens] = await http.tokenize(text);
    const ids = tokens!.map((t) => t.id);
    const [cls, sep] = tokens!.filter((t) => t.special).map((t) => t.text);
    for (const api of [ws, http]) {
      expect(await api.decode(ids)).toBe(text);
      expect(await api.decode(ids, { skipSpecialTokens: false })).toBe(`${cls} ${text} ${sep}`);
      expect(await api.decode([ids, ids.slice(1, 3)])).toEqual([text, 'where is']);
      expect(await api.decode([])).toBe('');
      const bad = await rejection(api.decode([ids, [999_999_999]]));
      expect([bad.type, bad.status]).toEqual(['validation', 422]);
      expect(bad.message).toMatch(/999999999/);
    }
  });

  it('rerank and tokenize over both transports: scores are the sigmoid of the cross-encoder run alone on each pair', async () => {
    const texts = ['I want my money back', 'where is my parcel'];
    const query = 'refund please';
    const rerankRef = await PlainReference.open('tiny-rerank');
    const tok = await loadTokenizer(rerankRef.spec.tokenizerPath);
    try {
      const want = await Promise.all(texts.map((t) => tok.encodePair!(query, t, { maxLength: 128, truncate: false })).map((p) => rerankRef.rerank(p.ids, p.typeIds)));
      for (const api of [ws, http]) {
        const hits = await api.rerank(query, texts, { returnText: true });
        expect(hits.map((h) => h.index).sort()).toEqual([0, 1]);
        expect(hits[0]!.score).toBeGreaterThanOrEqual(hits[1]!.score);
        for (const h of hits) {
          expect(h.text).toBe(texts[h.index]);
          expect(Math.abs(h.score - want[h.index]!.score)).toBeLessThan(1e-5);
        }
        const lists = await api.tokenize(['hello world', 'parcel']);
        expect(lists.length).toBe(2);
        const served = tok.encode('hello world', { maxLength: 512, truncate: false });
        expect(lists[0]!.map((t) => t.id)).toEqual(Array.from(served.ids));
        expect(lists[0]!.filter((t) => t.special).every((t) => t.start === null)).toBe(true);
        expect(lists[0]!.filter((t) => !t.special).map((t) => 'hello world'.slice(t.start!, t.stop!))).toEqual(['hello', 'world']);
      }
    } finally {
      await rerankRef.close();
    }
  });
});

// ---- API keys, against real servers started with keys -----------------------

describe('API keys (docs/security.md) against a real server started with keys', () => {
  type Server = { url: string; port: number; ready: Promise<unknown>; close(): Promise<void> };
  type Main = { startServer(config: Record<string, unknown>): Promise<Server>; SERVER_DEFAULTS: Record<string, unknown> };
  const KEY = 'sk-client-test-0123456789abcdef0123456789abcdef';
  /** A second key with punctuation that base64 turns into '+' and '/' (base64url: '-' and '_'). */
  const KEY2 = 'second/key+with=punctuation~and!>>>???more';
  let main: Main;
  let server: Server;
  /** The access lines of the server's refused /ws upgrades (status 401). */
  let refusedUpgrades: Record<string, unknown>[] = [];
  const clients: SlabClient[] = [];
  const servers: Server[] = [];

  const start = async (keys: string[], port = 0): Promise<Server> => {
    const s = await main.startServer({
      ...main.SERVER_DEFAULTS,
      host: '127.0.0.1',
      port,
      device: 'cpu',
      models: ['tiny-embed'],
      gatewayThreads: 1,
      batching: {},
      apiKeys: keys,
      logLevel: 'info',
      log: (line: string) => {
        if (!line.startsWith('{')) return;
        const entry = JSON.parse(line) as Record<string, unknown>;
        if (entry.route === '/ws' && entry.status === 401) refusedUpgrades.push(entry);
      },
    });
    servers.push(s);
    return s;
  };
  const connect = async (url: string, opts: SlabClientOptions) => {
    const c = await SlabClient.connect(url, opts);
    clients.push(c);
    return c;
  };
  /** Connecting must fail: the client it would have made is closed all the same. */
  const refused = (url: string, opts: SlabClientOptions) => rejection(connect(url, opts));

  /** The `ws` package's constructor, recording what the client gives it. */
  const made: { protocols: unknown; options: unknown }[] = [];
  class Recording extends NodeWebSocket {
    constructor(url: string, protocols?: string | string[], options?: { headers?: Record<string, string> }) {
      super(url, protocols, options);
      made.push({ protocols, options });
    }
  }
  /** A constructor that is not the `ws` package (no EventEmitter methods), as a browser's WebSocket: it takes no headers. */
  const BrowserLike = function (this: unknown, url: string, protocols?: string | string[]) {
    made.push({ protocols, options: undefined });
    return new NodeWebSocket(url, protocols);
  } as unknown as WebSocketConstructor;

  beforeAll(async () => {
    expectRealServerBuilt();
    main = (await import('../dist/src/main/server.js')) as unknown as Main;
    server = await start([KEY, KEY2]);
    await server.ready;
  }, 120_000);
  afterEach(async () => {
    await Promise.all(clients.splice(0).map((c) => c.close()));
  });
  afterAll(async () => {
    await Promise.all(servers.map((s) => s.close()));
  });

  it('builds the same bearer.<base64url(key)> subprotocol as the server reads', async () => {
    const gateway = (await import('../dist/src/gateway/security.js')) as { wsKeyProtocol(k: string): string; protocolKey(p: string): string | null };
    for (const key of [KEY, KEY2, 'a', 'ab', 'abc', '~~~~>>>>????', 'ключ-🔑']) {
      expect(wsKeyProtocol(key)).toBe(gateway.wsKeyProtocol(key));
      expect(gateway.protocolKey(`slabserve, ${wsKeyProtocol(key)}`)).toBe(key);
    }
    expect(wsKeyProtocol(KEY2)).toMatch(/^bearer\.[A-Za-z0-9_-]+$/);
  });

  it('the right key works over /ws (as a header, and as a subprotocol) and over HTTP', async () => {
    made.length = 0;
    const texts = ['where is my parcel?', 'cancel my plan'];
    // The `ws` package: the key goes as Authorization, the protocols as given.
    const viaHeader = await connect(server.url, { apiKey: KEY, WebSocket: Recording });
    expect(made[0]).toEqual({ protocols: undefined, options: { headers: { authorization: `Bearer ${KEY}` } } });
    // Not the `ws` package: the key goes as a subprotocol, with `slabserve` offered beside it.
    const viaProtocol = await connect(server.url, { apiKey: KEY2, WebSocket: BrowserLike });
    expect(made[1]).toEqual({ protocols: ['slabserve', wsKeyProtocol(KEY2)], options: undefined });
    // Asked for explicitly, with the caller's own protocols kept.
    const explicit = await connect(server.url, { apiKey: KEY, apiKeyTransport: 'protocol', protocols: 'slabserve', WebSocket: Recording });
    expect(made[2]).toEqual({ protocols: ['slabserve', wsKeyProtocol(KEY)], options: undefined });
    // No constructor given (Node 20): the client loads `ws` and sends the header.
    const byDefault = await connect(server.url, { apiKey: KEY });
    const http = new SlabHttpClient(server.url, { apiKey: KEY2, headers: { Authorization: 'Bearer replaced-by-apiKey' } });
    const [a, b, c, d, e] = await Promise.all([viaHeader, viaProtocol, explicit, byDefault, http].map((api) => api.embed(texts)));
    expect(a!.length).toBe(2);
    expect(a![0]!.length).toBe(128);
    for (const rows of [b, c, d, e]) expectRowsClose(rows!, a!);
    expect(refusedUpgrades).toEqual([]);
    // A key the server could never hold is refused before anything is sent.
    expect(() => new SlabHttpClient(server.url, { apiKey: 'has a space' })).toThrow(TypeError);
    await expect(SlabClient.connect(server.url, { apiKey: '' })).rejects.toThrow(TypeError);
  });

  it('a missing or wrong key rejects with SlabUnauthorizedError (401) on both clients, without retrying', async () => {
    // HTTP: 401 is 'unauthorized' (it used to be classified 'validation').
    for (const opts of [{}, { apiKey: 'wrong-key-wrong-key' }, { apiKey: KEY.slice(0, -1) }, { format: 'json' as const, apiKey: 'nope' }]) {
      const err = await rejection(new SlabHttpClient(server.url, opts).embed('x'));
      expect(err).toBeInstanceOf(SlabUnauthorizedError);
      expect([err.type, err.code, err.status, err.retryable]).toEqual(['unauthorized', 'SLABSERVE_UNAUTHORIZED', 401, false]);
      expect(err.message).toMatch('apiKey' in opts ? /not valid/ : /needs an API key/);
    }
    // /ws: the upgrade is refused; connect() rejects with the typed error and never reconnects.
    const events: SlabClientEvent[] = [];
    const onEvent = (e: SlabClientEvent) => events.push(e);
    const attempts: SlabClientOptions[] = [
      { onEvent },
      { onEvent, apiKey: 'wrong-key-wrong-key' },
      { onEvent, apiKey: 'wrong-key-wrong-key', apiKeyTransport: 'protocol' },
      { onEvent, apiKey: KEY.slice(0, -1), WebSocket: BrowserLike },
      { onEvent, protocols: ['slabserve', wsKeyProtocol('not-a-key-of-this-server')] },
    ];
    for (const opts of attempts) {
      const err = await refused(server.url, opts);
      expect(err).toBeInstanceOf(SlabUnauthorizedError);
      expect([err.type, err.code, err.status, err.retryable]).toEqual(['unauthorized', 'SLABSERVE_UNAUTHORIZED', 401, false]);
      expect(err.message).toMatch(opts.apiKey === undefined ? /needs an API key/ : /not valid/);
    }
    expect(events).toEqual([]);
    // The server saw each upgrade once.
    await until(() => refusedUpgrades.length >= attempts.length);
    expect(refusedUpgrades.length).toBe(attempts.length);
    refusedUpgrades = [];
    // A 401 or 403 from anything in between (a proxy, in its own shape) is unauthorized too.
    expect(typeOfStatus(401)).toBe('unauthorized');
    const proxied = fromHttpError(403, 'Forbidden', null);
    expect(proxied).toBeInstanceOf(SlabUnauthorizedError);
    expect([proxied.type, proxied.code, proxied.status]).toEqual(['unauthorized', 'SLABSERVE_HTTP_403', 403]);
  });

  it('a reconnect refused with 401 (the server came back with other keys) closes the client: no reconnect loop', async () => {
    const events: SlabClientEvent[] = [];
    // A server of its own on a port below the kernel's ephemeral range: the client's reconnects to a
    // port nothing listens on walk local ephemeral ports, and one equal to an ephemeral server port
    // would hold it (a self-connect) when the server comes back.
    const first = await start([KEY], await portOutsideEphemeral());
    await first.ready;
    const client = await connect(first.url, { apiKey: KEY, reconnect: { initialDelayMs: 10, maxDelayMs: 50 }, onEvent: (e) => events.push(e) });
    expect((await client.embed('before')).length).toBe(1);
    const port = first.port;
    await first.close();
    await until(() => client.state === 'reconnecting');
    const waiting = later(client.embed('while reconnecting'));
    // Attempts fail while nothing listens; then the port answers, with keys that are not the client's.
    const other = await start(['a-different-key-0123456789abcdef'], port);
    await until(() => client.state === 'closed');
    const err = await rejection(waiting);
    expect(err).toBeInstanceOf(SlabUnauthorizedError);
    expect([err.type, err.status]).toEqual(['unauthorized', 401]);
    expect((await rejection(client.embed('after'))).type).toBe('unauthorized');
    const gaveUp = events.filter((e) => e.type === 'gave_up');
    expect(gaveUp.length).toBe(1);
    expect(events.at(-1)).toBe(gaveUp[0]);
    expect(gaveUp[0]!.type === 'gave_up' && gaveUp[0]!.error).toBeInstanceOf(SlabUnauthorizedError);
    const failed = events.filter((e): e is Extract<SlabClientEvent, { type: 'reconnect_failed' }> => e.type === 'reconnect_failed');
    expect(failed.filter((e) => e.error.type === 'unauthorized').length).toBe(1);
    expect(failed.at(-1)!.error.type).toBe('unauthorized');
    // Many backoff periods later, still one refused upgrade and no new attempt.
    await until(() => refusedUpgrades.length >= 1);
    const seen = events.length;
    await new Promise((r) => setTimeout(r, 500));
    expect(events.length).toBe(seen);
    expect(refusedUpgrades.length).toBe(1);
    await other.ready;
  }, 60_000);
});
