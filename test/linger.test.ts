/**
 * Refusals a client can read while it is still sending its body. A 413 (or a
 * 503 while draining) ends its connection; closing at once, with the
 * client's body still arriving, resets the connection, and a client still
 * writing sees EPIPE or ECONNRESET instead of the status. The server answers
 * at once, whole, with Connection: close, reads and drops the rest of the
 * body, and leaves the close to the client (uWS's idle timeout closes one
 * that stalls).
 */
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type Server } from '../dist/src/main/server.js';
import { parseMetrics } from './fixtures/http-client.js';
import { eventually, testServerConfig } from './helpers.js';

const MIB = 2 ** 20;
/** How long rawPost holds its body back for an answer that does not come: only a hang's bound. */
const HOLD_LIMIT_MS = 10_000;
let server: Server;
const url = (s: Server, path = '/embed') => `http://127.0.0.1:${s.port}${path}`;

beforeAll(async () => {
  // A discard timeout past rawPost's hold limit: an answer held back until the body is in (as for a client that
  // sent Connection: close) can never pass for one given at once.
  server = await startServer(testServerConfig({ models: ['tiny-embed'], maxBodyBytes: 2 * MIB, discardTimeoutMs: 6 * HOLD_LIMIT_MS }));
  await server.ready;
}, 120_000);

afterAll(async () => {
  await server?.close();
});

/**
 * A raw client: the request head, then `bodyBytes` of body written as fast
 * as the socket takes it, then its FIN. With `holdAt`, it stops writing once
 * it has written that many bytes of body, until the answer has begun to
 * arrive (or, should none come, for HOLD_LIMIT_MS: a hang's bound). What it
 * read, how much it wrote before the connection ended, how much it had
 * written when the answer began and when the server's FIN came, and any
 * error on the way.
 */
function rawPost(
  s: Server,
  head: string,
  bodyBytes: number,
  holdAt = Infinity,
): Promise<{ read: string; written: number; writtenAtAnswer: number; writtenAtEnd: number; error?: string; ms: number }> {
  return new Promise((resolve) => {
    const started = performance.now();
    const sock = net.connect(s.port, '127.0.0.1');
    let read = '';
    let written = 0;
    let writtenAtAnswer = NaN;
    let writtenAtEnd = NaN;
    let error: string | undefined;
    let answered: () => void = () => {};
    const answer = new Promise<void>((r) => (answered = r));
    sock.on('data', (d) => {
      if (read === '') writtenAtAnswer = written;
      read += d.toString('latin1');
      answered();
    });
    sock.on('end', () => (writtenAtEnd = written));
    sock.on('error', (e: NodeJS.ErrnoException) => (error = e.code));
    sock.on('close', () => resolve({ read, written, writtenAtAnswer, writtenAtEnd, ms: performance.now() - started, ...(error ? { error } : {}) }));
    sock.write(head);
    const chunk = Buffer.alloc(MIB, 0x20);
    let held = false;
    const pump = () => {
      while (written < bodyBytes && !sock.destroyed) {
        if (written >= holdAt && !held) {
          held = true;
          const limit = setTimeout(answered, HOLD_LIMIT_MS);
          return void answer.then(() => (clearTimeout(limit), pump()));
        }
        const n = Math.min(chunk.length, bodyBytes - written);
        written += n;
        if (!sock.write(chunk.subarray(0, n))) return void sock.once('drain', pump);
      }
      if (written >= bodyBytes) sock.end();
    };
    pump();
  });
}


describe('a body over --max-body-bytes', () => {
  it('declared by Content-Length (64 MiB): fetch reads the 413, five times in five, and the server keeps serving', async () => {
    for (let i = 0; i < 5; i++) {
      const r = await fetch(url(server), { method: 'POST', headers: { 'content-type': 'application/json' }, body: Buffer.alloc(64 * MIB, 0x20) });
      expect(r.status).toBe(413);
      expect(r.headers.get('connection')).toBe('close');
      expect(((await r.json()) as { code: string }).code).toBe('SLABSERVE_PAYLOAD_TOO_LARGE');
    }
    const ok = await fetch(url(server), { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: 'still here' }) });
    expect(ok.status).toBe(200);
  });

  it('growing past the limit without a length (chunked): the 413 is read too', async () => {
    let sent = 0;
    const body = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (sent >= 16 * MIB) return controller.close();
        sent += MIB;
        controller.enqueue(new Uint8Array(MIB).fill(0x20));
      },
    });
    const r = await fetch(url(server), { method: 'POST', headers: { 'content-type': 'application/json' }, body, duplex: 'half' } as RequestInit);
    expect(r.status).toBe(413);
    await r.arrayBuffer();
  });

  it('on a raw socket: the status line arrives while the body is still being written; the server closes once it has all been read', async () => {
    const total = 32 * MIB;
    // The client holds the last 24 MiB back until the answer has begun: it comes only if the server answers
    // before the body is complete.
    const r = await rawPost(server, `POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${total}\r\n\r\n`, total, 8 * MIB);
    expect(r.read).toMatch(/^HTTP\/1\.1 413 /);
    expect(r.read.toLowerCase()).toContain('connection: close');
    expect(r.error).toBeUndefined(); // no reset, no broken pipe
    expect(r.written).toBe(total);
    // In that order: the status line while the body was still being written, the server's FIN only after all of it.
    console.log(`linger: the answer began after ${(r.writtenAtAnswer / MIB).toFixed(0)} of ${total / MIB} MiB written; the server's FIN after ${(r.writtenAtEnd / MIB).toFixed(0)}`);
    expect(r.writtenAtAnswer).toBeLessThanOrEqual(8 * MIB);
    expect(r.writtenAtEnd).toBe(total);
  });

  it('a declared length the client never sends in full, then its FIN: a whole answer, and the connection closed', async () => {
    const r = await rawPost(server, `POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${10 * MIB}\r\n\r\n`, 3 * MIB);
    expect(r.read).toMatch(/^HTTP\/1\.1 413 /);
    const length = Number(/content-length: (\d+)/i.exec(r.read)?.[1]);
    const body = r.read.slice(r.read.indexOf('\r\n\r\n') + 4);
    expect(Buffer.byteLength(body, 'latin1')).toBe(length); // the answer is whole, not cut short
    expect(JSON.parse(body).code).toBe('SLABSERVE_PAYLOAD_TOO_LARGE');
  });

  it('nothing is left behind: no slot in use, no request counted in progress', async () => {
    for (const s of [server]) {
      await eventually('slots and connections back to zero', async () => parseMetrics(await (await fetch(url(s, '/metrics'))).text()), (m) => m.sum('slabserve_slots_in_use') === 0 && m.sum('slabserve_gateway_connections', { kind: 'http' }) <= 1);
    }
  });
});
