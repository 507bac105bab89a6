/**
 * SIGTERM under load: the drain loses no request to a socket error. Clients
 * post /embed in a loop; SIGTERM comes once every one of them has been
 * answered. Every request must end in an answer (200 for those the server had
 * taken, 503 for those that came after the signal, each closing its
 * connection) or in a refused connection (the listen socket closed first);
 * none may end in "other side closed", ECONNRESET or EPIPE, which is what a
 * connection closed under a request looks like. Two loads: 32 keep-alive
 * clients (Node's fetch, as a user's would be), and 8 that open a connection
 * per request (Python's urllib) and so always have some in the listen socket's
 * accept queue, where closing it would reset them (src/main/drain/accept-queue.ts).
 * Repeated, in one process and in a cluster of two. In one process, beside the
 * load, a keep-alive connection left idle asks once the server has said it is
 * draining: the 503 and its Connection: close are asserted on it. And in
 * process, with the inference loop held: every request admitted before the
 * stop signal is answered 200 with its reference row once the loop runs
 * again, while one sent after it on an idle connection is refused 503.
 */
import { spawn } from 'node:child_process';
import http from 'node:http';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
import { toolOnPath } from './fixtures/system-tools.js';
import { serveCli } from './cli-process.js';
import { startServer, TEST_HOOKS_ENV } from '../dist/src/main/server.js';
import { parseMetrics, RawConnection, requestHead } from './fixtures/http-client.js';
import { eventually, makeRandom, maxAbsDiff, openReference, randomTexts, sleep, testServerConfig } from './helpers.js';

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

/** A running load: `warm` once its clients are being answered, `refused` at its first refused connection. */
interface RunningLoad {
  warm: Promise<void>;
  refused: Promise<void>;
  stop: () => Promise<Outcomes>;
}

/** `CLIENTS` loops of POST /embed on keep-alive connections until `stop()`; warm once every client has had a 200. */
function keepAliveLoad(port: number): RunningLoad {
  const out: Outcomes = { ok: 0, unavailable: 0, refused: 0, socketErrors: {}, other: {} };
  let running = true;
  let warmed = 0;
  let isWarm = () => {};
  let wasRefused = () => {};
  const warm = new Promise<void>((r) => (isWarm = r));
  const refused = new Promise<void>((r) => (wasRefused = r));
  const body = JSON.stringify({ inputs: 'where is my parcel, it was due yesterday' });
  const loop = async () => {
    let answered = false;
    while (running) {
      try {
        const r = await fetch(`http://127.0.0.1:${port}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
        await r.arrayBuffer();
        if (r.status === 200) {
          out.ok++;
          if (!answered && ++warmed === CLIENTS) isWarm();
          answered = true;
        } else if (r.status === 503 && r.headers.get('connection') === 'close') out.unavailable++;
        else {
          const what = `status ${r.status}${r.status === 503 ? ' without connection: close' : ''}`;
          out.other[what] = (out.other[what] ?? 0) + 1;
        }
      } catch (err) {
        const code = codeOf(err);
        if (code === 'ECONNREFUSED') {
          out.refused++;
          wasRefused();
          await sleep(5); // the server is gone: do not spin
        } else if (SOCKET_ERRORS.has(code)) out.socketErrors[code] = (out.socketErrors[code] ?? 0) + 1;
        else out.other[code] = (out.other[code] ?? 0) + 1;
      }
    }
  };
  const loops = Array.from({ length: CLIENTS }, loop);
  return {
    warm,
    refused,
    stop: async () => {
      running = false;
      await Promise.all(loops);
      return out;
    },
  };
}

const LOAD_SCRIPT = fileURLToPath(new URL('./fixtures/no-keepalive-load.py', import.meta.url));

/** test/fixtures/no-keepalive-load.py: urllib clients, one connection per request, until `stop()`; warm once one has had a 200. */
async function connectionPerRequestLoad(port: number): Promise<RunningLoad> {
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
  // The script says "refused" at its first refused connection.
  const refused = new Promise<void>((resolve) => child.stdout.on('data', () => stdout.includes('refused\n') && resolve()));
  return {
    warm: Promise.resolve(),
    refused,
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

type Load = (port: number) => RunningLoad | Promise<RunningLoad>;

/** What a request sent on an idle keep-alive connection got once the server said it was draining. */
interface Probe {
  status: number;
  connection: string | undefined;
  code: string;
  /** Sent on the connection that was idle (not a new one). */
  reusedSocket: boolean;
}

/** One request with `agent` (keep-alive, one socket): its status, Connection header, error code, and whether it reused the idle socket. */
function ask(port: number, agent: http.Agent, method: string, path: string, body?: string): Promise<Probe> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path, agent, headers: body ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } : {} }, (res) => {
      let text = '';
      res.on('data', (d: Buffer) => (text += d));
      res.on('end', () => {
        let code = '';
        try {
          code = (JSON.parse(text) as { code?: string }).code ?? '';
        } catch {
          // not JSON
        }
        resolve({ status: res.statusCode!, connection: res.headers.connection, code, reusedSocket: req.reusedSocket });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * One drain under load, SIGTERM once the load is warm: the outcomes of every request (taken once a client has met
 * the closed port), the exit code, and in one process (`probe`) the answer to a POST /embed sent, once the server
 * has logged that it is draining, on a keep-alive connection left idle since its first answer.
 */
async function drainUnderLoad(args: string[], startLoad: Load = keepAliveLoad): Promise<{ outcomes: Outcomes; code: number | null; stderr: string; probe?: Probe }> {
  const server = await serveCli(args);
  const cluster = args.indexOf('--processes');
  if (cluster >= 0) {
    // Every process warmed up first: a 503 then is a draining process's, which must close its connection.
    const processes = Number(args[cluster + 1]);
    const metrics = async () => parseMetrics(await (await fetch(`http://127.0.0.1:${server.port}/metrics`)).text());
    await eventually('every process of the cluster ready', metrics, (m) => m.sum('slabserve_cluster_processes_ready') === processes, 60_000, (m) => m.sum('slabserve_cluster_processes_ready'));
  }
  const load = await startLoad(server.port);
  await load.warm;
  // A cluster's primary says it is draining before its processes begin: the probe needs the process's own word.
  const agent = cluster >= 0 ? null : new http.Agent({ keepAlive: true, maxSockets: 1 });
  const before = agent ? await ask(server.port, agent, 'GET', '/readyz') : null;
  if (before) expect(before.status).toBe(200);
  server.kill('SIGTERM');
  let probe: Probe | undefined;
  if (agent) {
    await eventually('the server logs that it is draining', async () => server.stderr(), (e) => /: SIGTERM: draining/.test(e), 20_000, (e) => e.slice(-500));
    probe = await ask(server.port, agent, 'POST', '/embed', JSON.stringify({ inputs: 'where is my parcel' }));
    agent.destroy();
  }
  const { code, signal } = await server.exited;
  // The clients meet the closed port (the bound only catches a hang).
  await Promise.race([load.refused, sleep(30_000).then(() => Promise.reject(new Error('no client met the closed port within 30 s of the exit')))]);
  return { outcomes: await load.stop(), code, stderr: `${server.stderr()}\n(exit code ${code}, signal ${signal})`, ...(probe ? { probe } : {}) };
}

/** The idle connection's request after the drain began: refused before inference, 503, closing its connection. */
const DRAINING: Probe = { status: 503, connection: 'close', code: 'SLABSERVE_NOT_READY', reusedSocket: true };

describe('SIGTERM under keep-alive load', () => {
  it('three drains in a row: every request answered (200 or 503) or refused a connection, none lost to a closed socket', async () => {
    for (let i = 0; i < 3; i++) {
      const { outcomes, code, stderr, probe } = await drainUnderLoad(['--gateway-threads', '2']);
      console.log(`drain ${i + 1}: ${JSON.stringify(outcomes)}; the idle connection after the signal: ${JSON.stringify(probe)}`);
      expect(code, stderr.slice(-3000)).toBe(0);
      expect(probe).toEqual(DRAINING);
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

describe('SIGTERM under load from clients that open a connection per request', () => {
  beforeAll(() => {
    toolOnPath('python3');
  }, 120_000);

  for (const [where, args] of [
    ['one process', ['--gateway-threads', '2']],
    ['a cluster of two processes', ['--processes', '2', '--gateway-threads', '1']],
  ] as const) {
    it(`${where}, three drains: every request answered or refused, none reset from the accept queue`, async () => {
      for (let i = 0; i < 3; i++) {
        const { outcomes, code, stderr, probe } = await drainUnderLoad([...args], connectionPerRequestLoad);
        console.log(`${where}, drain ${i + 1}: ${JSON.stringify(outcomes)}${probe ? `; the idle connection after the signal: ${JSON.stringify(probe)}` : ''}`);
        expect(code, stderr.slice(-500)).toBe(0);
        if (!(args as readonly string[]).includes('--processes')) expect(probe).toEqual(DRAINING);
        expect(stderr).not.toContain('may reset queued connections');
        expect(outcomes.ok).toBeGreaterThan(0);
        expect(outcomes.refused).toBeGreaterThan(0);
        expect(outcomes.socketErrors).toEqual({});
        expect(outcomes.other).toEqual({});
      }
    }, 240_000);
  }
});

describe('the drain answers what it had admitted', () => {
  it('requests queued when the stop signal comes are answered 200 with the reference rows; one sent after it is refused 503', async () => {
    process.env[TEST_HOOKS_ENV] = '1';
    const stop = new AbortController();
    // No grace after the last request: a drain that did not wait for the admitted ones would close on them at once.
    const server = await startServer(testServerConfig({ models: ['tiny-embed'], signal: stop.signal, drainGraceMs: 0 }));
    const { ref, tok, words } = await openReference('tiny-embed');
    const idle = await RawConnection.open(server.port); // a keep-alive connection open before the signal
    try {
      await server.ready;
      await idle.write(requestHead('GET', '/livez', {}));
      expect((await idle.response()).status).toBe(200);
      const texts = randomTexts(makeRandom('drain admitted'), words, 8, 20);
      const hooks = server.testHooks!;
      await hooks.holdInference();
      const answers = texts.map((t) =>
        fetch(`${server.url}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: t }) }).then(async (r) => ({ status: r.status, body: (await r.json()) as number[][] })),
      );
      await eventually('every request admitted and queued', async () => hooks.inputsWaiting('tiny-embed'), (n) => n === texts.length);
      stop.abort(); // what SIGTERM does in the CLI (src/cli.ts): the drain begins, the listen sockets close
      const body = JSON.stringify({ inputs: 'sent after the signal' });
      const seen = idle.received; // the /livez answer before
      await idle.write(requestHead('POST', '/embed', { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }) + body);
      const late = await idle.response(15_000, seen);
      expect({ status: late.status, connection: late.headers.connection }).toEqual({ status: 503, connection: 'close' });
      hooks.releaseInference();
      for (const [i, a] of (await Promise.all(answers)).entries()) {
        expect(a.status, `admitted request ${i}`).toBe(200);
        expect(maxAbsDiff(a.body[0]!, (await ref.rowOfText(tok, texts[i]!)).slice(0, ref.spec.dimension))).toBeLessThan(1e-5);
      }
      await server.close(); // the drain the signal began: resolves once it has ended
    } finally {
      delete process.env[TEST_HOOKS_ENV];
      idle.destroy();
      await ref.close();
      await server.close();
    }
  });
});
