/**
 * WebSocket side of the quick bench (bench/quick.ts): closed-loop load over
 * /ws (docs/websocket.md) against the same `slabserve serve` child process the
 * HTTP rows use (bench/http-load.ts).
 *
 * `sockets` WebSockets, each with `depth` requests pipelined: every socket
 * keeps `depth` embed requests in flight, and sends the next one as soon as an
 * answer comes (so `sockets x depth` in flight in all, like as many HTTP
 * keep-alive clients). One request = one text, `encoding: "f32"`. Latency is per
 * request, from the frame handed to the socket to the answer frame decoded.
 *
 * Client: the `ws` package and msgpackr directly, not SlabClient
 * (src/client/ws-client.ts). SlabClient adds, per request, an options object,
 * a deadline timer, a local FIFO against the credit, a promise and a copy of
 * every row into a Float32Array: all client-side costs that would land in this
 * process's CPU (and on a 2-core box, take CPU from the server). The bench
 * wants what the server does per request over /ws, beside what it does over
 * HTTP with node:http, so the load generator is kept as thin as the protocol
 * allows: pack {id, op, inputs, encoding}, send, unpack the answer, match the id.
 * The answer's rows are checked for their size (4 x dimension bytes), not copied.
 */
import { performance } from 'node:perf_hooks';
import { pack, unpack } from 'msgpackr';
import WebSocket from 'ws';
import type { Histogram } from 'hdr-histogram-js';
import { measureWindow, type LoadResult, type ServerProcess } from './http-load.js';

export interface WsLoadOptions {
  server: ServerProcess;
  model: string;
  /** Texts, sent round-robin from a shared cursor (the same order as the HTTP bodies). */
  texts: string[];
  sockets: number;
  /** Requests in flight per socket (asked for as the socket's credit with `hello`). */
  depth: number;
  warmupMs: number;
  durationMs: number;
  histogram: Histogram;
  /** Expected bytes per answer row (4 x dimension); null: not checked. */
  rowBytes: number | null;
  timeoutMs?: number;
}

/** closedLoop's result (http-load.ts), with the sockets opened as its connections. */
export type WsLoadResult = Omit<LoadResult, 'connections'> & { connections: number };

interface Answer {
  id?: number | string | null;
  op?: string;
  credit?: number;
  result?: unknown;
  error?: { type: string; code: string; message: string };
}


export function wsUrl(origin: string): string {
  return origin.replace(/^http/, 'ws') + '/ws';
}

/** Opens a socket, asks for `credit` with hello, resolves when the server granted it. */
export function openSocket(origin: string, credit: number, timeoutMs = 10_000): Promise<WebSocket> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(wsUrl(origin), { perMessageDeflate: false });
    ws.binaryType = 'nodebuffer';
    const timer = setTimeout(() => {
      ws.terminate();
      reject(new Error(`ws: no hello answer in ${timeoutMs} ms`));
    }, timeoutMs);
    ws.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    ws.once('open', () => ws.send(pack({ op: 'hello', credit })));
    ws.once('message', (data: Buffer) => {
      clearTimeout(timer);
      const m = unpack(data) as Answer;
      if (m.op !== 'hello' || m.credit !== credit) {
        ws.terminate();
        reject(new Error(`ws: expected hello with credit ${credit}, got ${JSON.stringify(m).slice(0, 200)}`));
        return;
      }
      ws.removeAllListeners('error');
      resolve(ws);
    });
  });
}

/** Closes a socket and waits for it to be closed (terminated after 2 s). */
export function closeSocket(ws: WebSocket): Promise<void> {
  if (ws.readyState === WebSocket.CLOSED) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => ws.terminate(), 2000);
    ws.once('close', () => {
      clearTimeout(timer);
      resolve();
    });
    ws.close(1000);
  });
}

/** One embed over a fresh socket; the f32 row as a Float32Array (for the set-up check). */
export async function embedOnce(origin: string, text: string): Promise<Float32Array> {
  const ws = await openSocket(origin, 1);
  try {
    return await new Promise<Float32Array>((resolve, reject) => {
      ws.once('message', (data: Buffer) => {
        const m = unpack(data) as Answer;
        if (m.error || !Array.isArray(m.result)) return reject(new Error(`ws embed: ${JSON.stringify(m.error ?? m).slice(0, 300)}`));
        const row = m.result[0] as Uint8Array;
        const copy = new Uint8Array(row); // aligned copy
        resolve(new Float32Array(copy.buffer, 0, copy.byteLength / 4));
      });
      ws.send(pack({ id: 1, op: 'embed', inputs: text, encoding: 'f32' }));
    });
  } finally {
    await closeSocket(ws);
  }
}

/**
 * `sockets` x `depth` requests in flight, closed loop per slot. Completions and
 * latencies count only inside the measured window, as in closedLoop (http-load.ts).
 */
export async function wsClosedLoop(o: WsLoadOptions): Promise<WsLoadResult> {
  const timeoutMs = o.timeoutMs ?? 10_000;
  const sockets = await Promise.all(Array.from({ length: o.sockets }, () => openSocket(o.server.origin, o.depth)));
  let cursor = 0;
  let stop = false;
  let windowStart = Infinity;
  let windowEnd = Infinity;
  let done = 0;
  let errors = 0;
  let firstError: string | undefined;
  let inflight = 0;
  let nextId = 1;
  let allIdle: (() => void) | null = null;

  const fail = (msg: string) => {
    errors++;
    firstError ??= msg;
  };
  for (const ws of sockets) {
    // id -> send time (ms); per socket, so ids are unique among that socket's requests in flight
    const sent = new Map<number, number>();
    const send = () => {
      if (stop || ws.readyState !== WebSocket.OPEN) return;
      const id = nextId++;
      const text = o.texts[cursor++ % o.texts.length]!;
      sent.set(id, performance.now());
      inflight++;
      ws.send(pack({ id, op: 'embed', inputs: text, encoding: 'f32' }));
    };
    ws.on('message', (data: Buffer) => {
      const t1 = performance.now();
      const m = unpack(data) as Answer;
      const t0 = typeof m.id === 'number' ? sent.get(m.id) : undefined;
      if (t0 === undefined) {
        fail(`ws: answer for an unknown id ${JSON.stringify(m).slice(0, 200)}`);
        return;
      }
      sent.delete(m.id as number);
      inflight--;
      if (m.error) fail(`ws ${m.error.type} ${m.error.code}: ${m.error.message}`);
      else if (!Array.isArray(m.result) || m.result.length !== 1 || (o.rowBytes !== null && (m.result[0] as Uint8Array).byteLength !== o.rowBytes)) {
        fail(`ws: unexpected result ${JSON.stringify(m.result).slice(0, 200)}`);
      } else if (t1 >= windowStart && t1 < windowEnd) {
        o.histogram.recordValue(Math.max(1, Math.round((t1 - t0) * 1000)));
        done++;
      }
      if (stop) {
        if (inflight === 0) allIdle?.();
      } else if (m.error) setTimeout(send, 1); // no hot loop against a failing server
      else send();
    });
    ws.on('error', (err) => fail(`ws: ${err.message}`));
    ws.on('close', (code) => {
      if (!stop) fail(`ws: socket closed during the run (code ${code})`);
    });
    for (let i = 0; i < o.depth; i++) send();
  }

  let errorsBefore = 0;
  const window = await measureWindow(o, {
    open: (t) => {
      errorsBefore = errors;
      windowStart = t;
    },
    close: (t) => (windowEnd = t),
  });
  stop = true;
  // Let the requests in flight come back (bounded), so closing the sockets cancels nothing mid-batch.
  if (inflight > 0) {
    let timer: NodeJS.Timeout | undefined;
    const idle = await Promise.race([
      new Promise<boolean>((res) => (allIdle = () => res(true))),
      new Promise<boolean>((res) => (timer = setTimeout(res, timeoutMs, false))),
    ]);
    clearTimeout(timer);
    if (!idle) fail(`ws: ${inflight} requests still in flight ${timeoutMs} ms after the window closed`);
  }
  await Promise.all(sockets.map(closeSocket));
  return { done, errors: errors - errorsBefore, firstError, ...window, connections: sockets.length };
}
