/**
 * Model instances (--model-instances, src/gpu-worker/model-instances.ts):
 * which session runs a batch, and a real server whose instances share one
 * private output answering every row with the reference's value under
 * concurrent load, at start and for a model loaded while serving.
 */
import { availableParallelism } from 'node:os';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { autoModelInstances } from '../dist/src/gpu-worker/intra-op-threads.js';
import { AUTO_INSTANCES_MAX } from '../dist/src/shared/options.js';
import { HEAVY_QUEUE, LONE_MAX_TOKENS, ModelInstances, type Instance } from '../dist/src/gpu-worker/model-instances.js';
import type { BatchStats } from '../dist/src/gpu-worker/runner.js';
import { writePreset } from '../dist/models/generator/presets.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { expectCliRefuses } from './cli-process.js';
import { makeRandom, maxAbsDiff, randomTokenSequences, Reference, testServerConfig } from './helpers.js';

const TOLERANCE = 1e-5;

/** A fake session: each run waits until the test ends it; it records the batches it got. */
class FakeSession implements Instance {
  readonly got: number[][] = [];
  private readonly pending: { resolve: (s: BatchStats) => void; reject: (e: Error) => void }[] = [];
  released = 0;
  constructor(private readonly failRelease = false) {}
  run(slots: readonly number[]): Promise<BatchStats> {
    this.got.push([...slots]);
    return new Promise((resolve, reject) => this.pending.push({ resolve, reject }));
  }
  end(fail = false): void {
    const p = this.pending.shift()!;
    if (fail) p.reject(new Error('run failed'));
    else p.resolve({ rows: 1, realTokens: 1, paddedTokens: 1, runMs: 1 });
  }
  async release(): Promise<void> {
    this.released++;
    if (this.failRelease) throw new Error('release failed');
  }
}

const BUCKETS = [8, 16, 64, 128];
const model = { spec: { name: 'fake' }, slab: {}, options: { buckets: BUCKETS } } as unknown as ConstructorParameters<typeof ModelInstances>[0];
const turn = () => new Promise((r) => setImmediate(r));

describe('ModelInstances: which session runs a batch', () => {
  it('a small batch takes the lone path when it is free (and waits for it when not); anything else the least busy instance, the lowest among equals', async () => {
    const lone = new FakeSession();
    const [a, b] = [new FakeSession(), new FakeSession()];
    const pool = new ModelInstances(model, [a, b], lone);
    expect(pool.instances).toBe(2);
    expect(pool.takes(1, 1, 1)).toBe(true);
    const r1 = pool.run([1], 1); // 16 tokens, the lone path free: lone
    // The lone path busy: a small batch waits for it (the loop asks takes()), a large one does not.
    const bigRows = LONE_MAX_TOKENS / 64 + 1;
    expect(pool.takes(1, 1, 1)).toBe(false);
    expect(pool.takes(LONE_MAX_TOKENS / 16, 1, 1)).toBe(false);
    expect(pool.takes(bigRows, 2, 1)).toBe(true);
    const r2 = pool.run([2], 1); // the lone path is busy: an instance, the first
    const r3 = pool.run([3, 4], 1); // a is busy: b
    const r4 = pool.run([5], 1); // both run one: the lowest index
    expect([lone.got, a.got, b.got]).toEqual([[[1]], [[2], [5]], [[3, 4]]]);
    lone.end();
    a.end();
    a.end();
    b.end();
    await Promise.all([r1, r2, r3, r4]);
    expect(pool.takes(1, 1, 1)).toBe(true);
    // Idle again, but too many padded tokens for the lone path: an instance.
    const big = pool.run(Array.from({ length: bigRows }, (_, i) => 10 + i), 2);
    expect(b.got).toHaveLength(1);
    expect(a.got.at(-1)).toHaveLength(bigRows);
    a.end();
    await big;
    expect(lone.got).toHaveLength(1);
  });

  it('under a heavy load (HEAVY_QUEUE requests queued) every batch starts on an instance, small or not, the lone path free or not', async () => {
    const lone = new FakeSession();
    const [a, b] = [new FakeSession(), new FakeSession()];
    const pool = new ModelInstances(model, [a, b], lone);
    const light = HEAVY_QUEUE - 1;
    const r1 = pool.run([1], 1, light); // light: the free lone path
    expect(pool.takes(1, 1, light)).toBe(false); // light, the lone path busy: wait for it
    expect(pool.takes(1, 1, HEAVY_QUEUE)).toBe(true); // heavy: start now
    const r2 = pool.run([2], 1, HEAVY_QUEUE); // on an instance
    lone.end();
    await r1;
    const r3 = pool.run([3], 1, HEAVY_QUEUE); // the lone path is free, but the load heavy: an instance
    expect([lone.got, a.got, b.got]).toEqual([[[1]], [[2]], [[3]]]);
    a.end();
    b.end();
    await Promise.all([r2, r3]);
  });

  it('a failed run frees its instance, and without a lone path every batch goes to the instances', async () => {
    const [a, b] = [new FakeSession(), new FakeSession()];
    const pool = new ModelInstances(model, [a, b]);
    expect(pool.takes(1, 0, 1)).toBe(true);
    const failing = pool.run([1], 0);
    expect(pool.takes(1, 0, 1)).toBe(true); // no lone path to wait for
    a.end(true);
    await expect(failing).rejects.toThrow('run failed');
    const next = pool.run([2], 0); // a is free again: it is the lowest
    expect(a.got).toEqual([[1], [2]]);
    expect(b.got).toEqual([]);
    a.end();
    await next;
  });

  it('release frees every session, the lone one too, and reports a failure after trying all', async () => {
    const lone = new FakeSession();
    const a = new FakeSession(true);
    const b = new FakeSession();
    await expect(new ModelInstances(model, [a, b], lone).release()).rejects.toThrow('release failed');
    expect([lone.released, a.released, b.released]).toEqual([1, 1, 1]);
    expect(() => new ModelInstances(model, [])).toThrow(/at least one instance/);
    await turn();
  });
});

describe('how many instances by default', () => {
  it('on CPU one per core up to the cap for a narrow model with intra-op threads auto; one otherwise', () => {
    const cores = Math.min(AUTO_INSTANCES_MAX, availableParallelism());
    expect(autoModelInstances('cpu', 0, 128)).toBe(cores);
    expect(autoModelInstances('cpu', 0, 384)).toBe(1); // a wide model splits each run over the cores instead
    expect(autoModelInstances('cpu', 2, 128)).toBe(1); // intra-op threads set: the operator chose
    expect(autoModelInstances('cuda', 0, 128)).toBe(1);
  });
});

// ------------------------------------------------------------------ a real server

/** Seconds of CPU the server's session threads have used (slabserve_thread_cpu_seconds_total). */
async function sessionCpu(port: number): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith('slabserve_thread_cpu_seconds_total{thread="session"}'));
  return line ? Number(line.split(' ').at(-1)) : 0;
}

/** Sends every sequence at once (concurrency: waves of `wave`), returns each one's row. */
async function embedAll(port: number, model: string, seqs: { ids: Int32Array }[], wave = 48): Promise<number[][]> {
  const rows: number[][] = [];
  for (let at = 0; at < seqs.length; at += wave) {
    const part = seqs.slice(at, at + wave);
    const got = await Promise.all(
      part.map(async (s) => {
        const r = await fetch(`http://127.0.0.1:${port}/embed`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ inputs: [Array.from(s.ids)], model }),
        });
        expect(r.status).toBe(200);
        return ((await r.json()) as number[][])[0]!;
      }),
    );
    rows.push(...got);
  }
  return rows;
}

describe('a server with several instances of a model', () => {
  const repo = mkdtempSync(join(tmpdir(), 'slabserve-instances-'));
  writePreset('tiny-embed', repo);
  writePreset('tiny-embed', repo, { folder: 'later' });
  let server: Server | undefined;
  afterAll(async () => {
    await server?.close();
    rmSync(repo, { recursive: true, force: true });
  });

  it('answers every row of a concurrent load with the reference row, start-up and loaded models alike, on its session threads', { timeout: 120_000 }, async () => {
    const logs: string[] = [];
    server = await startServer(testServerConfig({ modelsDir: repo, models: ['tiny-embed'], modelControlMode: 'explicit', modelInstances: 3, log: (l) => logs.push(l) }));
    await server.ready;
    expect(logs.find((l) => l.startsWith('slabserve: model tiny-embed '))).toContain(' instances=3 ');
    const ref = await Reference.open('tiny-embed');
    try {
      const load = await fetch(`http://127.0.0.1:${server.port}/v2/repository/models/later/load`, { method: 'POST' });
      expect(load.status).toBe(200);
      for (const model of ['tiny-embed', 'later']) {
        const seqs = randomTokenSequences(makeRandom(`instances ${model}`), 240, 2, 40);
        const before = await sessionCpu(server.port);
        const rows = await embedAll(server.port, model, seqs);
        // The instances run on session threads: they did the work (the lone path alone would leave them idle).
        expect(await sessionCpu(server.port), model).toBeGreaterThan(before);
        let worst = 0;
        for (let i = 0; i < seqs.length; i++) worst = Math.max(worst, maxAbsDiff(rows[i]!, (await ref.row(seqs[i]!.ids)).subarray(0, 128)));
        expect(worst, model).toBeLessThan(TOLERANCE);
      }
      const unload = await fetch(`http://127.0.0.1:${server.port}/v2/repository/models/later/unload`, { method: 'POST' });
      expect(unload.status).toBe(200);
    } finally {
      await ref.close();
    }
  });

  it('refuses an instance count out of range, with the range: startServer, the flag and SLABSERVE_MODEL_INSTANCES', async () => {
    await expect(startServer(testServerConfig({ models: ['tiny-embed'], modelInstances: 65 }))).rejects.toThrow(/modelInstances must be an integer from 0 \(auto\) to 64, got 65/);
    expectCliRefuses(
      [
        [['--model-instances', '65'], {}],
        [['--model-instances', '-1'], {}],
        [[], { SLABSERVE_MODEL_INSTANCES: 'two' }],
      ],
      /--model-instances .*expected an integer from 0 to 64/,
    );
  });
});
