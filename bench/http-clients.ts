/**
 * The Node load generator's HTTP client (bench/load.ts): node:http with a
 * keep-alive Agent, maxSockets = concurrency. Not the global fetch (Node's
 * undici): it cost several times node:http's client CPU per request, CPU the
 * server under test shares on 2 cores.
 */
import http from 'node:http';

export interface LoadClient {
  /** POSTs `body` (JSON) to `path`; resolves with the status and the whole response body. Rejects after `timeoutMs`. */
  post(path: string, body: Buffer): Promise<{ status: number; body: Buffer }>;
  /** Closes every connection. */
  close(): Promise<void>;
}

const JSON_HEADERS = { 'content-type': 'application/json', accept: 'application/json' };

export function createLoadClient(origin: string, connections: number, timeoutMs = 10_000): LoadClient {
  const agent = new http.Agent({ keepAlive: true, maxSockets: connections, maxFreeSockets: connections });
  const url = new URL(origin);
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
        req.setTimeout(timeoutMs, () => req.destroy(new Error(`no answer in ${timeoutMs} ms`)));
        req.on('error', reject);
        req.end(body);
      }),
    close: async () => agent.destroy(),
  };
}
