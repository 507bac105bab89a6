/**
 * Micro-benchmark: float32 embedding rows to JSON bytes.
 *
 *   npx tsc -p tsconfig.json && node dist/bench/micro/float-json.js
 *
 * On the same seeded unit-length rows (1 x 128, 1 x 384, 32 x 128), per call
 * (calls cycle through sets of different rows, ~16k floats in all per shape,
 * so that the branch predictor cannot learn one row by heart):
 *   stringify        JSON.stringify(rows.map((r) => Array.from(r)))   (today's answer text)
 *   stringify+bytes  Buffer.from() of that string                     (what sending it costs)
 *   float32RowsJson  src/gateway/http/float-json.ts                         (shortest float32 decimals, bytes)
 * Prints the median of 7 alternating rounds (~150 ms each) in ns per float,
 * and the output size in bytes.
 */
import { performance } from 'node:perf_hooks';
import { float32RowsJson } from '../../src/gateway/http/float-json.js';
import { mulberry32 } from '../../models/generator/rng.js';
import { roundOrder } from '../suite/phases.js';

const rand = mulberry32(20240601);

function unitRow(dims: number): Float32Array {
  const row = new Float32Array(dims);
  let norm = 0;
  for (let i = 0; i < dims; i++) {
    const g = Math.sqrt(-2 * Math.log(1 - rand())) * Math.cos(2 * Math.PI * rand());
    norm += (row[i] = g) ** 2;
  }
  for (let i = 0; i < dims; i++) row[i]! /= Math.sqrt(norm);
  return row;
}

type Method = { name: string; run: (rows: Float32Array[]) => number };
const methods: Method[] = [
  { name: 'stringify', run: (rows) => JSON.stringify(rows.map((r) => Array.from(r))).length },
  { name: 'stringify+bytes', run: (rows) => Buffer.from(JSON.stringify(rows.map((r) => Array.from(r)))).length },
  { name: 'float32RowsJson', run: (rows) => float32RowsJson(rows).length },
];

/** ns per call over ~ms milliseconds. */
function time(m: Method, sets: Float32Array[][], ms: number): number {
  let calls = 0;
  let sink = 0;
  const start = performance.now();
  let now = start;
  while (now - start < ms) {
    for (let i = 0; i < 20; i++) sink += m.run(sets[(calls + i) % sets.length]!);
    calls += 20;
    now = performance.now();
  }
  if (sink < 0) console.log(sink);
  return ((now - start) * 1e6) / calls;
}

const shapes: [number, number][] = [
  [1, 128],
  [1, 384],
  [32, 128],
];
console.log(`node ${process.version}; median of 7 rounds; ns per float (bytes per answer)`);
console.log(['shape', ...methods.map((m) => m.name)].map((s) => s.padStart(24)).join(''));
for (const [n, dims] of shapes) {
  const floats = n * dims;
  const sets = Array.from({ length: Math.ceil(16384 / floats) }, () => Array.from({ length: n }, () => unitRow(dims)));
  for (const m of methods) time(m, sets, 100); // warm-up
  const samples = methods.map(() => [] as number[]);
  for (let round = 1; round <= 7; round++) for (const i of roundOrder(round, methods.length)) samples[i]!.push(time(methods[i]!, sets, 150));
  const cells = methods.map((m, i) => {
    const sorted = samples[i]!.sort((a, b) => a - b);
    const bytes = m.run(sets[0]!);
    return `${(sorted[3]! / floats).toFixed(1)} ns (${bytes} B)`;
  });
  console.log([`${n} x ${dims}`, ...cells].map((s) => s.padStart(24)).join(''));
}
