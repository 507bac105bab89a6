/**
 * Which device an inference thread runs on, and what we can learn about it.
 *
 *   cpu       onnxruntime's CPU provider
 *   cuda[:N]  the CUDA provider on GPU N (fails clearly if the provider files
 *             are missing: see `npm run cuda:install`)
 *   auto      CUDA when its provider files are present and a session opens on
 *             it, otherwise CPU, said in one log line
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
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

export function cudaProviderInstalled(): boolean {
  const dir = ortBindingDir();
  return existsSync(join(dir, 'libonnxruntime_providers_cuda.so')) && existsSync(join(dir, 'libonnxruntime_providers_shared.so'));
}

/**
 * An operator's mistake in --device, found before any thread starts: a form
 * we do not know, CUDA asked for without its provider libraries, or a GPU
 * index this machine does not have (where nvidia-smi can tell). `auto` never fails.
 */
export function checkDevice(request: string): void {
  const want = parseDevice(request);
  if (want.kind !== 'cuda') return;
  if (!cudaProviderInstalled()) throw new Error(CUDA_NOT_INSTALLED);
  const count = cudaDeviceCount();
  if (count !== undefined && want.id >= count) {
    throw new Error(`device cuda:${want.id} requested but this machine has ${count} GPU${count === 1 ? '' : 's'} (nvidia-smi): --device cuda:0${count > 1 ? ` .. cuda:${count - 1}` : ''}`);
  }
}

export const CUDA_NOT_INSTALLED = 'device cuda requested but the CUDA provider libraries are not installed: run `npm run cuda:install`';

/** GPUs nvidia-smi lists; undefined without nvidia-smi. */
function cudaDeviceCount(): number | undefined {
  try {
    const out = execFileSync('nvidia-smi', ['--query-gpu=index', '--format=csv,noheader'], { encoding: 'utf8', timeout: 5000, stdio: ['ignore', 'pipe', 'ignore'] });
    return out.split('\n').filter((l) => l.trim() !== '').length;
  } catch {
    return undefined;
  }
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
