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
import { HARDWARE } from './fixtures/skips.js';
import { checkDevice, cudaMissing, missingGpu, systemProbes, type CudaProbes } from '../dist/src/gpu-worker/device.js';
import { pickFreePort } from '../dist/src/main/server.js';
import { portOutsideEphemeral, serveCli } from './cli-process.js';

const CLI = fileURLToPath(new URL('../dist/src/cli.js', import.meta.url));
/** Whether this machine shows a GPU (then the no-GPU cases below do not apply). */
const gpuVisible = missingGpu(systemProbes()) === undefined;
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

  it('the model repository flags without --model-control-mode explicit, and --load-model beside --model', () => {
    expectRefusedAtOnce(serve(['--port', '0', '--load-model', 'tiny-embed']), /--load-model names the models loaded at start with --model-control-mode explicit; without it, use --model/);
    expectRefusedAtOnce(serve(['--port', '0', '--model-control-mode', 'explicit', '--model', 'tiny-embed', '--load-model', 'tiny-intent']), /--model and --load-model both name the models loaded at start: give one/);
    expectRefusedAtOnce(serve(['--port', '0', '--lazy-load', '--model-idle-unload-s', '5']), /--lazy-load, --model-idle-unload-s need --model-control-mode explicit/);
  });

  it('a bare [bool] flag (--truncate, --log-probes, --metrics-auth, --lazy-load) is read as true, not an error of its own', () => {
    const r = serve(['--port', '0', '--truncate', '--log-probes', '--metrics-auth', '--model', join(empty, 'absent')]);
    expectRefusedAtOnce(r, /model folder .*absent does not exist/);
    expect(r.stderr).not.toMatch(/trim|expected true or false/);
  });

  it('a --model folder that does not exist', () => {
    expectRefusedAtOnce(serve(['--port', '0', '--model', join(empty, 'bge-small')]), /model folder .*bge-small does not exist/);
  });

  it('--device cuda on this machine without a GPU: says so, and no onnxruntime dump', (ctx) => {
    if (gpuVisible) ctx.skip(`${HARDWARE} no GPU (one is visible here)`);
    const r = serve(['--port', '0', '--device', 'cuda:0']);
    expectRefusedAtOnce(r, /device cuda requested but no GPU is visible \(no \/dev\/nvidia0.*nvidia-smi.*\): .*--device cpu or auto/);
    expect(r.stderr).not.toMatch(/onnxruntime|SLABSERVE_START_FAILED/);
    expect(r.stderr).not.toMatch(/npm run cuda:install/); // installing the provider would not help
  });

  it('a --device this server does not know', () => {
    expectRefusedAtOnce(serve(['--port', '0', '--device', 'tpu']), /invalid device "tpu"/);
  });

  it('the same start with every mistake mended does start (what the checks above look for is printed)', async () => {
    const port = await portOutsideEphemeral();
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

/** A machine as the CUDA pre-flight sees it: device nodes, nvidia-smi's answer, ldconfig's cache, files on disk. */
function machine(o: { dev?: string[]; smi?: string; cache?: string[]; files?: string[]; ldLibraryPath?: string }): CudaProbes {
  const files = new Set(o.files ?? []);
  const cache = (o.cache ?? []).map((f) => `\t${f.split('/').pop()} (libc6,x86-64) => ${f}`).join('\n');
  return {
    exists: (path) => files.has(path),
    listDir: (dir) => (dir === '/dev' ? (o.dev ?? ['null', 'tty']) : []),
    run: (command, args) => {
      if (command.endsWith('ldconfig') && args[0] === '-p') return `${o.cache?.length ?? 0} libs found in cache \`/etc/ld.so.cache'\n${cache}\n`;
      if (command === 'nvidia-smi') return o.smi === undefined ? undefined : args[0] === '-L' ? o.smi : o.smi.split('\n').map((_, i) => String(i)).join('\n');
      return undefined;
    },
    ldLibraryPath: o.ldLibraryPath,
    providerDir: '/app/ort',
  };
}

const GPU = { dev: ['null', 'nvidia0', 'nvidiactl', 'nvidia-uvm'] };
const LIBS = {
  ldLibraryPath: '/opt/cuda/lib64:/opt/cudnn/lib',
  cache: ['/usr/lib/x86_64-linux-gnu/libcuda.so.1', '/usr/local/cuda/lib64/libcudart.so.13'],
  files: ['/opt/cuda/lib64/libcublas.so.13', '/opt/cuda/lib64/libcublasLt.so.13', '/usr/lib/x86_64-linux-gnu/libcurand.so.10', '/opt/cudnn/lib/libcudnn.so.9'],
};
const PROVIDER = ['/app/ort/libonnxruntime_providers_cuda.so', '/app/ort/libonnxruntime_providers_shared.so'];

describe('the CUDA pre-flight: a GPU, then the CUDA libraries, then the provider', () => {
  it('no GPU: names the device nodes and nvidia-smi, and says so before anything about libraries or the install', () => {
    const none = machine({ dev: ['null', 'nvidiactl'] });
    expect(cudaMissing(none)).toMatchObject({ missing: 'gpu', reason: expect.stringMatching(/no \/dev\/nvidia0, \/dev\/nvidia1, \.\.\. device node; nvidia-smi is not on the PATH or failed/) });
    expect(cudaMissing(machine({ smi: '' }))?.reason).toMatch(/nvidia-smi lists none/);
    expect(() => checkDevice('cuda', none)).toThrow(/^device cuda requested but no GPU is visible .*docker run --gpus all.*--device cpu or auto$/);
    expect(() => checkDevice('auto', none)).not.toThrow();
    // nvidia-smi listing one is enough where /dev shows no node (some container runtimes)
    expect(cudaMissing(machine({ smi: 'GPU 0: NVIDIA H200 (UUID: GPU-1)', ...LIBS, files: [...LIBS.files, ...PROVIDER] }))).toBeUndefined();
  });

  it('a GPU but not every library: names each missing one, where it was looked for, and not the install', () => {
    const cudnnless = machine({ ...GPU, ...LIBS, files: LIBS.files.filter((f) => !f.includes('cudnn')) });
    const m = cudaMissing(cudnnless)!;
    expect(m.missing).toBe('libraries');
    expect(m.reason).toMatch(/: libcudnn\.so\.9 \(cuDNN 9\) not found in LD_LIBRARY_PATH \(\/opt\/cuda\/lib64:\/opt\/cudnn\/lib\), the loader cache \(ldconfig -p\) and \/lib\/x86_64-linux-gnu/);
    expect(m.reason).not.toMatch(/libcublas|libcudart|libcuda\.so/);
    expect(() => checkDevice('cuda:0', cudnnless)).toThrow(/libcudnn\.so\.9 .*install the CUDA 13 runtime and cuDNN 9.*LD_LIBRARY_PATH$/);
    expect(() => checkDevice('cuda:0', cudnnless)).not.toThrow(/cuda:install/);
    // nothing on the loader path, no cache: all six, the driver's own named as such
    const bare = cudaMissing(machine({ ...GPU }))!;
    expect(bare.reason).toMatch(/libcuda\.so\.1 \(the NVIDIA driver\), libcudart\.so\.13 \(CUDA 13\), libcublas\.so\.13 \(CUDA 13\), libcublasLt\.so\.13 \(CUDA 13\), libcurand\.so\.10 \(CUDA 13\), libcudnn\.so\.9 \(cuDNN 9\) not found in LD_LIBRARY_PATH \(unset\)/);
  });

  it('everything but the provider: only then suggests npm run cuda:install; with it, the GPU index is checked', () => {
    const m = cudaMissing(machine({ ...GPU, ...LIBS }))!;
    expect(m).toMatchObject({ missing: 'provider', remedy: 'run `npm run cuda:install`' });
    expect(() => checkDevice('cuda', machine({ ...GPU, ...LIBS }))).toThrow(/the CUDA provider libraries are not installed \(libonnxruntime_providers_cuda\.so in \/app\/ort\): run `npm run cuda:install`/);
    const ready = machine({ ...GPU, ...LIBS, files: [...LIBS.files, ...PROVIDER], smi: 'GPU 0: NVIDIA H200 (UUID: GPU-1)' });
    expect(cudaMissing(ready)).toBeUndefined();
    expect(() => checkDevice('cuda:0', ready)).not.toThrow();
    expect(() => checkDevice('cuda:1', ready)).toThrow(/cuda:1 requested but this machine has 1 GPU \(nvidia-smi\)/);
  });

  it('--device auto on this machine: one quiet line naming the reason, no onnxruntime error, served on the CPU', async (ctx) => {
    if (gpuVisible) ctx.skip(`${HARDWARE} no GPU (one is visible here)`);
    const server = await serveCli(['--device', 'auto']);
    server.kill('SIGTERM');
    await server.exited;
    const lines = server.stderr().split('\n').filter((l) => /auto:/.test(l));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/"level":"info".*auto: no GPU is visible \(.*\), using CPU/);
    expect(server.stderr()).not.toMatch(/\[[EW]:onnxruntime|Failed to load shared library|"level":"(warn|error)"/);
    expect(server.stderr()).toMatch(/device cpu \(CPUExecutionProvider/);
  });
});

describe('npm run cuda:install on this machine without a GPU', () => {
  it('says what is missing and refuses before fetching anything, unless --force', (ctx) => {
    if (gpuVisible) ctx.skip(`${HARDWARE} no GPU (one is visible here)`);
    const script = fileURLToPath(new URL('../scripts/install-cuda-provider.mjs', import.meta.url));
    // --from a file that is not there: were the refusal to fail, this fails fast instead of downloading 180 MB
    const r = spawnSync(process.execPath, [script, '--from', join(empty, 'provider.tgz')], { encoding: 'utf8', timeout: 30_000 });
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/^cuda:install: no GPU is visible \(no \/dev\/nvidia0.*nvidia-smi/m);
    expect(r.stderr).toMatch(/nothing is fetched; `--device auto` serves on the CPU without it/);
    expect(r.stderr).toMatch(/pass --force to install it anyway/);
    expect(r.stderr + r.stdout).not.toMatch(/no such file|fetching|placed/);
  });
});
