/**
 * The benches' WebSocket helpers: open a /ws socket with a credit, close it, one
 * embed over a fresh socket for the set-up checks. The load generator
 * (bench/load.ts) uses `ws` and msgpackr as thinly as the protocol allows, not
 * SlabClient: its per-request options, timer, promise and row copy would be
 * the bench's CPU, taken from the server on 2 cores.
 */
import { pack, unpack } from 'msgpackr';
import WebSocket from 'ws';

/** A message from the server's /ws: an answer (id, result or error) or the hello granting a credit. */
export interface WsAnswer {
  id?: number | string | null;
  op?: string;
  credit?: number;
  result?: unknown;
  error?: { type: string; code: string; message: string };
}

/** Opens a socket, asks for `credit` with hello, resolves when the server granted it. */
export function openSocket(origin: string, credit: number, timeoutMs = 10_000): Promise<WebSocket> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${origin.replace(/^http/, 'ws')}/ws`, { perMessageDeflate: false });
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
      const m = unpack(data) as WsAnswer;
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
        const m = unpack(data) as WsAnswer;
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
