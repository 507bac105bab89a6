/**
 * What the outputs beyond the pooled row cost, in one server, in
 * alternating rounds, medians reported:
 *
 *   routes         req/s, P99 and answer bytes per input of each output against
 *                  the pooled row of the same model, under wrk (distinct short
 *                  texts, about 12 tokens): BGE-M3's sparse, colbert and all
 *                  three from one pass against its dense row; the token states
 *                  (/embed_all) against /embed; SPLADE's /embed_sparse against
 *                  its vocabulary-wide /embed row; a ColBERT model's query and
 *                  document vectors
 *   late chunking  a 512-token text cut into 8 chunks at word boundaries: one
 *                  /embed with `chunks` (the text runs once) against one /embed
 *                  of the 8 chunk texts; the latency of one request on an idle
 *                  server, chunk rows/s under 8 closed-loop clients, and the
 *                  cosine between each chunk's two rows
 *
 * The generated models have random weights: the cosines say how much the
 * context moves a chunk's row on such a model, not on a trained one. The
 * load generators share the server's 2 cores: the figures are ratios.
 *
 *   node dist/bench/outputs.js [--rounds 3] [--seconds 4] [--connections 32]
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadTokenizer } from '../src/core/tokenizer/tokenizer.js';
import { writePreset } from '../models/generator/presets.js';
import { loadModelSpec } from '../src/shared/model-format/model-config.js';
import { parseOptions } from './args.js';
import { runClosedLoop } from './closed-loop.js';
import { machineLine } from './machine.js';
import { startServerProcess, type ServerProcess } from './server-process.js';
import { median, roundOrder } from './suite/phases.js';
import { postScript, wrk } from './wrk.js';

const SPEC = {
  rounds: { type: 'int', min: 1, default: 3, help: 'alternating rounds' },
  seconds: { type: 'int', min: 1, default: 4, help: 'length of each load window' },
  connections: { type: 'int', min: 1, default: 32, help: 'wrk connections' },
} as const;

const root = fileURLToPath(new URL('../..', import.meta.url));
const CLI = join(root, 'dist/src/cli.js');
const MODELS = ['tiny-embed', 'tiny-m3', 'tiny-splade', 'tiny-colbert'];
const TEXT = (n: string) => `where is my parcel number ${n} and when will it arrive`;

/** One route under load: a model, a path, and the body's fields beside `model` and `inputs` (JSON, with its leading comma). */
interface RouteCase {
  name: string;
  baseline: string;
  model: string;
  path: string;
  extra: string;
}

const ROUTES: RouteCase[] = [
  { name: 'tiny-m3 /embed (dense)', baseline: 'tiny-m3 /embed (dense)', model: 'tiny-m3', path: '/embed', extra: '' },
  { name: 'tiny-m3 outputs [sparse]', baseline: 'tiny-m3 /embed (dense)', model: 'tiny-m3', path: '/embed', extra: ',"outputs":["sparse"]' },
  { name: 'tiny-m3 outputs [colbert]', baseline: 'tiny-m3 /embed (dense)', model: 'tiny-m3', path: '/embed', extra: ',"outputs":["colbert"]' },
  { name: 'tiny-m3 outputs [dense, sparse, colbert]', baseline: 'tiny-m3 /embed (dense)', model: 'tiny-m3', path: '/embed', extra: ',"outputs":["dense","sparse","colbert"]' },
  { name: 'tiny-embed /embed', baseline: 'tiny-embed /embed', model: 'tiny-embed', path: '/embed', extra: '' },
  { name: 'tiny-embed /embed_all (token states)', baseline: 'tiny-embed /embed', model: 'tiny-embed', path: '/embed_all', extra: '' },
  { name: 'tiny-splade /embed (30522-wide row)', baseline: 'tiny-splade /embed (30522-wide row)', model: 'tiny-splade', path: '/embed', extra: '' },
  { name: 'tiny-splade /embed_sparse', baseline: 'tiny-splade /embed (30522-wide row)', model: 'tiny-splade', path: '/embed_sparse', extra: '' },
  { name: 'tiny-colbert /embed_all document', baseline: 'tiny-embed /embed', model: 'tiny-colbert', path: '/embed_all', extra: ',"input_type":"document"' },
  { name: 'tiny-colbert /embed_all query (32 tokens)', baseline: 'tiny-embed /embed', model: 'tiny-colbert', path: '/embed_all', extra: ',"input_type":"query"' },
];

async function postJson(origin: string, path: string, body: unknown): Promise<{ value: any; bytes: number }> {
  const r = await fetch(`${origin}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.text();
  if (r.status !== 200) throw new Error(`${path}: ${r.status} ${text.slice(0, 300)}`);
  return { value: JSON.parse(text), bytes: Buffer.byteLength(text) };
}

async function routes(server: ServerProcess, o: { rounds: number; seconds: number; connections: number }, dir: string): Promise<void> {
  const scripts = ROUTES.map((c, i) => {
    const path = join(dir, `route-${i}.lua`);
    writeFileSync(path, postScript(c.path, `'{"model":"${c.model}","inputs":"where is my parcel number ' .. counter .. ' of thread ' .. tostring(wrk.thread) .. ' and when will it arrive"${c.extra.replaceAll("'", "\\'")}}'`));
    return path;
  });
  const bytes = await Promise.all(ROUTES.map(async (c) => (await postJson(server.origin, c.path, { model: c.model, inputs: TEXT('1'), ...JSON.parse(`{${c.extra.slice(1)}}`) })).bytes));
  for (const s of scripts) await wrk(server.origin, 1, o.connections, s); // warm every path
  const rows: { name: string; rps: number; p99Ms: number }[] = [];
  for (let round = 0; round < o.rounds; round++) {
    for (const i of roundOrder(round + 1, ROUTES.length)) {
      const l = await wrk(server.origin, o.seconds, o.connections, scripts[i]!);
      rows.push({ name: ROUTES[i]!.name, rps: l.requests / l.seconds, p99Ms: l.p99Ms });
      console.log(`round ${round + 1} ${ROUTES[i]!.name}: ${(l.requests / l.seconds).toFixed(0)} req/s, P99 ${l.p99Ms.toFixed(1)} ms`);
    }
  }
  const rps = (name: string) => median(rows.filter((r) => r.name === name).map((r) => r.rps));
  console.log(`\n| route | req/s | vs its baseline | P99 ms | answer bytes per input (JSON) |\n|---|---:|---:|---:|---:|`);
  ROUTES.forEach((c, i) => {
    const p99 = median(rows.filter((r) => r.name === c.name).map((r) => r.p99Ms));
    console.log(`| ${c.name} | ${rps(c.name).toFixed(0)} | ${(rps(c.name) / rps(c.baseline)).toFixed(2)}x ${c.baseline === c.name ? '(baseline)' : `of ${c.baseline}`} | ${p99.toFixed(1)} | ${bytes[i]} |`);
  });
}

/** A text of about `tokens` tokens of tiny-embed's tokenizer, and 8 chunks of it at word boundaries ([start, end) in code points). */
async function longText(dir: string, tokens: number): Promise<{ text: string; chunks: [number, number][]; pieces: string[] }> {
  const tok = await loadTokenizer(loadModelSpec(join(dir, 'tiny-embed')).tokenizerPath);
  const vocab = 'the order arrived late and the parcel was damaged so i asked for a refund but the support team said the payment would take ten days to return to my account'.split(' ');
  const words: string[] = [];
  for (let i = 0; tok.encode(words.join(' '), { maxLength: 100_000, truncate: false }).ids.length < tokens - 1; i++) words.push(vocab[(i * 7) % vocab.length]!);
  words.pop();
  const per = Math.ceil(words.length / 8);
  const pieces = Array.from({ length: 8 }, (_, k) => words.slice(k * per, (k + 1) * per).join(' ')).filter((p) => p.length > 0);
  const chunks: [number, number][] = [];
  let at = 0;
  for (const p of pieces) {
    chunks.push([at, at + p.length]);
    at += p.length + 1;
  }
  return { text: pieces.join(' '), chunks, pieces };
}

const cosine = (a: number[], b: number[]) => {
  let ab = 0;
  let aa = 0;
  let bb = 0;
  for (let k = 0; k < a.length; k++) [ab, aa, bb] = [ab + a[k]! * b[k]!, aa + a[k]! * a[k]!, bb + b[k]! * b[k]!];
  return ab / Math.sqrt(aa * bb);
};

/** `clients` closed loops sending `body` for `seconds`: requests/s. */
async function closedLoop(origin: string, body: unknown, clients: number, seconds: number): Promise<number> {
  const loop = await runClosedLoop({ clients, warmupMs: 0, durationMs: seconds * 1000, call: () => postJson(origin, '/embed', body), snapshot: () => null });
  loop.histogram.destroy();
  return (loop.requests / loop.windowMs) * 1000;
}

async function lateChunking(server: ServerProcess, o: { rounds: number; seconds: number }, dir: string): Promise<void> {
  const { text, chunks, pieces } = await longText(dir, 512);
  const late = { model: 'tiny-embed', inputs: text, chunks };
  const apart = { model: 'tiny-embed', inputs: pieces };
  const a = (await postJson(server.origin, '/embed', late)).value as number[][];
  const b = (await postJson(server.origin, '/embed', apart)).value as number[][];
  const cosines = a.map((row, k) => cosine(row, b[k]!));
  const timed = async (body: unknown) => {
    const t0 = performance.now();
    await postJson(server.origin, '/embed', body);
    return performance.now() - t0;
  };
  const lat: Record<'late' | 'apart', number[]> = { late: [], apart: [] };
  const rps: Record<'late' | 'apart', number[]> = { late: [], apart: [] };
  for (let round = 0; round < o.rounds; round++) {
    for (let k = 0; k < 20; k++) {
      lat.late.push(await timed(late));
      lat.apart.push(await timed(apart));
    }
    for (const side of roundOrder(round + 1, 2).map((i) => (['late', 'apart'] as const)[i]!)) {
      rps[side].push(await closedLoop(server.origin, side === 'late' ? late : apart, 8, o.seconds));
    }
  }
  console.log(`\nlate chunking: one text of 512 tokens, ${chunks.length} chunks of ${pieces.map((p) => p.split(' ').length).join('/')} words`);
  console.log(`| | one request, idle server: median ms | 8 clients: chunk rows/s | tokens run per request |\n|---|---:|---:|---:|`);
  const tokens = { late: 512, apart: pieces.length * 2 + 512 - 2 }; // each piece runs with its own [CLS] and [SEP]
  for (const side of ['late', 'apart'] as const) {
    const name = side === 'late' ? '`chunks` (the text once)' : 'the 8 chunk texts as 8 inputs';
    console.log(`| ${name} | ${median(lat[side]).toFixed(1)} | ${(median(rps[side]) * chunks.length).toFixed(0)} | ~${tokens[side]} |`);
  }
  console.log(`cosine between a chunk's late row and its text embedded alone: min ${Math.min(...cosines).toFixed(3)}, median ${median(cosines).toFixed(3)}, max ${Math.max(...cosines).toFixed(3)}`);
}

async function main(): Promise<void> {
  const o = parseOptions('node dist/bench/outputs.js [options]', SPEC);
  console.log(machineLine());
  const dir = mkdtempSync(join(tmpdir(), 'slabserve-outputs-bench-'));
  for (const m of MODELS) writePreset(m, dir);
  const server = await startServerProcess({ cliPath: CLI, args: ['--host', '127.0.0.1', '--port', '0', '--grpc-port', '0', '--models-dir', dir, '--device', 'cpu'] });
  try {
    await routes(server, o, dir);
    await lateChunking(server, o, dir);
  } finally {
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
