/**
 * A model folder that holds a checkpoint and no ONNX graph: its graph built
 * from the weights (architectures.ts, encoder-graph.ts), once. The built graph
 * is kept in the graph cache under a key of the builder's version, the head,
 * config.json and the weights' hashes, so a restart opens it at once and a
 * changed checkpoint is built again.
 */
import { createHash } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, readSync, realpathSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { threadId } from 'node:worker_threads';
import { basename, dirname, join } from 'node:path';
import { planCheckpoint, type CheckpointConfig } from './architectures.js';
import { checkpointFile } from '../../shared/model-format/hf-folder.js';
import type { BuiltDtype } from '../../shared/model-format/model-config.js';
import { Checkpoint, checkpointParams, modernBertParams, weightFiles } from './checkpoint-params.js';
import { buildEncoderGraph, encoderModel, type EncoderHead } from './encoder-graph.js';
import { encodeModel, moveToExternalData, type onnx } from '../../shared/model-format/onnx-graph.js';
import { buildModernBertGraph } from './modernbert-graph.js';

/** Weights of more than 1 GiB are kept beside the graph, not in it: protobuf cannot encode a model of 2 GiB. */
export const EXTERNAL_DATA_ABOVE = 2 ** 30;
const EXTERNAL_DATA_FILE = 'model.onnx_data';

/** Bumped whenever a change makes a built graph differ, so the cache builds again. */
const BUILDER_VERSION = '2';

/** The graph cache's default: $XDG_CACHE_HOME/slabserve/graphs, or ~/.cache/slabserve/graphs. */
export function defaultGraphCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  return join(env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'slabserve', 'graphs');
}

export interface BuiltGraph {
  /** The graph file to serve. */
  path: string;
  /** What /info and the log say of where it came from. */
  source: string;
}

export interface BuildOptions {
  cacheDir: string;
  /** Weights above this many bytes go to model.onnx_data beside the graph (default EXTERNAL_DATA_ABOVE). */
  externalDataAbove?: number;
  /** What the graph computes in (its inputs and outputs are those of an fp32 export either way). */
  dtype: BuiltDtype;
  log: (line: string) => void;
}

/**
 * The graph of `dir`'s checkpoint with `head`, built or from the cache;
 * undefined where the folder has no checkpoint. Throws the reason a
 * checkpoint cannot make a graph (the file named, and the tensor or field).
 */
export function checkpointGraph(name: string, dir: string, head: EncoderHead, opts: BuildOptions): BuiltGraph | undefined {
  const file = checkpointFile(dir);
  if (!file) return undefined;
  const configBytes = readFileSync(join(dir, 'config.json'));
  const config = JSON.parse(configBytes.toString('utf8')) as CheckpointConfig;
  const plan = planCheckpoint(config, head);
  const key = createHash('sha256').update(`${BUILDER_VERSION}\n${head}\n${opts.dtype}\n`).update(configBytes);
  for (const shard of weightFiles(dir, file)) key.update(`\n${shard}\n${weightsHash(join(dir, shard))}`);
  const path = join(opts.cacheDir, key.digest('hex').slice(0, 32), 'model.onnx');
  const source = `built from ${file} (${plan.architecture})`;
  if (existsSync(path)) {
    opts.log(`slabserve: model ${name}: the graph built from ${file} before (${path})`);
    return { path, source };
  }
  const started = performance.now();
  const checkpoint = Checkpoint.open(dir, file);
  let model: onnx.IModelProto;
  try {
    const graph =
      plan.kind === 'modernbert'
        ? buildModernBertGraph(plan.architecture, plan.shape, modernBertParams(checkpoint, plan), opts.dtype)
        : buildEncoderGraph(plan.architecture, plan.shape, checkpointParams(checkpoint, plan), { fused: true, dtype: opts.dtype });
    model = encoderModel(graph, `${plan.architecture} built by slabserve from ${file}`, { slabserve_built_from: file, architecture: plan.architecture });
  } catch (err) {
    throw new Error(`${join(dir, file)}: ${(err as Error).message}`);
  } finally {
    checkpoint.close();
  }
  try {
    writeModel(path, model, opts.externalDataAbove ?? EXTERNAL_DATA_ABOVE);
  } catch (err) {
    throw new Error(`the graph cache ${opts.cacheDir} (--graph-cache-dir): ${(err as Error).message}`);
  }
  opts.log(`slabserve: model ${name}: built its graph from ${file} (${plan.architecture}, ${plan.shape.layers} layers) in ${((performance.now() - started) / 1000).toFixed(1)} s (${path})`);
  return { path, source };
}

/**
 * Writes `model` at `path`, its weights beside it in model.onnx_data where they are more than
 * `externalAbove` bytes (protobuf cannot encode 2 GiB). Each file is written under a temporary
 * name and renamed, the graph last: a graph in the cache is whole, and another process building
 * the same graph writes the same bytes.
 */
function writeModel(path: string, model: onnx.IModelProto, externalAbove: number): void {
  mkdirSync(dirname(path), { recursive: true });
  const tmp = (p: string) => `${p}.${process.pid}.${threadId}.tmp`; // two threads may build the same graph
  const data = join(dirname(path), EXTERNAL_DATA_FILE);
  const weightBytes = (model.graph?.initializer ?? []).reduce((n, t) => n + (t.rawData?.byteLength ?? 0), 0);
  try {
    if (weightBytes > externalAbove) {
      moveToExternalData(model, tmp(data), EXTERNAL_DATA_FILE);
      renameSync(tmp(data), data);
    }
    writeFileSync(tmp(path), encodeModel(model));
    renameSync(tmp(path), path);
  } catch (err) {
    for (const p of [tmp(data), tmp(path)]) rmSync(p, { force: true });
    throw err;
  }
}

/** A weights file's sha256: the Hugging Face cache's blob name where the file is one (its LFS sha256), else hashed here. */
function weightsHash(path: string): string {
  const real = realpathSync(path);
  if (basename(dirname(real)) === 'blobs' && /^[0-9a-f]{64}$/.test(basename(real))) return basename(real);
  const hash = createHash('sha256');
  const fd = openSync(real, 'r');
  try {
    const chunk = Buffer.alloc(8 * 2 ** 20);
    for (let n; (n = readSync(fd, chunk, 0, chunk.length, null)) > 0; ) hash.update(chunk.subarray(0, n));
  } finally {
    closeSync(fd);
  }
  return hash.digest('hex');
}
