/**
 * The model repository in a cluster (--processes 2, a real CLI in a child process): a load or an
 * unload through any process is applied by the primary to every process and answered once all
 * have; the index is merged; a process restarted later starts with the set as it is then.
 */
import { mkdtempSync, rmSync, writeFileSync, cpSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { writePreset } from '../dist/models/generator/presets.js';
import { serveCli } from './cli-process.js';
import { eventually } from './helpers.js';

const repo = mkdtempSync(join(tmpdir(), 'slabserve-repository-cluster-'));
writePreset('tiny-embed', repo);
writePreset('tiny-intent', repo);
cpSync(join(repo, 'tiny-intent'), join(repo, 'broken'), { recursive: true });
writeFileSync(join(repo, 'broken', 'model.onnx'), 'not an onnx file');
afterAll(() => rmSync(repo, { recursive: true, force: true }));

/** POST on a fresh connection (closed after): the kernel spreads these over both processes. */
function post(port: number, path: string, body?: unknown): Promise<{ status: number; body: any }> {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? '' : JSON.stringify(body);
    const req = http.request({ host: '127.0.0.1', port, path, method: 'POST', agent: false, headers: { connection: 'close', 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } }, (res) => {
      let text = '';
      res.on('data', (d) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode!, body: text ? JSON.parse(text) : undefined }));
    });
    req.on('error', reject);
    req.end(data);
  });
}

/** Statuses of `n` /predict requests for tiny-intent, each on its own connection. */
async function predictStatuses(port: number, n = 24): Promise<number[]> {
  return Promise.all(Array.from({ length: n }, (_, i) => post(port, '/predict', { inputs: `request ${i}`, model: 'tiny-intent' }).then((r) => r.status)));
}

describe('--model-control-mode explicit with --processes 2', () => {
  it('load and unload reach every process; the index is merged; a failure names the process; a restarted process gets the set', async () => {
    const server = await serveCli(['--processes', '2', '--gateway-threads', '1', '--models-dir', repo, '--model-control-mode', 'explicit']);
    try {
      const index = async () => (await post(server.port, '/v2/repository/index')).body as { name: string; state: string; reason: string }[];
      expect((await index()).map((e) => `${e.name}:${e.state}`)).toEqual(['broken:UNAVAILABLE', 'tiny-embed:READY', 'tiny-intent:UNAVAILABLE']);
      expect(await post(server.port, '/v2/repository/models/tiny-intent/load')).toEqual({ status: 200, body: {} });
      expect(await predictStatuses(server.port)).toEqual(Array(24).fill(200));
      expect((await index()).find((e) => e.name === 'tiny-intent')?.state).toBe('READY');

      const broken = await post(server.port, '/v2/repository/models/broken/load');
      expect(broken.status).toBe(400);
      expect(broken.body.error).toMatch(/^process 0: failed to load 'broken': .*; process 1: failed to load 'broken'/);

      // A process killed now comes back serving tiny-intent too.
      const pid = Number(/process 0 \(cpu\) started, pid (\d+)/.exec(server.stderr())?.[1]);
      expect(pid).toBeGreaterThan(0);
      process.kill(pid, 'SIGKILL');
      await eventually('process 0 ready again', async () => server.stderr(), (s) => /process 0 \(pid \d+\) ready again/.test(s), 60_000, (s) => s.slice(-800));
      expect(await predictStatuses(server.port)).toEqual(Array(24).fill(200));

      expect(await post(server.port, '/v2/repository/models/tiny-intent/unload')).toEqual({ status: 200, body: {} });
      expect(await predictStatuses(server.port)).toEqual(Array(24).fill(404));
      expect((await index()).find((e) => e.name === 'tiny-intent')).toMatchObject({ state: 'UNAVAILABLE', reason: 'unloaded' });
    } finally {
      server.kill('SIGTERM');
      await server.exited;
    }
  }, 180_000);
});
