/**
 * Refusals a client reads even when it writes its whole body before reading
 * and asked for `Connection: close`, as Python's urllib does (issue 22, item
 * 6): uWS closes such a connection as soon as the answer ends, and with body
 * bytes unread the close is a reset, so the client got BrokenPipeError
 * instead of the 413. The answer now waits for the rest of the body, read and
 * dropped, up to --max-discard-bytes in all and --discard-timeout-ms; past
 * either it is answered and closed at once (README, docs/security.md).
 * Clients that keep their connection are answered at once (test/linger.test.ts).
 */
import { spawn } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type Server } from '../dist/src/main/server.js';
import { chunk, parseMetrics, RawConnection, requestHead } from './fixtures/http-client.js';
import { toolOnPath } from './fixtures/system-tools.js';
import { eventually, testServerConfig } from './helpers.js';

const MIB = 2 ** 20;
const KEY = 'discard-test-key';
const LIMITS = { maxBodyBytes: 1 * MIB, maxDiscardBytes: 8 * MIB, discardTimeoutMs: 400 };
let server: Server;

beforeAll(async () => {
  server = await startServer(testServerConfig({ models: ['tiny-embed'], apiKeys: [KEY], ...LIMITS }));
  await server.ready;
}, 120_000);

afterAll(async () => {
  await server?.close();
});

/** Runs a python3 script with the server's port as argv[1]; its stdout, one JSON object a line. */
function runPython(script: string): Promise<Record<string, unknown>[]> {
  return new Promise((resolve, reject) => {
    const child = spawn('python3', ['-c', script, String(server.port)], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d));
    child.stderr.on('data', (d: Buffer) => (err += d));
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 ? resolve(out.trim().split('\n').map((l) => JSON.parse(l))) : reject(new Error(`python3 exited ${code}: ${err}`))));
  });
}

/** urllib.request.urlopen of a POST with `size` bytes of body, for each [path, size, key?]: what it saw. */
const URLLIB = (cases: [string, number, boolean][]) => `
import json, sys, urllib.request, urllib.error
port = sys.argv[1]
for path, size, key in ${JSON.stringify(cases).replace(/true/g, 'True').replace(/false/g, 'False')}:
    headers = {'content-type': 'application/json'}
    if key: headers['authorization'] = 'Bearer ${KEY}'
    req = urllib.request.Request('http://127.0.0.1:' + port + path, data=b' ' * size, headers=headers, method='POST')
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            print(json.dumps({'status': r.status}))
    except urllib.error.HTTPError as e:
        print(json.dumps({'status': e.code, 'body': json.loads(e.read())}))
    except Exception as e:
        err = e.reason if isinstance(e, urllib.error.URLError) else e
        print(json.dumps({'error': type(err).__name__}))
`;

/** Writes `head`, then `bodyBytes` of body in 1 MiB pieces (or chunked), stopping at the first write error. */
async function send(head: string, bodyBytes: number, opts: { chunked?: boolean; end?: boolean } = {}): Promise<{ c: RawConnection; written: number; error?: string }> {
  const c = await RawConnection.open(server.port);
  const piece = Buffer.alloc(MIB, 0x20);
  let written = 0;
  try {
    await c.write(head);
    while (written < bodyBytes) {
      const n = Math.min(MIB, bodyBytes - written);
      await c.write(opts.chunked ? chunk(piece.subarray(0, n)) : piece.subarray(0, n));
      written += n;
    }
    if (opts.chunked && opts.end !== false) await c.write('0\r\n\r\n');
  } catch (err) {
    return { c, written, error: (err as NodeJS.ErrnoException).code ?? String(err) };
  }
  return { c, written };
}

const closingHead = (headers: Record<string, string | number>) =>
  requestHead('POST', '/embed', { 'content-type': 'application/json', authorization: `Bearer ${KEY}`, connection: 'close', ...headers });

describe('a refusal with a body still arriving, to a client that asked Connection: close', () => {
  beforeAll(() => {
    toolOnPath('python3');
  }, 120_000);

  it("Python's urllib with a 5 MB body reads our 413, 401 and 404, not BrokenPipeError", async () => {
    const seen = await runPython(URLLIB([['/embed', 5_000_000, true], ['/embed', 5_000_000, false], ['/no-such-route', 5_000_000, true]]));
    expect(seen).toEqual([
      { status: 413, body: { error: expect.stringMatching(/request body of 5000000 bytes exceeds the limit of 1048576 \(--max-body-bytes\)/), error_type: 'Validation', type: 'payload_too_large', code: 'SLABSERVE_PAYLOAD_TOO_LARGE' } },
      { status: 401, body: expect.objectContaining({ code: 'SLABSERVE_UNAUTHORIZED' }) },
      { status: 404, body: expect.objectContaining({ code: 'SLABSERVE_ROUTE_NOT_FOUND' }) },
    ]);
  });

  it('Python: a body over --max-discard-bytes is answered and closed at once: a connection error, as the docs say', async () => {
    const [seen] = await runPython(URLLIB([['/embed', 64 * MIB, true]]));
    expect(['BrokenPipeError', 'ConnectionResetError']).toContain(seen!.error);
  });

  it('a raw client writing its whole 5 MB body before reading: every byte taken, then the 413, then the close', async () => {
    const { c, written, error } = await send(closingHead({ 'content-length': 5_000_000 }), 5_000_000);
    expect(error).toBeUndefined();
    expect(written).toBe(5_000_000);
    const r = await c.response(10_000);
    expect(r.status).toBe(413);
    expect(JSON.parse(r.body).code).toBe('SLABSERVE_PAYLOAD_TOO_LARGE');
    await c.serverClose(10_000);
  });

  it('chunked, growing past --max-body-bytes but within the bound: the 413 once the last chunk is in', async () => {
    const { c, written, error } = await send(closingHead({ 'transfer-encoding': 'chunked' }), 4 * MIB, { chunked: true });
    expect(error).toBeUndefined();
    expect(written).toBe(4 * MIB);
    expect((await c.response(10_000)).status).toBe(413);
    await c.serverClose(10_000);
  });

  it('declared over --max-discard-bytes: answered and closed before the client could write it (no 64 MiB read and dropped)', async () => {
    const { c, written, error } = await send(closingHead({ 'content-length': 64 * MIB }), 64 * MIB);
    expect(error).toMatch(/EPIPE|ECONNRESET/);
    expect(written).toBeLessThan(64 * MIB);
    await c.serverClose(10_000);
  });

  it('chunked, growing past --max-discard-bytes: closed once it does', async () => {
    const { c, written, error } = await send(closingHead({ 'transfer-encoding': 'chunked' }), 64 * MIB, { chunked: true });
    expect(error).toMatch(/EPIPE|ECONNRESET/);
    expect(written).toBeLessThan(64 * MIB);
    await c.serverClose(10_000);
  });

  it('a client that stops sending: answered whole after --discard-timeout-ms, then closed', async () => {
    const { c, error } = await send(closingHead({ 'content-length': 4 * MIB }), 0);
    expect(error).toBeUndefined();
    await c.write(Buffer.alloc(64 * 1024, 0x20)); // then nothing: neither the rest nor a FIN
    const r = await c.response(5_000); // well before uWS's own 10 s idle close, which answers nothing
    expect(r.status).toBe(413);
    expect(JSON.parse(r.body).code).toBe('SLABSERVE_PAYLOAD_TOO_LARGE');
    await c.serverClose(5_000);
  });

  it('a client that goes away while its answer waits for the body: nothing held, the server serves on', async () => {
    const { c } = await send(closingHead({ 'content-length': 4 * MIB }), MIB);
    c.destroy();
    const ok = await fetch(`http://127.0.0.1:${server.port}/embed`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` }, body: JSON.stringify({ inputs: 'still here' }) });
    expect(ok.status).toBe(200);
    const metrics = () => fetch(`http://127.0.0.1:${server.port}/metrics`, { headers: { authorization: `Bearer ${KEY}` } }).then(async (r) => parseMetrics(await r.text()));
    await eventually('no HTTP request left in progress', metrics, (m) => m.sum('slabserve_gateway_connections', { kind: 'http' }) <= 1 && m.sum('slabserve_slots_in_use') === 0);
  });
});
