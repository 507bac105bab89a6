/**
 * SIGTERM under keep-alive load: the drain loses no request to a socket
 * error. 32 keep-alive clients (Node's fetch, as a user's would be) post
 * /embed in a loop; SIGTERM comes while they do. Every request must end in
 * an answer (200 for those the server had taken, 503 for those that came
 * after the signal, each closing its connection) or in a refused connection
 * (the listen socket closed first); none may end in "other side closed",
 * ECONNRESET or EPIPE, which is what a connection closed under a request
 * looks like. Repeated, and in a cluster.
 */
import { describe, expect, it } from 'vitest';
import { serveCli } from './cli-process.js';
import { sleep } from './helpers.js';

const CLIENTS = 32;

interface Outcomes {
  ok: number;
  unavailable: number;
  refused: number;
  /** Requests lost to a connection closed under them, by error code. */
  socketErrors: Record<string, number>;
  other: Record<string, number>;
}

/** The error code under a failed fetch (undici puts the socket's in `cause`). */
function codeOf(err: unknown): string {
  const cause = (err as { cause?: { code?: string; message?: string } }).cause;
  return cause?.code ?? cause?.message ?? (err as Error).message;
}

const SOCKET_ERRORS = new Set(['UND_ERR_SOCKET', 'ECONNRESET', 'EPIPE', 'UND_ERR_CLOSED', 'other side closed']);

/** `CLIENTS` loops of POST /embed on keep-alive connections until `stop()`. */
function keepAliveLoad(port: number): { stop: () => Promise<Outcomes> } {
  const out: Outcomes = { ok: 0, unavailable: 0, refused: 0, socketErrors: {}, other: {} };
  let running = true;
  const body = JSON.stringify({ inputs: 'where is my parcel, it was due yesterday' });
  const loop = async () => {
    while (running) {
      try {
        const r = await fetch(`http://127.0.0.1:${port}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
        await r.arrayBuffer();
        if (r.status === 200) out.ok++;
        else if (r.status === 503) out.unavailable++;
        else out.other[`status ${r.status}`] = (out.other[`status ${r.status}`] ?? 0) + 1;
      } catch (err) {
        const code = codeOf(err);
        if (code === 'ECONNREFUSED') {
          out.refused++;
          await sleep(5); // the server is gone: do not spin
        } else if (SOCKET_ERRORS.has(code)) out.socketErrors[code] = (out.socketErrors[code] ?? 0) + 1;
        else out.other[code] = (out.other[code] ?? 0) + 1;
      }
    }
  };
  const loops = Array.from({ length: CLIENTS }, loop);
  return {
    stop: async () => {
      running = false;
      await Promise.all(loops);
      return out;
    },
  };
}

/** One drain under load: the outcomes of every request, and the exit code. */
async function drainUnderLoad(args: string[]): Promise<{ outcomes: Outcomes; code: number | null; stderr: string }> {
  const server = await serveCli(args);
  const load = keepAliveLoad(server.port);
  await sleep(1500);
  server.kill('SIGTERM');
  const { code } = await server.exited;
  await sleep(200); // the clients meet the closed port
  return { outcomes: await load.stop(), code, stderr: server.stderr() };
}

describe('SIGTERM under keep-alive load', () => {
  it('three drains in a row: every request answered (200 or 503) or refused a connection, none lost to a closed socket', async () => {
    for (let i = 0; i < 3; i++) {
      const { outcomes, code, stderr } = await drainUnderLoad(['--gateway-threads', '2']);
      console.log(`drain ${i + 1}: ${JSON.stringify(outcomes)}`);
      expect(code, stderr.slice(-500)).toBe(0);
      expect(outcomes.ok).toBeGreaterThan(0);
      expect(outcomes.refused).toBeGreaterThan(0); // the clients did go on past the drain
      expect(outcomes.socketErrors).toEqual({});
      expect(outcomes.other).toEqual({});
    }
  }, 240_000);

  it('in a cluster of two processes too', async () => {
    const { outcomes, code, stderr } = await drainUnderLoad(['--processes', '2', '--gateway-threads', '1']);
    console.log(`cluster drain: ${JSON.stringify(outcomes)}`);
    expect(code, stderr.slice(-500)).toBe(0);
    expect(outcomes.ok).toBeGreaterThan(0);
    expect(outcomes.socketErrors).toEqual({});
    expect(outcomes.other).toEqual({});
  }, 120_000);
});
