/**
 * The floor: the least an embedding server must do per request, and nothing
 * else. One uWebSockets.js app on one thread, no batching, no model run, no
 * slots, no metrics, no logs: read the body, parse it, tokenize the text (or
 * check the token ids) with slabserve's own tokenizer, and answer one
 * 128-float row serialised exactly as slabserve's gateway serialises rows,
 * reading and writing bodies as it does (no copy of a one-chunk body, the row
 * written from the serialiser's scratch buffer). The suite's floor case
 * (bench/suite/floor.ts) runs it beside `slabserve serve`: whatever
 * slabserve's gateway thread spends beyond this is the price of its path
 * around the batcher.
 *
 *   POST /embed  {"inputs": "text" | [ids]}  -> [[row]]      (JSON)
 *   /ws          msgpack {id, op: "embed", inputs, encoding?: "f32"} -> {id, result: [row]}
 *
 * node dist/bench/floor-server.js --models-dir models --model tiny-embed [--port 0]
 * prints "floor: listening on http://127.0.0.1:PORT" once it listens.
 */
import { parseOptions } from './args.js';
import { pack, unpack } from 'msgpackr';
import { loadTokenizer } from '../src/core/tokenizer/tokenizer.js';
import { loadUws, type us_listen_socket } from '../src/gateway/uws.js';
import { loadModelSpec } from '../src/shared/model-format/model-config.js';
import { mulberry32 } from '../models/generator/rng.js';
import { join } from 'node:path';
import { float32RowsJsonView } from '../src/gateway/http/float-json.js';

const values = parseOptions('node dist/bench/floor-server.js [options]', {
  'models-dir': { type: 'string', value: 'DIR', default: 'models', help: 'where the model folder is' },
  model: { type: 'string', value: 'NAME', default: 'tiny-embed', help: 'model folder under --models-dir' },
  port: { type: 'int', min: 0, default: 0, help: '0: any free port' },
});
const spec = loadModelSpec(join(values['models-dir'], values.model));
const tokenizer = await loadTokenizer(spec.tokenizerPath);
const encodeOpts = { maxLength: spec.maxLength, truncate: false };

// Unit-length rows of the model's width, what the model would have computed, answered in turn: a
// different row each time, as a server's rows are (one row over and over lets the CPU learn the
// serialiser's branches: ~40 ns a float instead of ~60).
const r = mulberry32(7);
const ROWS = Array.from({ length: 256 }, () => {
  const row = new Float32Array(spec.hiddenSize).map(() => r() - 0.5);
  const norm = Math.hypot(...row);
  for (let i = 0; i < row.length; i++) row[i]! /= norm;
  return row;
});
let next = 0;
const nextRow = () => ROWS[next++ & 255]!;

/** Tokenizes a text, or checks and copies token ids: the ids the device would get. */
function encode(inputs: unknown): Int32Array {
  if (typeof inputs === 'string') return tokenizer.encode(inputs, encodeOpts).ids;
  if (!Array.isArray(inputs) || inputs.length === 0 || inputs.length > spec.maxLength) throw new Error('inputs must be a text or a list of token ids');
  const ids = new Int32Array(inputs.length);
  for (let i = 0; i < inputs.length; i++) {
    const id = inputs[i] as unknown;
    if (typeof id !== 'number' || !Number.isInteger(id) || id < 0 || id >= tokenizer.vocabSize) throw new Error(`bad token id at ${i}`);
    ids[i] = id;
  }
  return ids;
}

const uws = loadUws();
const app = uws.App();
app.post('/embed', (res, req) => {
  const contentType = req.getHeader('content-type');
  let aborted = false;
  res.onAborted(() => (aborted = true));
  let chunks: Buffer[] | null = null;
  res.onData((chunk, isLast) => {
    // As the gateway reads a body (RequestContext.readPayload): a body in one chunk is parsed where
    // uWS holds it, before it reuses the memory; only a body in several chunks is copied.
    if (!isLast || chunks !== null) {
      (chunks ??= []).push(Buffer.from(chunk.slice(0)));
      if (!isLast) return;
    }
    let status = '200 OK';
    let body: string | Uint8Array;
    try {
      if (contentType !== 'application/json') throw new Error('send JSON');
      const bytes = chunks === null ? Buffer.from(chunk) : Buffer.concat(chunks);
      const msg = JSON.parse(bytes.toString('utf8')) as { inputs?: unknown };
      encode(msg.inputs);
      // A view of the serialiser's scratch buffer, written out by end() at once: what the gateway sends.
      body = float32RowsJsonView([nextRow()]);
    } catch (err) {
      status = '422 Unprocessable Entity';
      body = JSON.stringify({ error: (err as Error).message });
    }
    if (aborted) return;
    res.cork(() => res.writeStatus(status).writeHeader('content-type', 'application/json').end(body));
  });
});
app.ws('/ws', {
  maxPayloadLength: 4 * 1024 * 1024,
  message: (ws, message) => {
    const msg = unpack(new Uint8Array(message)) as { id?: unknown; op?: unknown; inputs?: unknown; encoding?: unknown; credit?: unknown };
    if (msg.op === 'hello') {
      ws.send(pack({ op: 'hello', credit: msg.credit }), true);
      return;
    }
    try {
      encode(msg.inputs);
      const row = nextRow();
      ws.send(pack({ id: msg.id, result: [msg.encoding === 'f32' ? new Uint8Array(row.buffer) : Array.from(row)] }), true);
    } catch (err) {
      ws.send(pack({ id: msg.id, error: { type: 'validation', code: 'FLOOR_BAD_INPUT', message: (err as Error).message } }), true);
    }
  },
});
let listenSocket: us_listen_socket | null = null;
app.listen('127.0.0.1', values.port, (socket) => {
  if (!socket) {
    console.error(`floor: cannot listen on port ${values.port}`);
    process.exit(1);
  }
  listenSocket = socket;
  console.log(`floor: listening on http://127.0.0.1:${uws.us_socket_local_port(socket)}`);
});
process.on('SIGTERM', () => {
  if (listenSocket) uws.us_listen_socket_close(listenSocket);
  (app as typeof app & { close(): void }).close();
});
