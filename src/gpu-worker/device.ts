/**
 * Which device an inference thread runs on, and what we can learn about it.
 *
 *   cpu       onnxruntime's CPU provider
 *   cuda[:N]  the CUDA provider on GPU N (fails before any thread starts, saying
 *             what is missing, when the pre-flight fails: cudaMissing)
 *   auto      CUDA when the pre-flight passes and a session opens on it,
 *             otherwise CPU, said in one log line
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, totalmem } from 'node:os';
import { dirname, join } from 'node:path';

export type DeviceRequest = 'auto' | 'cpu' | 'cuda' | `cuda:${number}`;

export interface DeviceInfo {
  kind: 'cpu' | 'cuda';
  /** GPU ordinal (0 for cpu). */
  id: number;
  /** e.g. "cuda:0" or "cpu". */
  label: string;
  /** onnxruntime execution provider. */
  provider: 'CPUExecutionProvider' | 'CUDAExecutionProvider';
  /** Human-readable model of the processor or card. */
  name: string;
  memoryTotalBytes?: number;
  memoryUsedBytes?: number;
}

export function parseDevice(value: string): { kind: 'auto' | 'cpu' | 'cuda'; id: number } {
  const m = /^(auto|cpu|cuda)(?::(\d+))?$/.exec(value.trim());
  if (!m || (m[2] !== undefined && m[1] !== 'cuda')) {
    throw new Error(`invalid device "${value}": expected auto, cpu, cuda or cuda:N`);
  }
  return { kind: m[1] as 'auto' | 'cpu' | 'cuda', id: m[2] ? Number(m[2]) : 0 };
}

/** Folder holding onnxruntime-node's native binding, where the CUDA provider libraries must sit. */
export function ortBindingDir(): string {
  const require = createRequire(import.meta.url);
  const pkg = dirname(require.resolve('onnxruntime-node/package.json'));
  return join(pkg, 'bin', 'napi-v6', process.platform, process.arch);
}

/** What scripts/install-cuda-provider.mjs places beside the binding. */
export const CUDA_PROVIDER_FILES = ['libonnxruntime_providers_cuda.so', 'libonnxruntime_providers_shared.so'];

export function cudaProviderInstalled(dir = ortBindingDir(), exists: (path: string) => boolean = existsSync): boolean {
  return CUDA_PROVIDER_FILES.every((f) => exists(join(dir, f)));
}

/**
 * What libonnxruntime_providers_cuda.so (ONNX Runtime 1.29.0, CUDA 13) loads:
 * its DT_NEEDED entries (readelf -d) beyond glibc and libstdc++, and cuDNN 9,
 * which it dlopens when a session starts. cuFFT (libcufft.so.12) is dlopened
 * only by FFT operators, which BERT-class models do not have, so it is not required.
 */
export const CUDA_LIBRARIES: readonly { soname: string; from: string }[] = [
  { soname: 'libcuda.so.1', from: 'the NVIDIA driver' },
  { soname: 'libcudart.so.13', from: 'CUDA 13' },
  { soname: 'libcublas.so.13', from: 'CUDA 13' },
  { soname: 'libcublasLt.so.13', from: 'CUDA 13' },
  { soname: 'libcurand.so.10', from: 'CUDA 13' },
  { soname: 'libcudnn.so.9', from: 'cuDNN 9' },
];

/** The folders glibc's loader searches after LD_LIBRARY_PATH and its cache (x86-64, Debian/Ubuntu multiarch included). */
const LOADER_DEFAULT_DIRS = ['/lib/x86_64-linux-gnu', '/usr/lib/x86_64-linux-gnu', '/lib64', '/usr/lib64', '/lib', '/usr/lib'];

/** What the CUDA pre-flight looks at; tests pass their own. */
export interface CudaProbes {
  exists(path: string): boolean;
  /** Names in a folder; [] when it cannot be read. */
  listDir(dir: string): string[];
  /** A command's stdout, or undefined when it is not installed or fails. */
  run(command: string, args: string[]): string | undefined;
  /** LD_LIBRARY_PATH as this process was started with it (the loader read it then). */
  ldLibraryPath: string | undefined;
  /** Where the provider libraries must sit (ortBindingDir()). */
  providerDir: string;
}

export function systemProbes(): CudaProbes {
  return {
    exists: existsSync,
    listDir: (dir) => {
      try {
        return readdirSync(dir);
      } catch {
        return [];
      }
    },
    run: (command, args) => {
      try {
        return execFileSync(command, args, { encoding: 'utf8', timeout: 5000, stdio: ['ignore', 'pipe', 'ignore'] });
      } catch {
        return undefined;
      }
    },
    ldLibraryPath: process.env.LD_LIBRARY_PATH,
    providerDir: ortBindingDir(),
  };
}

/** Why CUDA cannot be used here, the first of: no GPU, no CUDA libraries, no provider. */
export interface CudaMissing {
  missing: 'gpu' | 'libraries' | 'provider';
  /** Short, for `auto`'s one log line. */
  reason: string;
  /** What to do about it. */
  remedy: string;
}

/** A GPU this process can see: a /dev/nvidiaN node, or one nvidia-smi lists. Undefined when there is one. */
export function missingGpu(p: CudaProbes): CudaMissing | undefined {
  if (p.listDir('/dev').some((f) => /^nvidia\d+$/.test(f))) return undefined;
  const listed = p.run('nvidia-smi', ['-L']);
  if (listed !== undefined && /^GPU \d+/m.test(listed)) return undefined;
  const smi = listed === undefined ? 'nvidia-smi is not on the PATH or failed' : 'nvidia-smi lists none';
  return {
    missing: 'gpu',
    reason: `no GPU is visible (no /dev/nvidia0, /dev/nvidia1, ... device node; ${smi})`,
    remedy: 'on a GPU machine install the NVIDIA driver (in a container, start it with the GPU: docker run --gpus all, the NVIDIA Container Toolkit); otherwise use --device cpu or auto',
  };
}

/** The sonames of `libraries` the dynamic loader would not find: LD_LIBRARY_PATH, then ld.so.cache (ldconfig -p), then the default folders. */
export function missingLibraries(p: CudaProbes, libraries: readonly string[] = CUDA_LIBRARIES.map((l) => l.soname)): string[] {
  const fromPath = (p.ldLibraryPath ?? '').split(':').filter((d) => d !== '');
  const cached = loaderCache(p);
  return libraries.filter((lib) => !cached.has(lib) && ![...fromPath, ...LOADER_DEFAULT_DIRS].some((d) => p.exists(join(d, lib))));
}

/** The sonames in the loader's cache for this architecture; empty where there is no ldconfig (musl). */
function loaderCache(p: CudaProbes): Set<string> {
  const out = ['ldconfig', '/sbin/ldconfig', '/usr/sbin/ldconfig'].map((c) => p.run(c, ['-p'])).find((o) => o !== undefined) ?? '';
  const names = new Set<string>();
  // "\tlibcudart.so.13 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.13"
  for (const m of out.matchAll(/^\s*(\S+) \(([^)]*)\) =>/gm)) if (process.arch !== 'x64' || m[2]!.includes('x86-64')) names.add(m[1]!);
  return names;
}

/**
 * The CUDA pre-flight, in this order: a visible GPU, the CUDA 13 / cuDNN 9
 * libraries on the loader path, the provider beside the binding. Undefined
 * when all pass; only then is a CUDA session worth trying (a failed one prints
 * onnxruntime's own errors). Reads a few folders and runs ldconfig: milliseconds.
 */
export function cudaMissing(p: CudaProbes = systemProbes()): CudaMissing | undefined {
  const gpu = missingGpu(p);
  if (gpu) return gpu;
  const libs = missingLibraries(p);
  if (libs.length > 0) {
    const named = libs.map((l) => `${l} (${CUDA_LIBRARIES.find((c) => c.soname === l)?.from ?? 'CUDA'})`).join(', ');
    const where = `LD_LIBRARY_PATH${p.ldLibraryPath ? ` (${p.ldLibraryPath})` : ' (unset)'}, the loader cache (ldconfig -p) and ${LOADER_DEFAULT_DIRS.join(', ')}`;
    return {
      missing: 'libraries',
      reason: `the CUDA libraries are not all on the loader path: ${named} not found in ${where}`,
      remedy: 'install the CUDA 13 runtime and cuDNN 9 (or use the nvidia/cuda:13 cudnn-runtime image), or add their folder to LD_LIBRARY_PATH',
    };
  }
  if (!cudaProviderInstalled(p.providerDir, p.exists)) {
    return { missing: 'provider', reason: `the CUDA provider libraries are not installed (${CUDA_PROVIDER_FILES[0]} in ${p.providerDir})`, remedy: 'run `npm run cuda:install`' };
  }
  return undefined;
}

/** The error for `--device cuda` when the pre-flight fails. */
export function cudaUnavailableMessage(m: CudaMissing): string {
  return `device cuda requested but ${m.reason}: ${m.remedy}`;
}

/**
 * An operator's mistake in --device, found before any thread starts: a form
 * we do not know, CUDA asked for where the pre-flight fails (no GPU, no CUDA
 * libraries, no provider: cudaMissing), or a GPU index this machine does not
 * have (where nvidia-smi can tell). `auto` never fails.
 */
export function checkDevice(request: string, probes: CudaProbes = systemProbes()): void {
  const want = parseDevice(request);
  if (want.kind !== 'cuda') return;
  const missing = cudaMissing(probes);
  if (missing) throw new Error(cudaUnavailableMessage(missing));
  const count = cudaDeviceCount(probes);
  if (count !== undefined && want.id >= count) {
    throw new Error(`device cuda:${want.id} requested but this machine has ${count} GPU${count === 1 ? '' : 's'} (nvidia-smi): --device cuda:0${count > 1 ? ` .. cuda:${count - 1}` : ''}`);
  }
}

/** GPUs nvidia-smi lists; undefined without nvidia-smi. */
function cudaDeviceCount(p: CudaProbes): number | undefined {
  const out = p.run('nvidia-smi', ['--query-gpu=index', '--format=csv,noheader']);
  return out === undefined ? undefined : out.split('\n').filter((l) => l.trim() !== '').length;
}

export function describeCpu(): DeviceInfo {
  return { kind: 'cpu', id: 0, label: 'cpu', provider: 'CPUExecutionProvider', name: `${cpus()[0]?.model ?? 'unknown CPU'} x${cpus().length}`, memoryTotalBytes: totalmem() };
}

/** One line for the start-up log: label, provider, name, memory. */
export function describeDevice(d: DeviceInfo): string {
  const gib = (b: number) => `${(b / 2 ** 30).toFixed(1)} GiB`;
  const memory =
    d.memoryTotalBytes === undefined
      ? 'memory unknown'
      : d.memoryUsedBytes === undefined
        ? `${gib(d.memoryTotalBytes)} memory`
        : `${gib(d.memoryUsedBytes)} of ${gib(d.memoryTotalBytes)} memory in use`;
  return `${d.label} (${d.provider}; ${d.name}; ${memory})`;
}

/** Name and memory of GPU `id` from nvidia-smi, when it is on the PATH. */
export function describeCuda(id: number): DeviceInfo {
  const info: DeviceInfo = { kind: 'cuda', id, label: `cuda:${id}`, provider: 'CUDAExecutionProvider', name: `CUDA device ${id}` };
  try {
    const line = execFileSync(
      'nvidia-smi',
      ['--query-gpu=name,memory.total,memory.used', '--format=csv,noheader,nounits', `-i`, String(id)],
      { encoding: 'utf8', timeout: 5000, stdio: ['ignore', 'pipe', 'ignore'] },
    ).trim();
    const [name, total, used] = line.split(',').map((s) => s.trim());
    if (name) info.name = name;
    if (total) info.memoryTotalBytes = Number(total) * 1024 * 1024;
    if (used) info.memoryUsedBytes = Number(used) * 1024 * 1024;
  } catch {
    // No nvidia-smi: name and memory stay unknown.
  }
  return info;
}
