/**
 * float-json: every float32 written is the shortest decimal that reads back
 * (Math.fround(Number(s)) === v, what a JSON client that parses into a double
 * and then rounds to float32 gets), valid JSON, in Number#toString's format.
 *
 * The reference shares no code with the module: exact BigInt arithmetic finds,
 * from the coarsest decimal grid down, the first grid with a neighbour of v
 * that reads back (nearer neighbour first, the upper one on an exact tie:
 * both neighbours are tried, so it is the true shortest, powers of two
 * included) and prints it with String(Number(...)), i.e. JavaScript's own
 * formatting. Each value must give exactly that string. Fresh random values
 * every run (seed from the clock); replay a failure with
 * SLABSERVE_TEST_SEED=<seed printed below>.
 */
import { describe, expect, it } from 'vitest';
import {
  MAX_FLOAT32_CHARS,
  float32RowJsonInto,
  float32RowListsJsonView,
  float32RowsJson,
  outputsJson,
  writeFloat32,
} from '../dist/src/gateway/http/float-json.js';
import { mulberry32 } from '../dist/models/generator/rng.js';

const seed = Number(process.env.SLABSERVE_TEST_SEED ?? Date.now() % 2 ** 31);
console.log(`float-json: seed ${seed} (replay with SLABSERVE_TEST_SEED=${seed})`);
const rand = mulberry32(seed);

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
const fromBits = (bits: number): number => ((u32[0] = bits >>> 0), f32[0]!);
const bitsOf = (v: number): number => ((f32[0] = v), u32[0]!);
const randU32 = (): number => Math.floor(rand() * 2 ** 32) >>> 0;

function gaussian(): number {
  const u = 1 - rand();
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * rand());
}

function unitRow(dims: number): Float32Array {
  const row = new Float32Array(dims);
  let norm = 0;
  for (let i = 0; i < dims; i++) norm += (row[i] = gaussian()) ** 2;
  const inv = 1 / Math.sqrt(norm);
  for (let i = 0; i < dims; i++) row[i]! *= inv;
  return row;
}

// ---- exact reference ----------------------------------------------------

const POW2 = Array.from({ length: 160 }, (_, i) => 2n ** BigInt(i));
const POW10 = Array.from({ length: 100 }, (_, i) => 10n ** BigInt(i));

/** Shortest round-tripping decimal of the finite float32 v, as Number#toString prints it. */
function reference(v: number): string {
  if (v === 0) return Object.is(v, -0) ? '-0' : '0';
  const a = Math.abs(v);
  const bits = bitsOf(a);
  const field = bits >>> 23;
  const m = BigInt(field === 0 ? bits & 0x7fffff : (bits & 0x7fffff) | 0x800000);
  const e2 = field === 0 ? -149 : field - 150; // a = m * 2^e2
  /** floor(a / 10^q) and the sign of (a / 10^q - floor - 1/2). */
  const split = (q: number): [bigint, number] => {
    const num = m * (e2 > 0 ? POW2[e2]! : 1n) * (q < 0 ? POW10[-q]! : 1n);
    const den = (e2 < 0 ? POW2[-e2]! : 1n) * (q > 0 ? POW10[q]! : 1n);
    const fl = num / den;
    const twice = 2n * (num - fl * den);
    return [fl, twice > den ? 1 : twice < den ? -1 : 0];
  };
  const k = split(-60)[0].toString().length - 1 - 60; // floor(log10 a), exactly
  for (let q = k; q >= k - 9; q--) {
    const [fl, half] = split(q);
    for (const n of half >= 0 ? [fl + 1n, fl] : [fl, fl + 1n]) {
      const x = Number(`${n}e${q}`);
      if (n > 0n && Math.fround(x) === a) return (v < 0 ? '-' : '') + String(x);
    }
  }
  throw new Error(`reference: nothing reads back to ${v}`);
}

// ---- checking -------------------------------------------------------------

const buf = new Uint8Array(64);
const AT = 7;
const SENTINEL = 0xa5;

function written(v: number): string {
  buf.fill(SENTINEL);
  const end = writeFloat32(buf, AT, v);
  if (end - AT > MAX_FLOAT32_CHARS) throw new Error(`${end - AT} bytes for ${v}`);
  if (buf[AT - 1] !== SENTINEL || buf[end] !== SENTINEL) throw new Error(`wrote outside [${AT}, ${end}) for ${v}`);
  return Buffer.from(buf.buffer, AT, end - AT).toString('latin1');
}

/** Checks every value; returns how many were checked. Fails with the first few bad ones. */
function checkAll(label: string, values: Iterable<number>): number {
  const bad: string[] = [];
  let count = 0;
  for (const v of values) {
    if (!Number.isFinite(v)) continue;
    count++;
    const s = written(v);
    const problem = !Object.is(Math.fround(Number(s)), v)
      ? 'does not read back'
      : !Object.is(JSON.parse(s), Number(s))
        ? 'bad JSON'
        : s !== reference(v)
          ? `expected ${reference(v)}`
          : null;
    if (problem && bad.length < 10) bad.push(`${label}: bits 0x${bitsOf(v).toString(16)} (${v}) -> ${s}: ${problem}`);
  }
  expect(bad).toEqual([]);
  return count;
}

function* repeat(n: number, make: () => number): Generator<number> {
  for (let i = 0; i < n; i++) yield make();
}

/** v and its float32 neighbours (bit patterns +-1, +-2), both signs. */
function* neighbourhood(v: number): Generator<number> {
  const b = bitsOf(Math.abs(Math.fround(v)));
  for (let d = -2; d <= 2; d++) {
    const nb = b + d;
    if (nb < 0 || nb >= 0x7f800000) continue;
    yield fromBits(nb);
    yield -fromBits(nb);
  }
}

let total = 0;

describe('writeFloat32', () => {
  it('uniform random bit patterns', () => {
    total += checkAll('uniform', repeat(200_000, () => fromBits(randU32())));
  });

  it('embedding components (unit-length rows of 128 and 384 dims)', () => {
    const values: number[] = [];
    for (let r = 0; r < 400; r++) values.push(...unitRow(128), ...unitRow(384));
    total += checkAll('embedding', values);
  });

  it('powers of two and their neighbours, min/max float32, subnormals', () => {
    const values: number[] = [];
    for (let e = -149; e <= 127; e++) values.push(...neighbourhood(2 ** e));
    for (const v of [1.401298464324817e-45, 1.1754942106924411e-38, 1.1754943508222875e-38, 3.4028234663852886e38]) {
      values.push(...neighbourhood(v));
    }
    for (let b = 1; b < 2000; b++) values.push(fromBits(b), fromBits(0x7fffff - b));
    values.push(...repeat(50_000, () => fromBits((randU32() & 0x807fffff) >>> 0)));
    total += checkAll('binary', values);
  });

  it('integers, decade boundaries, the fast path limits, few-digit decimals', () => {
    const values: number[] = [0, -0, 0.5, -0.5, 3, 123.25, 0.1, 1e-7, 1e-6, 1.5e-7, 16777216, 16777217, 2 ** 31];
    for (let i = 0; i <= 5000; i++) values.push(i, -i);
    values.push(...repeat(20_000, () => Math.fround(Math.floor(rand() * 2 ** (1 + rand() * 40)))));
    for (let e = -46; e <= 39; e++) {
      values.push(...neighbourhood(Number(`1e${e}`)), ...neighbourhood(Number(`9.99999e${e}`)));
    }
    values.push(
      ...repeat(50_000, () => {
        const digits = 1 + Math.floor(rand() * 9);
        const d = Math.floor(rand() * 10 ** digits);
        const v = Math.fround(Number(`${d}e${Math.floor(rand() * 86) - 46}`));
        return rand() < 0.5 ? v : -v;
      }),
    );
    total += checkAll('decimal', values.map(Math.fround).filter((v) => v !== Infinity));
    console.log(`float-json: ${total} values checked (seed ${seed})`);
  });

  it('writes -0 as -0, NaN and +-Infinity as null', () => {
    expect(written(-0)).toBe('-0');
    expect(Object.is(JSON.parse(written(-0)), -0)).toBe(true);
    expect(written(0)).toBe('0');
    for (const v of [NaN, Infinity, -Infinity, fromBits(0x7fc00000), fromBits(0xffc00001), fromBits(0x7f800001)]) {
      expect(written(v)).toBe('null');
    }
  });

  it('a few exact strings', () => {
    const cases: [number, string][] = [
      [0.5, '0.5'],
      [-0.5, '-0.5'],
      [3, '3'],
      [123.25, '123.25'],
      [0.1, '0.1'],
      [1e-7, '1e-7'],
      [1.5e-7, '1.5e-7'],
      [0.012345678, '0.012345678'],
      [3.4028234663852886e38, '3.4028235e+38'],
      [1.401298464324817e-45, '1e-45'],
      [1e21, '1e+21'],
      [1e20, '100000000000000000000'],
      [1.2345678e-6, '0.0000012345678'],
      [16777216, '16777216'],
      [2 ** 33, '8589935000'],
    ];
    for (const [v, s] of cases) expect(written(Math.fround(v))).toBe(s);
    // a number that is not a float32 is rounded to float32 first
    expect(written(0.1)).toBe('0.1');
    expect(written(1 / 3)).toBe('0.33333334');
  });
});

describe('float32RowsJson', () => {
  const text = (bytes: Uint8Array): string => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length).toString('latin1');
  const expected = (rows: Float32Array[]): string =>
    `[${rows.map((r) => `[${Array.from(r, (v) => (Number.isFinite(v) ? reference(v) : 'null')).join(',')}]`).join(',')}]`;
  const check = (rows: Float32Array[]): void => {
    const out = text(float32RowsJson(rows));
    expect(out).toBe(expected(rows));
    const parsed = JSON.parse(out) as (number | null)[][];
    expect(parsed.length).toBe(rows.length);
    rows.forEach((row, r) => {
      expect(parsed[r]!.length).toBe(row.length);
      row.forEach((v, i) => {
        const got = parsed[r]![i];
        if (!(Number.isFinite(v) ? Object.is(Math.fround(got as number), v) : got === null)) {
          throw new Error(`row ${r} [${i}]: ${v} came back as ${got}`);
        }
      });
    });
  };

  it('empty inputs', () => {
    expect(text(float32RowsJson([]))).toBe('[]');
    expect(text(float32RowsJson([new Float32Array(0)]))).toBe('[[]]');
    expect(text(float32RowsJson([new Float32Array(0), new Float32Array([1.5])]))).toBe('[[],[1.5]]');
  });

  it('random rows: embeddings, uniform bits, non-finite values', () => {
    check([unitRow(128)]);
    check([unitRow(384), unitRow(384)]);
    check(Array.from({ length: 32 }, () => unitRow(128)));
    check(Array.from({ length: 40 }, () => Float32Array.from(repeat(Math.floor(rand() * 300), () => fromBits(randU32())))));
    check([new Float32Array([NaN, -0, 0, Infinity, -Infinity, 1e-45, -3.4028234663852886e38])]);
  });

  it('many rows, and more than the scratch buffer holds', () => {
    check(Array.from({ length: 300 }, () => unitRow(1 + Math.floor(rand() * 1024))));
    check(Array.from({ length: 60 }, () => unitRow(1024))); // > 1 MiB bound: its own buffer
  });

  it('an answer stays valid after later calls', () => {
    const a = [unitRow(384)];
    const first = float32RowsJson(a);
    const copy = first.slice();
    float32RowsJson([unitRow(384), unitRow(384)]);
    float32RowsJson(Array.from({ length: 60 }, () => unitRow(1024)));
    expect(first).toEqual(copy);
    expect(text(first)).toBe(expected(a));
  });

  it('rows that are views into a larger buffer', () => {
    const big = unitRow(4 * 384 + 3);
    check([big.subarray(3, 3 + 384), big.subarray(3 + 384, 3 + 2 * 384), big.subarray(1, 2)]);
  });

  it('float32RowJsonInto writes one row at an offset', () => {
    const row = unitRow(16);
    const out = new Uint8Array(5 + row.length * (MAX_FLOAT32_CHARS + 1) + 2);
    const end = float32RowJsonInto(out, 5, row);
    expect(text(out.subarray(5, end))).toBe(expected([row]).slice(1, -1));
  });
});

describe('float32RowListsJsonView and outputsJson (/embed_all, /embed with outputs)', () => {
  const text = (bytes: Uint8Array): string => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length).toString('latin1');
  const row = (v: Float32Array) => `[${Array.from(v, reference).join(',')}]`;

  it('lists of rows: per input, per token; empty lists included', () => {
    const lists = [Array.from({ length: 5 }, () => unitRow(16)), [], Array.from({ length: 40 }, () => unitRow(128))];
    expect(text(float32RowListsJsonView(lists))).toBe(`[${lists.map((rows) => `[${rows.map(row).join(',')}]`).join(',')}]`);
    expect(text(float32RowListsJsonView([]))).toBe('[]');
  });

  it('outputs of several inputs, each key where asked, none overwritten by the next (the writers share a scratch buffer)', () => {
    const items = Array.from({ length: 4 }, (_, i) => ({
      ...(i !== 1 ? { dense: unitRow(32) } : {}),
      ...(i !== 2 ? { sparse: { indices: Uint32Array.from([3, 17, 900 + i]), values: Float32Array.from([0.5, 1.25, gaussian()]) } } : {}),
      ...(i !== 3 ? { colbert: Array.from({ length: 3 + i }, () => unitRow(8)) } : {}),
    }));
    const want = items.map((x) => {
      const keys: string[] = [];
      if (x.dense) keys.push(`"dense":${row(x.dense)}`);
      if (x.sparse) keys.push(`"sparse":[${Array.from(x.sparse.indices, (index, k) => `{"index":${index},"value":${reference(x.sparse!.values[k]!)}}`).join(',')}]`);
      if (x.colbert) keys.push(`"colbert":[${x.colbert.map(row).join(',')}]`);
      return `{${keys.join(',')}}`;
    });
    expect(text(outputsJson(items))).toBe(`[${want.join(',')}]`);
  });
});
