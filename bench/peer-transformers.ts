/**
 * The suite's peer (bench/peer-transformers.md): the same model behind a
 * node:http server on a transformers.js feature-extraction pipeline, as a
 * Node.js user would write it without slabserve: every request runs on its
 * own, nothing batches requests together. It speaks slabserve's `POST /embed`,
 * so one load generator drives both, and prints one line on stdout,
 * `listening on http://HOST:PORT`, once the pipeline is warm.
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { env, pipeline, type FeatureExtractionPipeline, type Tensor } from '@huggingface/transformers';
import { loadModelSpec, type Pooling } from '../src/shared/model-format/model-config.js';
import { fail, parseOptions } from './args.js';

/** Longest JSON body accepted, bytes. */
const MAX_BODY_BYTES = 4 * 1024 * 1024;

class BadRequest extends Error {}

/** The folder layout transformers.js expects, as symlinks to the slabserve model folder. Returns [root, id]. */
function peerModelView(spec: { name: string; dir: string; onnxPath: string; maxLength: number }): { root: string; id: string } {
  const safe = spec.name.replace(/[^A-Za-z0-9._-]/g, '_');
  const root = mkdtempSync(join(tmpdir(), `slabserve-peer-${safe}-`));
  const id = /^[A-Za-z0-9][A-Za-z0-9_-]*$/.test(spec.name) && !spec.name.includes('--') ? spec.name : 'model';
  const dir = join(root, id);
  mkdirSync(join(dir, 'onnx'), { recursive: true });
  const src = resolve(spec.dir);
  for (const f of ['config.json', 'tokenizer.json', 'special_tokens_map.json']) {
    if (existsSync(join(src, f))) symlinkSync(join(src, f), join(dir, f));
  }
  // tokenizer_config.json is a copy, not a link: its model_max_length is where the
  // pipeline truncates (without one it never does), set to slabserve's longest input
  const tokConfigPath = join(src, 'tokenizer_config.json');
  const tokConfig = existsSync(tokConfigPath) ? (JSON.parse(readFileSync(tokConfigPath, 'utf8')) as Record<string, unknown>) : {};
  writeFileSync(join(dir, 'tokenizer_config.json'), `${JSON.stringify({ ...tokConfig, model_max_length: spec.maxLength }, null, 2)}\n`);
  const onnx = resolve(spec.onnxPath);
  symlinkSync(onnx, join(dir, 'onnx', 'model.onnx'));
  if (existsSync(`${onnx}_data`)) symlinkSync(`${onnx}_data`, join(dir, 'onnx', 'model.onnx_data'));
  return { root, id };
}

function ortVersion(): string {
  const versions = (env.backends.onnx as { versions?: Record<string, string> } | undefined)?.versions;
  return versions?.node ?? versions?.common ?? 'unknown';
}

function readBody(req: http.IncomingMessage, limit: number): Promise<Buffer> {
  return new Promise((resolveBody, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.byteLength;
      if (size > limit) {
        reject(new BadRequest(`body larger than ${limit} bytes`));
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => resolveBody(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

function parseEmbedBody(raw: Buffer): string[] {
  let body: unknown;
  try {
    body = JSON.parse(raw.toString('utf8'));
  } catch {
    throw new BadRequest('body is not valid JSON');
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new BadRequest('body must be a JSON object');
  const { inputs } = body as { inputs?: unknown };
  if (typeof inputs === 'string') return [inputs];
  if (Array.isArray(inputs) && inputs.length > 0 && inputs.every((x): x is string => typeof x === 'string')) return inputs;
  throw new BadRequest('"inputs" must be a string or a non-empty array of strings');
}

/** [B, H] tensor -> B plain arrays. */
function rows(t: Tensor): number[][] {
  const [b, h] = t.dims as [number, number];
  const data = t.data as Float32Array;
  const out: number[][] = new Array(b);
  for (let i = 0; i < b; i++) out[i] = Array.from(data.subarray(i * h, (i + 1) * h));
  return out;
}

function send(res: http.ServerResponse, status: number, body: string): void {
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

/**
 * Loads the pipeline, listens, logs the versions loaded on stderr and prints the
 * `listening on` line on stdout. Returns close(): stops accepting connections, lets
 * in-flight requests finish, releases the pipeline and the temp folder.
 */
async function servePeer(modelDir: string, host: string, port: number): Promise<() => Promise<void>> {
  const spec = loadModelSpec(resolve(modelDir));
  if (spec.task !== 'embed') throw new Error(`model ${spec.name} is a ${spec.task} model; the peer serves embedding models only`);
  const { pooling, normalize } = spec;
  if (pooling !== 'mean' && pooling !== 'cls') throw new Error(`peer-transformers: pooling ${pooling} is not one transformers.js computes as sentence-transformers does (mean or cls)`);

  const view = peerModelView(spec);
  const removeView = () => {
    rmSync(view.root, { recursive: true, force: true });
    process.off('exit', removeView);
  };
  process.on('exit', removeView); // however the process ends (process.exit in a signal handler included)
  let extractor: FeatureExtractionPipeline;
  try {
    env.allowRemoteModels = false;
    env.allowLocalModels = true;
    env.localModelPath = view.root;
    env.useFSCache = false; // local files only: nothing to cache
    extractor = await pipeline('feature-extraction', view.id, {
      device: 'cpu',
      dtype: 'fp32',
      local_files_only: true,
    });
    await extractor('warm up', { pooling, normalize });
  } catch (err) {
    removeView();
    throw err;
  }

  const server = http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?', 1)[0];
    if (path !== '/embed') return send(res, 404, JSON.stringify({ error: `no route ${req.method} ${path}` }));
    if (req.method !== 'POST') return send(res, 405, JSON.stringify({ error: 'POST only' }));
    void (async () => {
      try {
        const inputs = parseEmbedBody(await readBody(req, MAX_BODY_BYTES));
        const out = await extractor(inputs, { pooling, normalize });
        send(res, 200, JSON.stringify(rows(out)));
      } catch (err) {
        if (res.headersSent || res.destroyed) return;
        if (err instanceof BadRequest) send(res, 400, JSON.stringify({ error: err.message, error_type: 'Validation' }));
        else send(res, 500, JSON.stringify({ error: (err as Error).message }));
      }
    })();
  });
  server.keepAliveTimeout = 65_000;

  await new Promise<void>((ok, fail) => {
    server.once('error', fail);
    server.listen(port, host, () => {
      server.off('error', fail);
      ok();
    });
  });
  process.stderr.write(
    `peer-transformers: model ${basename(resolve(modelDir))}, pooling ${pooling}, normalize ${normalize}; ` +
      `transformers.js ${env.version}, onnxruntime-node ${ortVersion()}\n`,
  );
  const url = `http://${host.includes(':') ? `[${host}]` : host}:${(server.address() as AddressInfo).port}`;
  process.stdout.write(`listening on ${url}\n`);
  return async () => {
    await new Promise<void>((ok) => {
      server.close(() => ok());
      server.closeIdleConnections();
    });
    await extractor.dispose();
    removeView();
  };
}

// ---------------------------------------------------------------- command line

const PEER_OPTIONS = {
  'model-dir': { type: 'string', value: 'DIR', help: 'slabserve model folder (config.json, tokenizer.json, model.onnx, serve.json); required' },
  host: { type: 'string', value: 'H', default: '127.0.0.1', help: 'address to listen on' },
  port: { type: 'int', min: 0, default: 0, help: '0: any free port' },
} as const;
const USAGE = `node dist/bench/peer-transformers.js --model-dir DIR [options]
  Prints "listening on http://HOST:PORT" on stdout when ready; logs on stderr.`;

async function main(): Promise<void> {
  const a = parseOptions(USAGE, PEER_OPTIONS);
  if (!a['model-dir']) fail('--model-dir is required (--help lists the options)');
  if (a.port > 65535) fail(`--port: expected a port number, got ${a.port}`);

  // a parent that went away must not turn a log line into an EPIPE crash during shutdown
  process.stdout.on('error', () => {});
  process.stderr.on('error', () => {});
  // signals from the start, so one during start-up still exits cleanly (the temp view goes on 'exit')
  let close: (() => Promise<void>) | null = null;
  let stopping = false;
  const stop = (signal: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    process.stderr.write(`peer-transformers: ${signal}, closing\n`);
    if (!close) process.exit(0);
    const force = setTimeout(() => process.exit(1), 10_000);
    force.unref();
    close().then(
      () => process.exit(0),
      (err: unknown) => {
        process.stderr.write(`peer-transformers: close failed: ${(err as Error).message}\n`);
        process.exit(1);
      },
    );
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);

  close = await servePeer(a['model-dir'], a.host, a.port);
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().catch((err: unknown) => {
    process.stderr.write(`peer-transformers: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  });
}
