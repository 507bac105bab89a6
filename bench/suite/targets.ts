/**
 * The servers the suite measures, each a child process started as users start
 * it, and the correctness checks run on them before any timing.
 */
import type { PreparedModel } from '../../src/gpu-worker/graph.js';
import type { LoadTarget } from '../load.js';
import { openRawSession, rawBatches } from '../raw-ort.js';
import { procCpuMs, startChildServer, startServerProcess, type ServerProcess } from '../server-process.js';
import type { Workload } from '../workloads.js';
import { embedOnce } from '../ws-load.js';
import { CLI, PEER } from './paths.js';
import { maxAbsDiff } from './phases.js';

/** A server under load, as the cases and the report name it. */
export interface Target extends LoadTarget {
  label: string;
  /** slabserve's flags under test (beyond the common ones). */
  serverArgs?: string[];
  stop(): Promise<unknown>;
}

/** `slabserve serve` with the common flags (loopback, a free port, the model, the device) and `extra`, nothing else. */
export async function startSlabserve(label: string, device: string, modelsDir: string, model: string, extra: string[], env?: Record<string, string>): Promise<Target & { server: ServerProcess }> {
  const args = ['--host', '127.0.0.1', '--port', '0', '--models-dir', modelsDir, '--model', model, '--device', device, ...extra];
  const server = await startServerProcess({ cliPath: CLI, args, startTimeoutMs: 180_000, ...(env ? { env } : {}) });
  return {
    label,
    serverArgs: extra,
    server,
    origin: server.origin,
    cpuMs: () => server.cpuMs(),
    counters: (m) => server.counters(m),
    stop: () => server.stop(),
  };
}

/** The transformers.js peer (bench/peer-transformers.ts) as a child process; ready when it prints its address on stdout. */
export async function startPeer(modelDir: string): Promise<Target> {
  const child = await startChildServer({
    args: [PEER, '--model-dir', modelDir, '--port', '0', '--host', '127.0.0.1'],
    stream: 'stdout',
    ready: (line) => /listening on (http:\/\/\S+)/.exec(line)?.[1]!.replace(/\/$/, '') ?? null,
    startTimeoutMs: 120_000,
    what: 'transformers.js peer',
  });
  return { label: 'transformers.js', origin: child.origin, cpuMs: () => procCpuMs(child.pid), stop: () => child.stop() };
}

export async function postEmbed(origin: string, texts: string[]): Promise<number[][]> {
  const res = await fetch(`${origin}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: texts }) });
  if (res.status !== 200) throw new Error(`POST ${origin}/embed: ${res.status} ${await res.text()}`);
  return (await res.json()) as number[][];
}

/**
 * Largest difference between the vectors `embed` gives (a server's POST /embed, an engine's
 * embed()) and raw onnxruntime's for a few inputs of the workload, each run alone.
 */
export async function checkAgainstRaw(embed: (texts: string[]) => Promise<ArrayLike<number>[]>, w: Workload, prepared: PreparedModel, n = 6): Promise<number> {
  const session = await openRawSession(prepared, 'cpu', 1);
  try {
    const picks = w.requests.slice(0, n).map((r) => r[0]!);
    const rows = await embed(picks.map((x) => x.text));
    let worst = 0;
    for (let i = 0; i < picks.length; i++) {
      const [batch] = rawBatches([picks[i]!], [picks[i]!.ids.length], 1, prepared, () => 0);
      const out = await session.run(batch!.feeds);
      const ref = out[prepared.outputs[0]!.name]!.data as Float32Array;
      worst = Math.max(worst, maxAbsDiff(rows[i]!, ref));
    }
    return worst;
  } finally {
    await session.release();
  }
}

/** Largest difference between a server's f32 rows over /ws and its POST /embed vectors, for a few inputs of the workload. */
export async function checkWsAgainstHttp(origin: string, w: Workload, n = 4): Promise<number> {
  const texts = w.requests.slice(0, n).map((r) => r[0]!.text);
  const want = await postEmbed(origin, texts);
  let worst = 0;
  for (const [i, text] of texts.entries()) {
    const got = await embedOnce(origin, text);
    if (got.length !== want[i]!.length) throw new Error(`/ws answered ${got.length} dimensions, POST /embed ${want[i]!.length}`);
    worst = Math.max(worst, maxAbsDiff(got, want[i]!));
  }
  return worst;
}

/** Largest difference between two servers' vectors for the same texts. */
export async function largestVectorDiff(originA: string, originB: string, texts: string[]): Promise<number> {
  const [av, bv] = await Promise.all([postEmbed(originA, texts), postEmbed(originB, texts)]);
  return Math.max(...av.map((row, i) => maxAbsDiff(row, bv[i]!)));
}
