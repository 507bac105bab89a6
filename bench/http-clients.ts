/**
 * The HTTP clients the load generator (bench/load.ts) drives a server with.
 *
 * Why the client in the bench's main thread (not a worker): during an HTTP
 * phase nothing else runs in that process (the raw sessions and the engines of
 * the other phases sit idle), so the load generator already has an event loop
 * of its own; its CPU and event-loop utilization are reported with each row.
 *
 * The client: node:http with a keep-alive Agent, maxSockets = concurrency. It
 * drives the open loops and the Node generator's closed loops; HTTP closed
 * loops run on wrk where it is installed (bench/load.ts), which costs a sixth
 * of this client's CPU per request.
 *
 * Not the global fetch (Node's bundled undici): on this machine it cost 600-700 us of
 * client CPU per request at 64 clients against node:http's 85-170, and held
 * the server to half the requests/s (bench/README.md).
 */
import http from 'node:http';

export interface LoadClient {
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

export function createLoadClient(origin: string, connections: number, timeoutMs = 10_000): LoadClient {
  return nodeHttpClient(origin, connections, timeoutMs);
}
