/**
 * The HTTP clients the load generator (bench/load.ts) drives a server with.
 *
 * Why the client in the bench's main thread (not a worker): during an HTTP
 * phase nothing else runs in that process (the raw sessions and the engines of
 * the other phases sit idle), so the load generator already has an event loop
 * of its own; its CPU and event-loop utilization are reported with each row.
 *
 * Clients (--http-client):
 *   http    node:http with a keep-alive Agent, maxSockets = concurrency (default: built in)
 *   undici  undici's Pool (connections = concurrency, pipelining 1), if the `undici`
 *           package is installed (it is not a dependency yet); cheaper per request than node:http
 *
 * Not the global fetch (Node's bundled undici): on this machine it cost 600-700 us of
 * client CPU per request at 64 clients against node:http's 85-170, and held
 * the server to half the requests/s (bench/README.md).
 */
import http from 'node:http';

export type ClientKind = 'http' | 'undici';

export interface LoadClient {
  readonly kind: ClientKind;
  /** POSTs `body` (JSON) to `path`; resolves with the status and the whole response body. Rejects after `timeoutMs`. */
  post(path: string, body: Buffer): Promise<{ status: number; body: Buffer }>;
  /** TCP connections opened so far (null where the client does not say). */
  connections(): number | null;
  /** Closes every connection. */
  close(): Promise<void>;
}

const JSON_HEADERS = { 'content-type': 'application/json', accept: 'application/json' };

function nodeHttpClient(origin: string, connections: number, timeoutMs: number): LoadClient {
  const agent = new http.Agent({ keepAlive: true, maxSockets: connections, maxFreeSockets: connections });
  const url = new URL(origin);
  const sockets = new Set<unknown>();
  return {
    kind: 'http',
    post: (path, body) =>
      new Promise((resolve, reject) => {
        const req = http.request(
          { host: url.hostname, port: url.port, path, method: 'POST', agent, headers: { ...JSON_HEADERS, 'content-length': body.byteLength } },
          (res) => {
            const chunks: Buffer[] = [];
            res.on('data', (c: Buffer) => chunks.push(c));
            res.on('end', () => resolve({ status: res.statusCode ?? 0, body: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks) }));
            res.on('error', reject);
          },
        );
        req.once('socket', (s) => sockets.add(s));
        req.setTimeout(timeoutMs, () => req.destroy(new Error(`no answer in ${timeoutMs} ms`)));
        req.on('error', reject);
        req.end(body);
      }),
    connections: () => sockets.size,
    close: async () => {
      agent.destroy();
      sockets.clear();
    },
  };
}

/** The parts of undici's Pool this file uses (undici is not a dependency: imported by name at run time). */
interface UndiciPool {
  request(opts: { path: string; method: string; body: Buffer; headers: Record<string, string>; headersTimeout: number; bodyTimeout: number }): Promise<{
    statusCode: number;
    body: { arrayBuffer(): Promise<ArrayBuffer> };
  }>;
  on(event: 'connect', fn: () => void): unknown;
  destroy(): Promise<void>;
}

async function undiciClient(origin: string, connections: number, timeoutMs: number): Promise<LoadClient> {
  const name = 'undici';
  let mod: { Pool: new (origin: string, opts: { connections: number; pipelining: number }) => UndiciPool };
  try {
    mod = (await import(name)) as typeof mod;
  } catch {
    throw new Error('--http-client undici: the undici package is not installed (npm i -D undici@6); use --http-client http');
  }
  const pool = new mod.Pool(origin, { connections, pipelining: 1 });
  let opened = 0;
  pool.on('connect', () => opened++);
  return {
    kind: 'undici',
    post: async (path, body) => {
      const r = await pool.request({ path, method: 'POST', body, headers: JSON_HEADERS, headersTimeout: timeoutMs, bodyTimeout: timeoutMs });
      return { status: r.statusCode, body: Buffer.from(await r.body.arrayBuffer()) };
    },
    connections: () => opened,
    close: () => pool.destroy(),
  };
}

export async function createLoadClient(kind: ClientKind, origin: string, connections: number, timeoutMs = 10_000): Promise<LoadClient> {
  if (kind === 'http') return nodeHttpClient(origin, connections, timeoutMs);
  return undiciClient(origin, connections, timeoutMs);
}
