/**
 * text-embeddings-inference's error shape on our routes: `{"error", "error_type"}` as TEI
 * answers (router/src/lib.rs's ErrorResponse, read by Haystack's TEI components), with our
 * `type` and `code` kept beside them. On a real server (port 0, CPU).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { STATUS_OF_TYPE } from '../dist/src/shared/error-status.js';
import { TEI_ERROR_TYPE } from '../dist/src/gateway/http/request-context.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { testServerConfig } from './helpers.js';

let server: Server;

beforeAll(async () => {
  server = await startServer(testServerConfig({ models: ['tiny-embed', 'tiny-rerank'], batching: { buckets: [8, 16, 32, 64, 128] } }));
  await server.ready;
}, 120_000);

afterAll(async () => {
  await server?.close();
});

async function send(method: string, path: string, body?: string): Promise<{ status: number; body: any }> {
  const r = await fetch(server.url + path, { method, headers: body !== undefined ? { 'content-type': 'application/json' } : {}, ...(body !== undefined ? { body } : {}) });
  return { status: r.status, body: JSON.parse(await r.text()) };
}

/** TEI's ErrorType names (router/src/lib.rs). */
const TEI_KINDS = ['Unhealthy', 'Backend', 'Overloaded', 'Validation', 'Tokenizer', 'Empty'];

describe("TEI's error_type", () => {
  it('every error family has one of TEI\'s kinds: load and time Overloaded, not ready Unhealthy, failures Backend, client errors Validation', () => {
    for (const family of Object.keys(STATUS_OF_TYPE)) expect(TEI_KINDS, family).toContain(TEI_ERROR_TYPE[family as keyof typeof TEI_ERROR_TYPE]);
    expect(TEI_ERROR_TYPE).toMatchObject({ overloaded: 'Overloaded', timeout: 'Overloaded', unavailable: 'Unhealthy', backend: 'Backend', validation: 'Validation', too_long: 'Validation' });
  });

  it('the TEI routes answer {error, error_type, type, code}: a bad field, a missing query, too long, an unknown model, a wrong method, a malformed body', async () => {
    const cases: [string, string, string | undefined, number, string, string][] = [
      ['POST', '/embed', JSON.stringify({ inputs: 'hi', normalise: true }), 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['POST', '/rerank', JSON.stringify({ texts: ['a'] }), 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['POST', '/rerank', JSON.stringify({ query: 'q', texts: [] }), 422, 'validation', 'SLABSERVE_INVALID_INPUT'],
      ['POST', '/embed', JSON.stringify({ inputs: 'parcel '.repeat(200) }), 413, 'too_long', 'SLABSERVE_INPUT_TOO_LONG'],
      ['POST', '/embed', JSON.stringify({ inputs: 'hi', model: 'nope' }), 404, 'not_found', 'SLABSERVE_MODEL_NOT_FOUND'],
      ['GET', '/embed', undefined, 405, 'method_not_allowed', 'SLABSERVE_METHOD_NOT_ALLOWED'],
      ['POST', '/embed', '{"inputs": ', 400, 'validation', 'SLABSERVE_MALFORMED_BODY'],
    ];
    for (const [method, path, body, status, type, code] of cases) {
      const r = await send(method, path, body);
      const what = `${method} ${path} ${body?.slice(0, 60) ?? ''}`;
      expect(r.status, what).toBe(status);
      expect(r.body, what).toEqual({ error: expect.any(String), error_type: 'Validation', type, code });
    }
  });
});
