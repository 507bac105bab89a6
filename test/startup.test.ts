/**
 * An operator's mistakes are reported before anything starts: a models
 * directory that is not there or holds no model, a device this machine
 * cannot give, a port something already listens on. The CLI exits non-zero
 * with a message that names the flag, before the inference thread starts
 * (no "slabserve: opening ..." line, printed as it is started) and so well
 * before warm-up.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { cudaProviderInstalled } from '../dist/src/gpu-worker/device.js';
import { pickFreePort } from '../dist/src/server.js';

const CLI = fileURLToPath(new URL('../dist/src/cli.js', import.meta.url));
const empty = mkdtempSync(join(tmpdir(), 'slabserve-empty-models-'));

afterAll(() => rmSync(empty, { recursive: true, force: true }));

function serve(args: string[]): { status: number | null; stderr: string; ms: number } {
  const started = performance.now();
  const r = spawnSync(process.execPath, [CLI, 'serve', '--host', '127.0.0.1', '--device', 'cpu', ...args], { encoding: 'utf8', timeout: 60_000 });
  const ms = Math.round(performance.now() - started);
  console.log(`serve ${args.join(' ')}: exit ${r.status} after ${ms} ms: ${r.stderr.trim().split('\n').pop()}`);
  return { status: r.status, stderr: r.stderr, ms };
}

/** The CLI stopped before it started the inference thread. */
function expectRefusedAtOnce(r: { status: number | null; stderr: string }, message: RegExp): void {
  expect(r.status).not.toBe(0);
  expect(r.status).not.toBeNull(); // exited by itself, not killed by the guard
  expect(r.stderr).toMatch(message);
  expect(r.stderr).not.toMatch(/slabserve: opening /);
  expect(r.stderr).not.toMatch(/listening on|ready at/);
}

describe('start-up checks, before the inference thread starts', () => {
  it('a --models-dir that does not exist, and one that holds no model folder', () => {
    const missing = join(empty, 'not-here');
    expectRefusedAtOnce(serve(['--port', '0', '--models-dir', missing]), new RegExp(`the models directory ${missing} does not exist \\(--models-dir\\)`));
    const none = serve(['--port', '0', '--models-dir', empty]);
    expectRefusedAtOnce(none, new RegExp(`the models directory ${empty} holds no model folder`));
    expect(none.stderr).not.toMatch(/npm run models/); // not the package's own models/: the generator is no answer
  });

  it('a --model folder that does not exist', () => {
    expectRefusedAtOnce(serve(['--port', '0', '--model', join(empty, 'bge-small')]), /model folder .*bge-small does not exist/);
  });

  it.skipIf(cudaProviderInstalled())('--device cuda where the CUDA provider is not installed', () => {
    expectRefusedAtOnce(serve(['--port', '0', '--device', 'cuda:0']), /device cuda requested but the CUDA provider libraries are not installed/);
  });

  it('a --device this server does not know', () => {
    expectRefusedAtOnce(serve(['--port', '0', '--device', 'tpu']), /invalid device "tpu"/);
  });

  it('the same start with every mistake mended does start (what the checks above look for is printed)', async () => {
    const port = await pickFreePort('127.0.0.1');
    const { spawn } = await import('node:child_process');
    const child = spawn(process.execPath, [CLI, 'serve', '--host', '127.0.0.1', '--device', 'cpu', '--port', String(port), '--model', 'tiny-embed'], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d));
    const guard = setTimeout(() => child.kill('SIGKILL'), 60_000);
    await new Promise<void>((resolve) => child.stderr!.on('data', () => /ready at/.test(stderr) && resolve()));
    child.kill('SIGTERM');
    await new Promise((r) => child.once('exit', r));
    clearTimeout(guard);
    expect(stderr).toMatch(/slabserve: opening tiny-embed on device cpu/);
    expect(stderr).toMatch(/listening on/);
  });

  it('a --port another program listens on: named, with the flag', async () => {
    const port = await pickFreePort('127.0.0.1');
    const other = createServer();
    await new Promise<void>((r) => other.listen(port, '127.0.0.1', r));
    try {
      expectRefusedAtOnce(serve(['--port', String(port)]), new RegExp(`127\\.0\\.0\\.1:${port} is in use .*choose another --port`));
    } finally {
      await new Promise((r) => other.close(r));
    }
  });
});
