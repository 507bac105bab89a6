/**
 * Entry point of a build thread: one checkpoint's graph (build.ts
 * checkpointGraph: its weights hashed, the graph found in the cache or built
 * and written there), off the main thread, which keeps answering the gateways,
 * the repository and signals meanwhile (off-thread.ts starts it). The thread
 * ends once it has answered.
 *
 * Messages to the parent: { type: 'log', line } for each line the build logs,
 * then { type: 'built', graph } (undefined: no checkpoint) or { type: 'failed', message }.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { nameThread } from '../../shared/threads.js';
import { checkpointGraph, type BuildOptions, type BuiltGraph } from './build.js';
import type { EncoderHead } from './encoder-graph.js';

export interface BuildThreadData {
  name: string;
  dir: string;
  head: EncoderHead;
  /** Every build option but the log, which cannot cross threads: its lines come back as messages. */
  opts: Omit<BuildOptions, 'log'>;
}

export type BuildThreadMessage = { type: 'log'; line: string } | { type: 'built'; graph: BuiltGraph | undefined } | { type: 'failed'; message: string };

const port = parentPort!;
const post = (m: BuildThreadMessage) => port.postMessage(m);
const { name, dir, head, opts } = workerData as BuildThreadData;
nameThread('slabserve-build');
try {
  const graph = checkpointGraph(name, dir, head, { ...opts, log: (line) => post({ type: 'log', line }) });
  post({ type: 'built', graph });
} catch (err) {
  post({ type: 'failed', message: err instanceof Error ? err.message : String(err) });
}
