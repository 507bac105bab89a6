/**
 * What loading a model while serving costs the models already served
 * (docs/model-repository.md has the method and the results): tiny-embed under a
 * closed loop, rounds alternating a quiet window with one during which a larger
 * model loads; then `--cycles` load/unload cycles and the RSS before and after.
 *
 *   node dist/bench/model-load.js [--rounds 3] [--clients 8] [--models minilm-l6,bert-base] [--cycles 50]
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { writePreset } from '../models/generator/presets.js';
import { parseOptions } from './args.js';
import { createLoadClient, type LoadClient } from './http-clients.js';
import { newHistogram } from './load.js';
import { getText, startServerProcess, type ServerProcess } from './server-process.js';
import { median } from './suite/phases.js';

const SPEC = {
  rounds: { type: 'int', min: 1, default: 3, help: 'quiet and loading windows, alternated, per model' },
  clients: { type: 'int', min: 1, default: 8, help: 'keep-alive clients posting /embed to tiny-embed' },
  models: { type: 'strings', default: ['minilm-l6', 'bert-base'], help: 'the models loaded while tiny-embed serves' },
  cycles: { type: 'int', min: 0, default: 50, help: 'load/unload cycles of minilm-l6 for the RSS check (0: none)' },
  'quiet-ms': { type: 'int', min: 100, default: 3000, help: 'length of each quiet window' },
} as const;

const CLI = fileURLToPath(new URL('../src/cli.js', import.meta.url));
const TEXT = Buffer.from(JSON.stringify({ inputs: 'where is my parcel, it was due yesterday', model: 'tiny-embed' }));

/** The closed loop: every request's latency (µs) into the window's histogram while `running`. */
function closedLoop(client: LoadClient, clients: number) {
  let hist = newHistogram();
  let errors = 0;
  let running = true;
  const loops = Array.from({ length: clients }, async () => {
    while (running) {
      const t0 = performance.now();
      const r = await client.post('/embed', TEXT).catch(() => ({ status: 0 }));
      if (r.status === 200) hist.recordValue(Math.max(1, Math.round((performance.now() - t0) * 1000)));
      else errors++;
    }
  });
  return {
    /** Ends the current window: its P50, P99 (ms), count and errors; starts the next one. */
    window: () => {
      const w = { p50: hist.getValueAtPercentile(50) / 1000, p99: hist.getValueAtPercentile(99) / 1000, n: hist.totalCount, errors };
      hist.destroy();
      hist = newHistogram();
      errors = 0;
      return w;
    },
    stop: async () => {
      running = false;
      await Promise.all(loops);
      hist.destroy();
    },
  };
}

function rssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : NaN;
}

async function repository(server: ServerProcess, op: 'load' | 'unload', model: string): Promise<number> {
  const t0 = performance.now();
  const r = await fetch(`${server.origin}/v2/repository/models/${model}/${op}`, { method: 'POST' });
  if (r.status !== 200) throw new Error(`${op} ${model}: ${r.status} ${await r.text()}`);
  return performance.now() - t0;
}

async function memoryOf(server: ServerProcess, model: string): Promise<number> {
  const m = new RegExp(`slabserve_model_memory_bytes\\{model="${model}"\\} (\\d+)`).exec(await getText(`${server.origin}/metrics`));
  return m ? Number(m[1]) : NaN;
}

const mib = (b: number) => (b / 2 ** 20).toFixed(0);

async function main(): Promise<void> {
  const o = parseOptions('node dist/bench/model-load.js [options]', SPEC);
  const dir = mkdtempSync(join(tmpdir(), 'slabserve-model-load-'));
  try {
    for (const m of ['tiny-embed', ...o.models]) writePreset(m, dir);
    const server = await startServerProcess({ cliPath: CLI, args: ['--host', '127.0.0.1', '--port', '0', '--device', 'cpu', '--models-dir', dir, '--model', 'tiny-embed', '--model-control-mode', 'explicit'] });
    const client = createLoadClient(server.origin, o.clients);
    const loop = closedLoop(client, o.clients);
    try {
      await new Promise((r) => setTimeout(r, 1000));
      loop.window(); // warm-up
      console.log(`tiny-embed under ${o.clients} keep-alive clients, ${o.rounds} rounds per model, this machine's CPU`);
      for (const model of o.models) {
        const quiet: { p50: number; p99: number }[] = [];
        const loading: { p50: number; p99: number }[] = [];
        const loadMs: number[] = [];
        let rssWith = 0;
        let rssWithout = 0;
        let footprint = 0;
        for (let round = 0; round < o.rounds; round++) {
          await new Promise((r) => setTimeout(r, o['quiet-ms']));
          quiet.push(loop.window());
          rssWithout = rssBytes(server.pid);
          loop.window();
          loadMs.push(await repository(server, 'load', model));
          loading.push(loop.window());
          rssWith = rssBytes(server.pid);
          footprint = await memoryOf(server, model);
          await repository(server, 'unload', model);
          loop.window();
        }
        const q50 = median(quiet.map((w) => w.p50));
        const q99 = median(quiet.map((w) => w.p99));
        const l50 = median(loading.map((w) => w.p50));
        const l99 = median(loading.map((w) => w.p99));
        console.log(
          `${model}: load ${(median(loadMs) / 1000).toFixed(2)} s (median of ${o.rounds}); tiny-embed P50 ${q50.toFixed(2)} -> ${l50.toFixed(2)} ms (x${(l50 / q50).toFixed(2)}), ` +
            `P99 ${q99.toFixed(2)} -> ${l99.toFixed(2)} ms (x${(l99 / q99).toFixed(2)}) during the load; footprint ${mib(footprint)} MiB measured, process RSS ${mib(rssWithout)} -> ${mib(rssWith)} MiB`,
        );
      }
      if (o.cycles > 0) {
        await repository(server, 'load', 'minilm-l6');
        await repository(server, 'unload', 'minilm-l6');
        const before = rssBytes(server.pid);
        for (let i = 0; i < o.cycles; i++) {
          await repository(server, 'load', 'minilm-l6');
          await repository(server, 'unload', 'minilm-l6');
        }
        const after = rssBytes(server.pid);
        console.log(`${o.cycles} load/unload cycles of minilm-l6 (after one first): RSS ${mib(before)} -> ${mib(after)} MiB (${(((after - before) / before) * 100).toFixed(1)}%)`);
      }
    } finally {
      await loop.stop();
      await client.close();
      await server.stop();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

void main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
