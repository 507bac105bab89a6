/**
 * Where should a gateway tokenize? Inline on its event loop, or on the
 * piscina pool (src/gateway/tokenize/pool.ts)? Measures, side by side, for a
 * single short text and for a client batch of 64 long texts:
 *   - wall time per request (what the caller waits),
 *   - event-loop time per request (what every other request on that gateway waits).
 *
 *   npx tsc -p tsconfig.json && node dist/bench/micro/tokenize-pool.js
 */
import { performance } from 'node:perf_hooks';
import { join } from 'node:path';
import { createTokenizePool } from '../../src/gateway/tokenize/pool.js';
import { loadTokenizer } from '../../src/core/tokenizer/tokenizer.js';
import type { ServedModel } from '../../src/core/served-model.js';
import { packageRoot } from '../../src/main/plan-models.js';
import { loadModelSpec } from '../../src/shared/model-format/model-config.js';
import { mulberry32 } from '../../models/generator/rng.js';
import { median, roundOrder } from '../suite/phases.js';
import { alignedTable, fmt } from '../table.js';
import { vocabulary } from '../workloads.js';

const ROUNDS = 5;
const ROUND_MS = 1000;

const spec = loadModelSpec(join(packageRoot, 'models', 'tiny-embed'));
const tokenizer = await loadTokenizer(spec.tokenizerPath);
const model = { plan: { spec, maxLength: 512 }, tokenizer } as unknown as ServedModel;
const opts = { maxLength: 512, truncate: true };
const pool = createTokenizePool(1);
// The pool's first task starts its thread and loads the tokenizer there: not part of any case.
await pool.tokenize(model, ['warm up'], opts);

const rand = mulberry32(7);
const words = vocabulary().words;
const text = (n: number) => Array.from({ length: n }, () => words[Math.floor(rand() * words.length)]).join(' ');
const short = Array.from({ length: 256 }, () => text(8 + Math.floor(rand() * 24)));
const long = Array.from({ length: 64 * 8 }, () => text(380 + Math.floor(rand() * 40)));

type Case = { name: string; run: (i: number) => Promise<unknown> | unknown };
const cases: Case[] = [
  { name: '1 short text, inline', run: (i) => tokenizer.encode(short[i % short.length]!, opts) },
  { name: '1 short text, pool', run: (i) => pool.tokenize(model, [short[i % short.length]!], opts) },
  { name: '1 long text, inline', run: (i) => tokenizer.encode(long[i % long.length]!, opts) },
  { name: '1 long text, pool', run: (i) => pool.tokenize(model, [long[i % long.length]!], opts) },
  { name: '8 short texts, inline', run: (i) => tokenizer.encodeBatch(short.slice((i % 32) * 8, (i % 32) * 8 + 8), opts) },
  { name: '8 short texts, pool', run: (i) => pool.tokenize(model, short.slice((i % 32) * 8, (i % 32) * 8 + 8), opts) },
  { name: '64 long texts, inline', run: (i) => tokenizer.encodeBatch(long.slice((i % 8) * 64, (i % 8) * 64 + 64), opts) },
  { name: '64 long texts, pool', run: (i) => pool.tokenize(model, long.slice((i % 8) * 64, (i % 8) * 64 + 64), opts) },
];

async function measure(c: Case): Promise<{ wallUs: number; loopUs: number }> {
  let n = 0;
  const elu0 = performance.eventLoopUtilization();
  const t0 = performance.now();
  while (performance.now() - t0 < ROUND_MS) await c.run(n++);
  const wall = performance.now() - t0;
  const elu = performance.eventLoopUtilization(elu0);
  return { wallUs: (wall * 1000) / n, loopUs: (elu.active * 1000) / n };
}

const results = cases.map(() => [] as { wallUs: number; loopUs: number }[]);
for (const c of cases) await measure(c); // warm-up
for (let r = 1; r <= ROUNDS; r++) for (const i of roundOrder(r, cases.length)) results[i]!.push(await measure(cases[i]!));
const chars = (xs: string[]) => Math.round(xs.reduce((a, t) => a + t.length, 0) / xs.length);
console.log(`texts: short ${chars(short)} chars on average, long ${chars(long)} chars`);
const rows = cases.map((c, i) => [c.name, fmt(median(results[i]!.map((x) => x.wallUs)), 0), fmt(median(results[i]!.map((x) => x.loopUs)), 0)]);
console.log(alignedTable(['case', 'wall µs/request', 'event-loop µs/request'], rows));
await pool.close();
