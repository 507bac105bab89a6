/**
 * The start-up check of the native binaries a process needs, made before any
 * model opens: onnxruntime's binding (every process that runs a model) and
 * uWebSockets.js's (a server's gateway threads; src/gateway/uws.ts chooses
 * the build). Without it a Node.js that has no binary for one of them would
 * open and warm every model, then fail in a thread.
 *
 * The binaries are loaded in a short-lived thread, so this thread (the main
 * one, which serves no socket and runs no model) keeps none of them loaded.
 * N-API addons (onnxruntime, koffi, msgpackr's extension) need no binary per
 * Node.js version; uWS does.
 */
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { Worker } from 'node:worker_threads';
import { candidateGlibc, chooseUws, thisRuntime, uwsCandidates, type UwsChoice } from '../gateway/uws.js';
import { SlabserveError } from '../shared/errors.js';

/** Code of the refusal (docs/errors.md). */
const CODE = 'SLABSERVE_NO_NATIVE_BINARY';

/** Loads the binaries of each group in order until one loads; answers each one's error (null: it loaded; absent: not tried). */
const LOADER = `
const { workerData, parentPort } = require('node:worker_threads');
parentPort.postMessage(workerData.map((group) => {
  const errors = [];
  for (const binary of group) {
    try { require(binary); errors.push(null); break; }
    catch (err) { errors.push(String(err && err.message).split('\\n')[0]); }
  }
  return errors;
}));`;

/** Each group's load errors, in a thread of its own (see the header). */
function loadInThread(groups: string[][]): Promise<(string | null)[][]> {
  return new Promise((resolve, reject) => {
    const worker = new Worker(LOADER, { eval: true, workerData: groups });
    worker.once('message', (answer: (string | null)[][]) => {
      resolve(answer);
      void worker.terminate();
    });
    worker.once('error', reject);
    worker.once('exit', (code) => reject(new Error(`the thread that loads the native binaries exited (${code}) before it answered`)));
  });
}

/** onnxruntime-node's binding for this platform, where its own loader looks (dist/binding.js). */
function onnxruntimeBinding(): string {
  const root = dirname(createRequire(import.meta.url).resolve('onnxruntime-node/package.json'));
  return join(root, 'bin', 'napi-v6', process.platform, process.arch, 'onnxruntime_binding.node');
}

/**
 * Refuses (SLABSERVE_NO_NATIVE_BINARY) where a binary this process needs does not load; with
 * `gateways`, answers the uWebSockets.js build the gateway threads are to load.
 */
export async function checkNativeBinaries(opts: { gateways: true }): Promise<UwsChoice>;
export async function checkNativeBinaries(opts: { gateways: false }): Promise<null>;
export async function checkNativeBinaries(opts: { gateways: boolean }): Promise<UwsChoice | null> {
  const runtime = thisRuntime();
  const ort = onnxruntimeBinding();
  const candidates = opts.gateways ? uwsCandidates(runtime) : [];
  const [ortErrors, uwsErrors] = await loadInThread([[ort], candidates.map((c) => c.binary)]);
  if (ortErrors![0] !== null) {
    throw new SlabserveError(
      `onnxruntime-node's binding does not load on Node.js ${runtime.node} (${runtime.platform}-${runtime.arch}): ${ortErrors![0]}. ` +
        'onnxruntime-node publishes binaries for linux (x64, arm64, glibc >= 2.28), macOS and Windows.',
      CODE,
      'unavailable',
    );
  }
  if (!opts.gateways) return null;
  const chosen = chooseUws(candidates, uwsErrors!, runtime, candidateGlibc);
  if ('refusal' in chosen) throw new SlabserveError(chosen.refusal, CODE, 'unavailable');
  return chosen.choice;
}
