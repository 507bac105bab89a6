/**
 * A checkpoint's graph (build.ts checkpointGraph) from a build thread of its
 * own (build-thread.ts): hashing the weights takes seconds for a large file and
 * building the graph seconds more, which on the main thread would stall every
 * gateway RPC, repository call, metrics scrape and signal while a model loads.
 */
import { Worker } from 'node:worker_threads';
import type { BuildOptions, BuiltGraph } from './build.js';
import type { BuildThreadData, BuildThreadMessage } from './build-thread.js';
import type { EncoderHead } from './encoder-graph.js';

/**
 * checkpointGraph's answer, computed on a thread that ends once it has
 * answered: the graph, undefined where the folder has no checkpoint; rejects
 * with checkpointGraph's own error message. The log's lines come as it writes them.
 */
export function checkpointGraphOffThread(name: string, dir: string, head: EncoderHead, opts: BuildOptions): Promise<BuiltGraph | undefined> {
  const { log, ...rest } = opts;
  const workerData: BuildThreadData = { name, dir, head, opts: rest };
  const worker = new Worker(new URL('./build-thread.js', import.meta.url), { workerData, name: `slabserve-build-${name}` });
  return new Promise((resolve, reject) => {
    let answered = false;
    worker.on('message', (m: BuildThreadMessage) => {
      if (m.type === 'log') return log(m.line);
      answered = true;
      if (m.type === 'built') resolve(m.graph);
      else reject(new Error(m.message));
    });
    worker.once('error', (err) => {
      answered = true;
      reject(new Error(`the graph build thread of ${name} failed: ${err.message}`));
    });
    worker.once('exit', (code) => {
      if (!answered) reject(new Error(`the graph build thread of ${name} exited (code ${code}) before it answered`));
    });
  });
}
