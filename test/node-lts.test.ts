/**
 * slabserve on the Node.js that users have: the built server run by the
 * official Node.js 22 and 24 binaries (test/fixtures/node-runtimes.ts fetches
 * them, and Debian 13's glibc 2.41, which uWebSockets.js's binaries for them
 * need). On each: the start-up check picks the uWebSockets.js build that
 * loads and /info names it; /embed, /ws and gRPC (its port shared by two
 * gateway threads through Node's own reusePort) answer the reference rows;
 * SIGTERM drains and the process exits 0. And on Debian 12's glibc 2.36
 * (CI's), where no uWebSockets.js binary for Node.js 22 loads: `serve` is
 * refused before any model opens, saying what works, while the in-process
 * engine (`slabserve embed`, no uWebSockets.js) runs. The suite itself runs on
 * Node.js 20.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { glibcNeeded } from '../dist/src/gateway/uws.js';
import { CLI, portOutsideEphemeral, serveCli, type CliServer } from './cli-process.js';
import { grpcJsPackages, unaryCall } from './fixtures/grpc-js-client.js';
import { DEBIAN_GLIBC, NODE_RELEASES, officialNode, onDebianGlibc } from './fixtures/node-runtimes.js';
import { eventually, makeRandom, maxAbsDiff, openReference, randomTexts, type Reference, wsRequest } from './helpers.js';

const TEI_PROTO = fileURLToPath(new URL('../proto/tei.proto', import.meta.url));
const NEWER_UWS = '@btc-vision/uwebsockets.js';
const TOLERANCE = 1e-5;

let ref: Reference;
let tok: TextTokenizer;
let words: string[];

beforeAll(async () => {
  ({ ref, tok, words } = await openReference('tiny-embed'));
});
afterAll(() => ref?.close());

/** The reference row of `text`, without the norm the server's slot row carries last. */
const referenceRow = async (text: string) => (await ref.rowOfText(tok, text)).slice(0, ref.spec.dimension);

/** Listening sockets on `port` on this machine (TCP state 0A, IPv4 and IPv6): one per thread that binds it. */
function listenSocketsOn(port: number): number {
  const hex = `:${port.toString(16).toUpperCase().padStart(4, '0')}`;
  return ['/proc/net/tcp', '/proc/net/tcp6']
    .flatMap((f) => readFileSync(f, 'utf8').split('\n').slice(1))
    .map((l) => l.trim().split(/\s+/))
    .filter((c) => c[1]?.endsWith(hex) && c[3] === '0A').length;
}

/** `slabserve serve` run by `node` on Debian 13's glibc, two gateway threads, gRPC on a port of its own; resolves once every gateway started. */
async function serveOn(node: string): Promise<CliServer & { grpcPort: number }> {
  const grpcPort = await portOutsideEphemeral();
  const server = await serveCli(['--grpc-port', String(grpcPort), '--gateway-threads', '2', '--cache-mb', '0'], { run: (args) => onDebianGlibc('trixie', node, args), killAfterMs: 120_000 });
  // Every gateway thread started (one serves while the next starts): the line comes after them all.
  await eventually('the ready line', async () => server.stderr(), (e) => /slabserve: ready at/.test(e), 30_000, (e) => e.slice(-800));
  return { ...server, grpcPort };
}

/** POST /embed of `inputs`: its status and rows. */
async function embed(port: number, inputs: string[]): Promise<{ status: number; rows: number[][]; connection: string | null }> {
  const res = await fetch(`http://127.0.0.1:${port}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs }) });
  const body = (await res.json()) as number[][];
  return { status: res.status, rows: res.status === 200 ? body : [], connection: res.headers.get('connection') };
}

describe.each([22, 24] as const)('Node.js %s (official binary, glibc 2.41)', (line) => {
  let s: CliServer & { grpcPort: number };

  beforeAll(async () => {
    s = await serveOn(officialNode(line));
  }, 300_000);
  afterAll(() => s?.kill('SIGKILL')); // gone already when the drain case ran

  it('the start-up check chose the newer uWebSockets.js build, and /info and the log name it', async () => {
    const info = (await (await fetch(`http://127.0.0.1:${s.port}/info`)).json()) as { runtime: { node: string; uws: { package: string; version: string } } };
    expect(info.runtime.node).toBe(`v${NODE_RELEASES[line]}`);
    expect(info.runtime.uws.package).toBe(NEWER_UWS);
    expect(s.stderr()).toContain(`Node.js v${NODE_RELEASES[line]}, uWebSockets.js ${info.runtime.uws.version} (${NEWER_UWS})`);
  });

  it('/embed, /ws and gRPC answer the reference rows', async () => {
    const texts = randomTexts(makeRandom(`node ${line} rows`), words, 6, 30);
    const http = await embed(s.port, texts);
    expect(http.status).toBe(200);
    for (let i = 0; i < texts.length; i++) expect(maxAbsDiff(http.rows[i]!, await referenceRow(texts[i]!)), `/embed, text ${i}`).toBeLessThan(TOLERANCE);

    const ws = await wsRequest(s.port, { id: 1, op: 'embed', inputs: [texts[0]] });
    expect(ws.id).toBe(1);
    expect(maxAbsDiff(ws.result[0] as number[], await referenceRow(texts[0]!)), '/ws').toBeLessThan(TOLERANCE);

    // Both gateway threads hold a listen socket on gRPC's port: bound with Node's own SO_REUSEPORT.
    expect(listenSocketsOn(s.grpcPort)).toBe(2);
    const client = new (grpcJsPackages(TEI_PROTO).tei.v1.Embed)(`127.0.0.1:${s.grpcPort}`, grpc.credentials.createInsecure());
    try {
      const reply = (await unaryCall(client, 'Embed', { inputs: texts[1] })) as { embeddings: number[] };
      expect(maxAbsDiff(reply.embeddings, await referenceRow(texts[1]!)), 'gRPC').toBeLessThan(TOLERANCE);
    } finally {
      client.close();
    }
  });

  it('SIGTERM drains: requests end answered (200 with the reference row, or 503 closing the connection) or refused, never reset; exit 0', async () => {
    const text = 'where is my parcel, it was due yesterday';
    const want = await referenceRow(text);
    const outcomes = { ok: 0, okAfterSignal: 0, unavailable: 0, refused: 0, wrongRow: 0, other: [] as string[] };
    let signalled = false;
    let running = true;
    let answered = 0;
    const client = async (first: () => void) => {
      let firstDone = false;
      while (running) {
        try {
          const r = await embed(s.port, [text]);
          if (r.status === 200) {
            outcomes.ok++;
            if (signalled) outcomes.okAfterSignal++;
            if (maxAbsDiff(r.rows[0]!, want) >= TOLERANCE) outcomes.wrongRow++;
          } else if (r.status === 503 && r.connection === 'close') outcomes.unavailable++;
          else outcomes.other.push(`status ${r.status}, connection ${r.connection}`);
        } catch (err) {
          const code = (err as { cause?: { code?: string } }).cause?.code ?? (err as Error).message;
          if (code === 'ECONNREFUSED') {
            outcomes.refused++;
            return; // the listen socket is closed: the drain is under way
          }
          outcomes.other.push(code);
        }
        if (!firstDone) {
          firstDone = true;
          first();
        }
      }
    };
    const CLIENTS = 8;
    let allAnswered!: () => void;
    const warm = new Promise<void>((r) => (allAnswered = r));
    const loops = Array.from({ length: CLIENTS }, () => client(() => ++answered === CLIENTS && allAnswered()));
    await warm;
    signalled = true;
    s.kill('SIGTERM');
    const { code } = await s.exited;
    running = false;
    await Promise.all(loops);
    console.log(`Node.js ${line} drain: ${JSON.stringify(outcomes)}`);
    expect(outcomes.other).toEqual([]);
    expect(outcomes.wrongRow).toBe(0);
    expect(outcomes.ok).toBeGreaterThanOrEqual(CLIENTS);
    expect(code).toBe(0);
    expect(s.stderr()).toMatch(/slabserve: stopped/);
  });
});

describe("Node.js 22 on Debian 12's glibc 2.36 (CI's)", () => {
  const run = (args: string[]) => {
    const [cmd, argv] = onDebianGlibc('bookworm', officialNode(22), [CLI, ...args]);
    return spawnSync(cmd, argv, { encoding: 'utf8', timeout: 60_000 });
  };
  const glibc = DEBIAN_GLIBC.bookworm;
  const newerNeeds = () => glibcNeeded(fileURLToPath(new URL(`../node_modules/${NEWER_UWS}/uws_linux_x64_127.node`, import.meta.url)))!;

  it('`serve` is refused before any model opens, naming what works; in a cluster, by the primary before any process starts', () => {
    for (const extra of [[], ['--processes', '2']]) {
      const r = run(['serve', '--host', '127.0.0.1', '--port', '0', '--device', 'cpu', '--model', 'tiny-embed', ...extra]);
      expect(r.status, r.stderr).toBe(1);
      expect(r.stderr).toContain('SLABSERVE_NO_NATIVE_BINARY');
      expect(r.stderr).toContain(`Node.js v${NODE_RELEASES[22]}, ABI 127, on linux-x64 with glibc ${glibc}`);
      expect(r.stderr).toContain(`on this glibc ${glibc}: Node.js 20;`);
      expect(r.stderr).toContain(`Node.js 20, 22, 24, 25 on a system with glibc >= ${newerNeeds()}`);
      expect(r.stderr).toContain('Docker image');
      expect(r.stderr).not.toMatch(/opening |listening on|cluster: /);
    }
  });

  it('the in-process engine, which needs no uWebSockets.js, runs: `slabserve embed` prints the reference row', async () => {
    const text = 'cancel my plan';
    const r = run(['embed', '--device', 'cpu', '--model', 'tiny-embed', text]);
    expect(r.status, r.stderr).toBe(0);
    const rows = JSON.parse(r.stdout) as number[][];
    expect(maxAbsDiff(rows[0]!, await referenceRow(text))).toBeLessThan(TOLERANCE);
  });
});
