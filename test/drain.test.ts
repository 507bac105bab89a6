/**
 * SIGTERM under load: the drain loses no request to a socket error. Clients
 * post /embed in a loop; SIGTERM comes while they do. Every request must end
 * in an answer (200 for those the server had taken, 503 for those that came
 * after the signal, each closing its connection) or in a refused connection
 * (the listen socket closed first); none may end in "other side closed",
 * ECONNRESET or EPIPE, which is what a connection closed under a request
 * looks like. Two loads: 32 keep-alive clients (Node's fetch, as a user's
 * would be), and 8 that open a connection per request (Python's urllib) and
 * so always have some in the listen socket's accept queue, where closing it
 * would reset them (src/accept-queue.ts). Repeated, in one process and in a
 * cluster of two.
 */
import { spawn, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
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

const LOAD_SCRIPT = fileURLToPath(new URL('./fixtures/no-keepalive-load.py', import.meta.url));
const python = spawnSync('python3', ['--version'], { stdio: 'ignore' }).status === 0;

/** test/fixtures/no-keepalive-load.py: urllib clients, one connection per request, until `stop()`. */
async function connectionPerRequestLoad(port: number): Promise<{ stop: () => Promise<Outcomes> }> {
  const child = spawn('python3', [LOAD_SCRIPT, String(port), '8'], { stdio: ['pipe', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d));
  child.stderr.on('data', (d: Buffer) => (stderr += d));
  const exited = new Promise<number | null>((r) => child.on('exit', r));
  await new Promise<void>((resolve, reject) => {
    child.stdout.on('data', () => stdout.includes('started\n') && resolve());
    void exited.then((code) => reject(new Error(`the load exited ${code}: ${stderr}`)));
  });
  return {
    stop: async () => {
      child.stdin.end();
      const code = await exited;
      if (code !== 0) throw new Error(`the load exited ${code}: ${stderr}`);
      const counts = JSON.parse(stdout.trim().split('\n').pop()!) as Record<string, number>;
      const out: Outcomes = { ok: 0, unavailable: 0, refused: 0, socketErrors: {}, other: {} };
      for (const [k, n] of Object.entries(counts)) {
        if (k === '200') out.ok += n;
        else if (k === '503') out.unavailable += n;
        else if (k === 'ConnectionRefusedError') out.refused += n;
        else if (/Reset|BrokenPipe|RemoteDisconnected|Aborted/.test(k)) out.socketErrors[k] = n;
        else out.other[k] = n;
      }
      return out;
    },
  };
}

type Load = (port: number) => { stop: () => Promise<Outcomes> } | Promise<{ stop: () => Promise<Outcomes> }>;

/** One drain under load: the outcomes of every request, and the exit code. */
async function drainUnderLoad(args: string[], startLoad: Load = keepAliveLoad): Promise<{ outcomes: Outcomes; code: number | null; stderr: string }> {
  const server = await serveCli(args);
  const load = await startLoad(server.port);
  await sleep(1500);
  server.kill('SIGTERM');
  const { code, signal } = await server.exited;
  await sleep(200); // the clients meet the closed port
  return { outcomes: await load.stop(), code, stderr: `${server.stderr()}\n(exit code ${code}, signal ${signal})` };
}

describe('SIGTERM under keep-alive load', () => {
  it('three drains in a row: every request answered (200 or 503) or refused a connection, none lost to a closed socket', async () => {
    for (let i = 0; i < 3; i++) {
      const { outcomes, code, stderr } = await drainUnderLoad(['--gateway-threads', '2']);
      console.log(`drain ${i + 1}: ${JSON.stringify(outcomes)}`);
      expect(code, stderr.slice(-3000)).toBe(0);
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

describe.skipIf(!python)('SIGTERM under load from clients that open a connection per request', () => {
  for (const [where, args] of [
    ['one process', ['--gateway-threads', '2']],
    ['a cluster of two processes', ['--processes', '2', '--gateway-threads', '1']],
  ] as const) {
    it(`${where}, three drains: every request answered or refused, none reset from the accept queue`, async () => {
      for (let i = 0; i < 3; i++) {
        const { outcomes, code, stderr } = await drainUnderLoad([...args], connectionPerRequestLoad);
        console.log(`${where}, drain ${i + 1}: ${JSON.stringify(outcomes)}`);
        expect(code, stderr.slice(-500)).toBe(0);
        expect(stderr).not.toContain('may reset queued connections');
        expect(outcomes.ok).toBeGreaterThan(0);
        expect(outcomes.refused).toBeGreaterThan(0);
        expect(outcomes.socketErrors).toEqual({});
        expect(outcomes.other).toEqual({});
      }
    }, 240_000);
  }
});
