/**
 * Quick benchmark: what dynamic batching buys, and how close the engine and the
 * HTTP server get to onnxruntime called directly, on one model (tiny-embed by default).
 *
 *   npm run bench:quick                        # build, generate models, run (~2 min 35 s on 2 cores)
 *   npm run bench:quick -- --skip-extra        # without the maxInflightBatches x intraOpThreads table
 *   npm run bench:quick -- --http-only         # raw + HTTP (and WebSocket) rows only
 *   node dist/bench/quick.js --help
 *
 * Phases (each: warm-up, then a fixed measured duration):
 *   raw b=N       onnxruntime InferenceSession in this thread, on the model as the
 *                 server prepares it (prepareModel: pooling appended), closed loop of
 *                 padded batches of N sequences; every batch holds one length bucket
 *                 and is padded to it, with attention mask, as the engine would do
 *   engine ...    createEngine(), `--concurrency` closed-loop callers, each sending its
 *                 next request (one sequence) when the previous one is answered
 *   http ...      `slabserve serve` in a child process on 127.0.0.1 (batching on, and
 *                 --max-batch-size 1), driven by closed-loop clients in this process over
 *                 keep-alive connections (one per client): POST /embed {"inputs": text},
 *                 so the server tokenizes (bench/server-process.ts)
 *   ws SxD        the same batched server over WebSocket (/ws): S sockets, D requests
 *                 pipelined on each (S x D in flight), one text per request, encoding f32
 *                 (bench/ws-load.ts); reported beside 'http batched' at as many clients
 *
 * Every configuration runs `--rounds` times, rounds in alternating order
 * (A B C ... C B A A B C ...) so slow drift of a noisy machine hits all
 * configurations alike; each row reports the median round by sequences/s
 * (--report best: the fastest) and the spread between rounds.
 *
 * Every row sees the same inputs: short texts generated from a fixed seed and
 * tokenized by the model's tokenizer. Raw and the engine run those token ids
 * (with --texts the engine gets the text, through engine.embed); the HTTP rows
 * send the text. --ids: random token ids instead (the old workload; no HTTP rows).
 */import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { resolveBatching } from '../src/main/engine.js';
import { bucketFor } from '../src/gpu-worker/scheduler.js';
import { mulberry32 as rng } from '../models/generator/rng.js';
import { loadModelSpec, type ModelSpec } from '../src/shared/model-format/model-config.js';
import { machineInfo as describeMachine, machineLine } from './machine.js';
import type { MachineInfo as Machine } from './suite-results.js';
import { floorRows, floorTable, runFloorCase, type FloorRow } from './floor.js';
import { parseQuickOptions, type QuickOptions } from './quick/options.js';
import { extraTable, httpTable, legend, mainTable, QuickResults, wsTable } from './quick/report.js';
import { closeRig, openRig, rigLines } from './quick/rig.js';
import { phaseList, reportedRounds, runRounds } from './quick/rounds.js';
import { serverWorkload, textWorkload, tokenWorkload, type Seq } from './quick/workload.js';

const here = dirname(fileURLToPath(import.meta.url));
// dist/bench/quick.js -> the repo root is two levels up
const repoRoot = resolve(here, '..', '..');

/** The workload's shape: lengths and the share of each length bucket. */
function workloadShape(seqs: Seq[], buckets: number[]) {
  const lens = seqs.map((s) => s.ids.length);
  const bucketMix = buckets.map((T, b) => ({ T, n: seqs.filter((s) => bucketFor(buckets, s.ids.length) === b).length })).filter((x) => x.n > 0);
  return { lens, bucketMix, minTokens: Math.min(...lens), maxTokens: Math.max(...lens), meanTokens: lens.reduce((a, b) => a + b, 0) / lens.length };
}

/** The lines before the rounds: model, machine, workload, phases. */
function introLines(o: QuickOptions, spec: ModelSpec, m: Machine, seqs: Seq[], shape: ReturnType<typeof workloadShape>): string[] {
  const layers = (JSON.parse(readFileSync(join(spec.dir, 'config.json'), 'utf8')) as { num_hidden_layers?: number }).num_hidden_layers ?? '?';
  const how = o.ids
    ? 'random token sequences (raw: padded batches of them; engine: engine.runTokens)'
    : `generated texts, tokenized here by the model's tokenizer (raw: padded batches of their ids; engine: ${o.texts ? 'engine.embed(text), tokenization included' : 'engine.runTokens(ids)'}` +
      `${o.http ? '; http: POST /embed {"inputs": text}, the server tokenizes' : ''})`;
  return [
    `slabserve quick bench: ${o.model} (${spec.task}, hidden ${spec.hiddenSize}, ${layers} layers)`,
    machineLine(m),
    `workload: ${seqs.length} ${how}, seed ${o.seed}, ` +
      `${shape.minTokens}..${shape.maxTokens} tokens (mean ${shape.meanTokens.toFixed(1)}), ` +
      `buckets ${shape.bucketMix.map((x) => `${x.T}:${((100 * x.n) / seqs.length).toFixed(0)}%`).join(' ')}`,
    `phases: ${o.warmupMs / 1000}s warm-up + ${o.durationMs / 1000}s measured, ${o.rounds} rounds in alternating order, ${o.report} round reported; ` +
      `${o.engines ? `engine: device ${o.device}, ${o.concurrency} closed-loop callers; ` : ''}` +
      `${o.http ? `http: ${o.httpClients.join(' and ')} clients, one keep-alive connection each (load generator: ${o.loadGenerator === 'auto' ? 'wrk where installed' : o.loadGenerator}), server in a child process; ` : ''}` +
      `intra-op threads ${o.intra}${o.intra === 0 ? ' (auto: one below hidden size 256, else every core; src/gpu-worker/intra-op-threads.ts)' : ''}`,
  ];
}

/** The floor (bench/floor.ts): the gateway's CPU per request against a server doing only its unavoidable work. */
async function floorCase(o: QuickOptions): Promise<FloorRow[]> {
  const rows = floorRows(
    await runFloorCase({
      cliPath: join(repoRoot, 'dist', 'src', 'cli.js'),
      modelsDir: o.modelsDir,
      model: o.model,
      rounds: o.rounds,
      warmupMs: o.warmupMs,
      durationMs: o.durationMs,
      clients: o.httpClients,
      transports: o.ws ? ['http', 'ws'] : ['http'],
      forms: ['text', 'ids'],
      seed: o.seed,
    }),
  );
  console.log(['', `## ${o.model}: CPU per request by thread, slabserve beside the floor (read, tokenize, serialise; no batching, no model), median of ${o.rounds} rounds`, '', floorTable(rows)].join('\n'));
  return rows;
}

async function main(): Promise<void> {
  const started = performance.now();
  const o = parseQuickOptions(repoRoot);
  const spec = loadModelSpec(join(o.modelsDir, o.model), o.model);
  const m = describeMachine();
  const buckets = resolveBatching(spec, {}).buckets;
  const r = rng(o.seed);
  const seqs = o.ids ? tokenWorkload(r, o.requests) : await textWorkload(r, o.requests, spec);
  const shape = workloadShape(seqs, buckets);
  console.log(introLines(o, spec, m, seqs, shape).join('\n'));

  const rig = await openRig(o, spec, seqs, buckets, resolve(here, '..', 'src', 'cli.js'));
  console.log(rigLines(o, rig, buckets).join('\n'));
  const phases = phaseList(o, rig, seqs, serverWorkload(seqs));
  let all;
  let serverExits;
  try {
    all = await runRounds(o, phases);
  } finally {
    serverExits = await closeRig(rig);
  }

  const results = new QuickResults(o, reportedRounds(o, phases, all), all);
  console.log(mainTable(results).join('\n'));
  if (o.extra) console.log(extraTable(results).join('\n'));
  const http = o.http ? httpTable(results) : { lines: [], derived: {} };
  const ws = o.ws ? wsTable(results) : { lines: [], derived: {} };
  if (o.http) console.log(http.lines.join('\n'));
  if (o.ws) console.log(ws.lines.join('\n'));
  console.log(['', legend(results)].join('\n'));
  const floor = o.floor ? await floorCase(o) : null;
  console.log(`total time ${((performance.now() - started) / 1000).toFixed(0)}s`);

  if (o.json) {
    const { gain, vsRaw } = results.engineRatios();
    const out = {
      machine: m,
      options: {
        report: o.report,
        model: o.model,
        durationS: o.durationMs / 1000,
        warmupS: o.warmupMs / 1000,
        rounds: o.rounds,
        concurrency: o.concurrency,
        intraOpThreads: o.intra,
        device: o.device,
        texts: o.texts,
        ids: o.ids,
        seed: o.seed,
        requests: o.requests,
        http: o.http ? { clients: o.httpClients, generator: o.loadGenerator } : null,
        ws: o.ws ? o.wsConfigs : null,
      },
      workload: { sequences: seqs.length, minTokens: shape.minTokens, maxTokens: shape.maxTokens, bucketMix: shape.bucketMix },
      setup: { ...rig.setup, serverExits },
      reported: Object.fromEntries(results.best),
      derived: { batchingGain: gain, engineVsRaw: vsRaw, rawBest: results.rawBestName, http: http.derived, ws: ws.derived },
      rounds: all,
      floor,
    };
    writeFileSync(o.json, JSON.stringify(out, null, 2) + '\n');
    console.log(`wrote ${o.json}`);
  }
}

await main();
