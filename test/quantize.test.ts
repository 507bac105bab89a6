/**
 * Quantized embeddings (`embedding_type`, src/core/quantized-embeddings.ts):
 *
 * - the module against a reference written here, differently (bits as a
 *   '0'/'1' string cut into bytes; rounding by floor(|s| + 0.5)), on seeded
 *   random rows of every width from 1 to 40 with exact zeros and -0 in them,
 *   and on hand-computed rows that pin the "> 0" rule, the padding of the last
 *   byte, the ties and the zero row;
 * - a real server (tiny-embed, CPU): every embedding_type on /embed in JSON and
 *   msgpack, on OpenAI's route (float and base64 through the official client,
 *   with `dimensions` 61 for a width that is not a multiple of 8), on the
 *   WebSocket op and through slabserve's clients; each answer compared with
 *   the reference quantization of the float rows the same server answers, and
 *   those float rows with the independent reference (PlainReference).
 *
 * The float rows of two requests may differ in the last bits (other batches,
 * other padding), so a code may differ from the reference only where the
 * reference's unrounded value lies within AMBIGUOUS of a rounding boundary
 * (or, for the sign bits, where |v| < AMBIGUOUS); everywhere else it must be
 * equal, and most positions must be of that kind for the check to mean anything.
 */
import { unpack } from 'msgpackr';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SlabClient, SlabHttpClient } from '../dist/src/client/index.js';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import {
  EMBEDDING_TYPES,
  packSignBits,
  packSignBitsSigned,
  quantizedBytes,
  quantizeInt8,
  quantizeRow,
  quantizeUint8,
  rowBytes,
} from '../dist/src/core/quantized-embeddings.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { makeRandom, maxAbsDiff, PlainReference, randomTexts, testServerConfig, vocabularyWords, wsRequest } from './helpers.js';

type QType = 'int8' | 'uint8' | 'binary' | 'ubinary';
const QTYPES: QType[] = ['int8', 'uint8', 'binary', 'ubinary'];
const SIGNED = new Set<QType>(['int8', 'binary']);
/** Float noise between two requests' rows is ~1e-7; boundaries closer than this may round either way. */
const AMBIGUOUS = 1e-4;
const TOLERANCE = 1e-5;

// ------------------------------------------------------------------ the reference, written independently

/** Round half away from zero, another way than the module's. */
const roundAway = (s: number) => Math.sign(s) * Math.floor(Math.abs(s) + 0.5) + 0; // + 0: no -0

function unit(v: ArrayLike<number>): number[] {
  const norm = Math.sqrt(Array.from(v).reduce((a, x) => a + x * x, 0));
  return Array.from(v, (x) => (norm > 0 ? x / norm : 0));
}

/** Per component: the code and its unrounded value (for the ambiguity test). */
function refScaled(v: ArrayLike<number>, type: 'int8' | 'uint8'): { codes: number[]; raw: number[] } {
  const raw = unit(v).map((x) => (type === 'int8' ? x * 127 : (x + 1) * 127.5));
  const [lo, hi] = type === 'int8' ? [-127, 127] : [0, 255];
  return { codes: raw.map((s) => Math.min(hi, Math.max(lo, roundAway(s)))), raw };
}

/** np.packbits(v > 0): bits as text, padded with '0' to whole bytes, read 8 at a time. */
function refUbinary(v: ArrayLike<number>): number[] {
  let bits = Array.from(v, (x) => (x > 0 ? '1' : '0')).join('');
  while (bits.length % 8 !== 0) bits += '0';
  return Array.from({ length: bits.length / 8 }, (_, i) => parseInt(bits.slice(i * 8, i * 8 + 8), 2));
}

function refCodes(v: ArrayLike<number>, type: QType): number[] {
  if (type === 'int8' || type === 'uint8') return refScaled(v, type).codes;
  const u = refUbinary(v);
  return type === 'ubinary' ? u : u.map((b) => b - 128);
}

/**
 * Checks `got` (codes) against the reference of the float row `v`: equal
 * wherever the reference is not within AMBIGUOUS of a boundary, off by at most
 * one step (a code, or a bit) where it is. Returns how many positions were ambiguous.
 */
function expectCodesOf(got: ArrayLike<number>, v: ArrayLike<number>, type: QType, what: string): number {
  const want = refCodes(v, type);
  expect(got.length, `${what}: length`).toBe(quantizedBytes(type, v.length));
  let ambiguous = 0;
  if (type === 'int8' || type === 'uint8') {
    const { raw } = refScaled(v, type);
    for (let i = 0; i < want.length; i++) {
      const near = Math.abs(Math.abs(raw[i]! % 1) - 0.5) < AMBIGUOUS;
      if (near) ambiguous++;
      if (near) expect(Math.abs(got[i]! - want[i]!), `${what}[${i}]`).toBeLessThanOrEqual(1);
      else expect(got[i], `${what}[${i}] (reference ${raw[i]})`).toBe(want[i]);
    }
    return ambiguous;
  }
  for (let b = 0; b < want.length; b++) {
    let free = 0; // bits that may differ: components too close to 0
    for (let k = 0; k < 8 && b * 8 + k < v.length; k++) if (Math.abs(v[b * 8 + k]!) < AMBIGUOUS) free |= 0x80 >> k;
    if (free) ambiguous++;
    expect(((got[b]! ^ want[b]!) & 0xff & ~free) >>> 0, `${what} byte ${b}`).toBe(0);
  }
  return ambiguous;
}

/** A row of `n` random values in (-1, 1), some exactly 0 or -0. */
function randomRow(rand: () => number, n: number): Float32Array {
  return Float32Array.from({ length: n }, () => {
    const r = rand();
    if (r < 0.1) return 0;
    if (r < 0.15) return -0;
    return rand() * 2 - 1;
  });
}

// ------------------------------------------------------------------ the module

describe('quantize: the module against the reference', () => {
  it('random rows of widths 1..40, zeros and -0 included, every type', () => {
    const rand = makeRandom('quantize unit');
    let zeros = 0;
    for (let n = 1; n <= 40; n++) {
      for (let rep = 0; rep < 25; rep++) {
        const v = randomRow(rand, n);
        zeros += v.filter((x) => x === 0).length;
        for (const type of QTYPES) {
          const q = quantizeRow(v, type);
          expect(q instanceof Int8Array, type).toBe(SIGNED.has(type));
          expect(Array.from(q), `${type} of [${Array.from(v)}]`).toEqual(refCodes(v, type));
        }
      }
    }
    expect(zeros).toBeGreaterThan(100); // the "> 0" rule was exercised
  });

  it('the sign bits: > 0 only (0, -0 and NaN are 0), first component in the high bit, the last byte padded with 0', () => {
    const v = Float32Array.from([0.3, 0, -0.2, -0, 0.1, NaN, 0.4, -0.5, 0.25]);
    // bits 1 0 0 0 1 0 1 0 | 1 (0000000 padding)
    expect(Array.from(packSignBits(v))).toEqual([0b10001010, 0b10000000]);
    expect(Array.from(packSignBitsSigned(v))).toEqual([0b10001010 - 128, 0]);
    expect(Array.from(packSignBits(Float32Array.from([1e-40, -1e-40])))).toEqual([0b10000000]); // a subnormal is > 0
    expect(quantizedBytes('binary', 9)).toBe(2);
    expect(quantizedBytes('ubinary', 8)).toBe(1);
    expect(quantizedBytes('int8', 9)).toBe(9);
  });

  it('int8 and uint8 scale the unit row; ties round away from zero; the zero row', () => {
    // [1, 1, 1, 1] / 2: x = 0.5, 0.5 * 127 = 63.5 (a tie) -> 64; -0.5 -> -64 (Math.round alone would give -63)
    expect(Array.from(quantizeInt8(Float32Array.from([1, -1, 1, -1])))).toEqual([64, -64, 64, -64]);
    // (0.5 + 1) * 127.5 = 191.25 -> 191; (-0.5 + 1) * 127.5 = 63.75 -> 64
    expect(Array.from(quantizeUint8(Float32Array.from([1, -1, 1, -1])))).toEqual([191, 64, 191, 64]);
    // the scale is the norm's, not the row's own: [3, 4] is [0.6, 0.8]
    expect(Array.from(quantizeInt8(Float32Array.from([3, -4])))).toEqual([76, -102]); // 76.2, -101.6
    // 1.6 * 127.5 = 204; (1 - 0.8) * 127.5 is 25.499999999999993 in float64 (0.8 is a little above 4/5), so 25
    expect(Array.from(quantizeUint8(Float32Array.from([3, -4])))).toEqual([204, 25]);
    // the ends of the range
    expect(Array.from(quantizeInt8(Float32Array.from([0, -2, 0])))).toEqual([0, -127, 0]);
    expect(Array.from(quantizeUint8(Float32Array.from([0, -2, 0])))).toEqual([128, 0, 128]); // 127.5 -> 128
    expect(Array.from(quantizeUint8(Float32Array.from([5])))).toEqual([255]);
    // the zero row: x = 0
    const zero = new Float32Array(5);
    expect(Array.from(quantizeInt8(zero))).toEqual([0, 0, 0, 0, 0]);
    expect(Array.from(quantizeUint8(zero))).toEqual([128, 128, 128, 128, 128]);
    expect(Array.from(packSignBitsSigned(zero))).toEqual([-128]);
    // a norm that is not finite (a model fault) counts as a zero row
    expect(Array.from(quantizeInt8(Float32Array.from([NaN, 1])))).toEqual([0, 0]);
    expect(Array.from(quantizeUint8(Float32Array.from([Infinity, 1])))).toEqual([128, 128]);
  });

  it('rowBytes: an int8 row as its two\'s-complement bytes, a view', () => {
    const q = Int8Array.from([-1, 0, 127, -128]);
    const bytes = rowBytes(q);
    expect(Array.from(bytes)).toEqual([255, 0, 127, 128]);
    expect(bytes.buffer).toBe(q.buffer);
    const u = Uint8Array.from([1, 2]);
    expect(rowBytes(u)).toBe(u);
  });

  it('every type is named', () => {
    expect([...EMBEDDING_TYPES]).toEqual(['float', 'int8', 'uint8', 'binary', 'ubinary']);
  });
});

// ------------------------------------------------------------------ a server

let server: Server;
let ref: PlainReference;
let tok: TextTokenizer;
let texts: string[];
/** The server's float rows for `texts` (JSON /embed), checked against the independent reference first. */
let floatRows: Float32Array[];
/** The independent reference's rows for `texts` (PlainReference: the unmodified graph on each text alone, pooled and normalised by the test). */
let refRows: Float64Array[];
let openai: OpenAI;

async function postJson(path: string, body: unknown, accept = 'application/json'): Promise<{ status: number; body: any; bytes: Uint8Array; type: string }> {
  const res = await fetch(server.url + path, { method: 'POST', headers: { 'content-type': 'application/json', accept }, body: JSON.stringify(body) });
  const bytes = new Uint8Array(await res.arrayBuffer());
  const type = res.headers.get('content-type') ?? '';
  const parsed = type.includes('msgpack') ? unpack(bytes) : JSON.parse(new TextDecoder().decode(bytes));
  return { status: res.status, body: parsed, bytes, type };
}

/** A msgpack `bin` row as the codes it carries (int8 bytes read as signed). */
function binCodes(row: unknown, type: QType): number[] {
  expect(row, 'a bin row').toBeInstanceOf(Uint8Array);
  const bytes = row as Uint8Array;
  return SIGNED.has(type) ? Array.from(new Int8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength)) : Array.from(bytes);
}

/** Checks one answer's rows (codes per row) against the reference of `rows`; counts ambiguous positions. */
function expectRows(got: ArrayLike<number>[], rows: Float32Array[], type: QType, what: string): void {
  expect(got).toHaveLength(rows.length);
  let ambiguous = 0;
  let positions = 0;
  got.forEach((g, i) => {
    ambiguous += expectCodesOf(g, rows[i]!, type, `${what} row ${i}`);
    positions += g.length;
  });
  expect(ambiguous, `${what}: positions too near a boundary to decide`).toBeLessThan(positions / 10);
}


beforeAll(async () => {
  server = await startServer(testServerConfig({ models: ['tiny-embed'], batching: { buckets: [8, 16, 32, 64] } }));
  ref = await PlainReference.open('tiny-embed');
  tok = await loadTokenizer(ref.spec.tokenizerPath);
  await server.ready;
  const rand = makeRandom('quantize server');
  texts = randomTexts(rand, vocabularyWords(ref.spec), 6, 12);
  const r = await postJson('/embed', { inputs: texts });
  expect(r.status).toBe(200);
  floatRows = (r.body as number[][]).map((row) => Float32Array.from(row));
  refRows = [];
  for (let i = 0; i < texts.length; i++) {
    const want = await ref.embedding(tok.encode(texts[i]!, { maxLength: ref.spec.maxLength, truncate: false }).ids);
    expect(maxAbsDiff(floatRows[i]!, want), `float row ${i} against the independent reference`).toBeLessThan(TOLERANCE);
    refRows.push(want);
  }
  openai = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
}, 120_000);

afterAll(async () => {
  await ref?.close();
  await server?.close();
});

describe('embedding_type on a server', () => {
  it('/embed JSON: integer lists of every type; float as before', async () => {
    for (const type of QTYPES) {
      const r = await postJson('/embed', { inputs: texts, embedding_type: type });
      expect(r.status, JSON.stringify(r.body)).toBe(200);
      for (const row of r.body as number[][]) expect(row.every((x) => Number.isInteger(x))).toBe(true);
      expectRows(r.body, floatRows, type, `/embed json ${type}`);
    }
    const f = await postJson('/embed', { inputs: texts, embedding_type: 'float' });
    expect(maxAbsDiff((f.body as number[][]).flat(), floatRows.flatMap((v) => Array.from(v)))).toBeLessThan(TOLERANCE);
  });

  it('/embed msgpack: one bin of bytes per row', async () => {
    for (const type of QTYPES) {
      const r = await postJson('/embed', { inputs: texts, embedding_type: type }, 'application/msgpack');
      expect(r.status).toBe(200);
      expect(r.type).toContain('msgpack');
      expectRows((r.body as unknown[]).map((row) => binCodes(row, type)), floatRows, type, `/embed msgpack ${type}`);
    }
  });

  it('/embed with normalize false: binary reads the signs of the unnormalised row; int8 and uint8 are refused', async () => {
    const raw = await postJson('/embed', { inputs: texts, normalize: false });
    const rawRows = (raw.body as number[][]).map((row) => Float32Array.from(row));
    expect(Math.abs(rawRows[0]![0]! / floatRows[0]![0]!)).not.toBeCloseTo(1, 3); // the rows really are unnormalised
    const bits = await postJson('/embed', { inputs: texts, normalize: false, embedding_type: 'ubinary' });
    expectRows(bits.body, rawRows, 'ubinary', '/embed normalize false ubinary');
    for (const type of ['int8', 'uint8']) {
      const r = await postJson('/embed', { inputs: texts, normalize: false, embedding_type: type });
      expect({ status: r.status, code: r.body.code }).toEqual({ status: 422, code: 'SLABSERVE_INVALID_INPUT' });
      expect(r.body.error).toContain('normalize');
    }
  });

  it('an unknown embedding_type is a 422 naming the field and the choices, on /embed, OpenAI (400, param) and /ws', async () => {
    const r = await postJson('/embed', { inputs: 'x', embedding_type: 'int4' });
    expect({ status: r.status, type: r.body.type, code: r.body.code }).toEqual({ status: 422, type: 'validation', code: 'SLABSERVE_INVALID_INPUT' });
    expect(r.body.error).toContain('embedding_type');
    expect(r.body.error).toContain('"ubinary"');
    const o = await postJson('/v1/embeddings', { input: 'x', model: 'tiny-embed', embedding_type: 'bits' });
    expect(o.status).toBe(400);
    expect(o.body.error.param).toBe('embedding_type');
    const w = await wsRequest(server.port, { id: 1, op: 'embed', inputs: 'x', embedding_type: 8 });
    expect(w.error).toMatchObject({ type: 'validation', code: 'SLABSERVE_INVALID_INPUT' });
  });

  it('the root route answers embedding_type as /embed does', async () => {
    const r = await postJson('/', { inputs: texts, embedding_type: 'binary' });
    expectRows(r.body, floatRows, 'binary', 'POST / binary');
  });

  it('OpenAI: integer lists (encoding_format float) and base64 of the bytes through the official client; bin in msgpack', async () => {
    for (const type of QTYPES) {
      const asFloat = await openai.embeddings.create({ model: 'tiny-embed', input: texts, encoding_format: 'float', embedding_type: type } as any);
      expectRows(asFloat.data.map((d) => d.embedding), floatRows, type, `openai float ${type}`);
      const asBase64 = await openai.embeddings.create({ model: 'tiny-embed', input: texts, encoding_format: 'base64', embedding_type: type } as any);
      const decoded = asBase64.data.map((d) => {
        const bytes = Buffer.from(d.embedding as unknown as string, 'base64');
        return SIGNED.has(type) ? Array.from(new Int8Array(bytes.buffer, bytes.byteOffset, bytes.length)) : Array.from(bytes);
      });
      expectRows(decoded, floatRows, type, `openai base64 ${type}`);
      const mp = await postJson('/v1/embeddings', { model: 'tiny-embed', input: texts, embedding_type: type }, 'application/msgpack');
      expect(mp.status).toBe(200);
      expectRows(mp.body.data.map((d: { embedding: unknown }) => binCodes(d.embedding, type)), floatRows, type, `openai msgpack ${type}`);
    }
  });

  it('OpenAI with dimensions 61: binary rows of 8 bytes, the last padded; int8 of the shortened, renormalised row', async () => {
    const short = await openai.embeddings.create({ model: 'tiny-embed', input: texts, encoding_format: 'float', dimensions: 61 });
    const shortRows = short.data.map((d) => Float32Array.from(d.embedding));
    expect(shortRows[0]).toHaveLength(61);
    // Each the reference row's first 61 components, renormalised (Matryoshka shortening).
    shortRows.forEach((row, i) => expect(maxAbsDiff(row, unit(refRows[i]!.subarray(0, 61))), `dimensions 61 row ${i} against the reference`).toBeLessThan(TOLERANCE));
    for (const type of QTYPES) {
      const r = await openai.embeddings.create({ model: 'tiny-embed', input: texts, encoding_format: 'float', dimensions: 61, embedding_type: type } as any);
      for (const d of r.data) expect(d.embedding).toHaveLength(type.endsWith('binary') ? 8 : 61);
      expectRows(r.data.map((d) => d.embedding), shortRows, type, `openai dimensions 61 ${type}`);
    }
  });

  it('the WebSocket op: bin rows of every type', async () => {
    for (const type of QTYPES) {
      const frame = await wsRequest(server.port, { id: `q-${type}`, op: 'embed', inputs: texts, embedding_type: type, encoding: 'f32' });
      expect(frame.id).toBe(`q-${type}`);
      expectRows((frame.result as unknown[]).map((row) => binCodes(row, type)), floatRows, type, `ws ${type}`);
    }
  });

  it("slabserve's clients: embeddingType gives Int8Array / Uint8Array rows over WebSocket, HTTP msgpack and HTTP JSON", async () => {
    const ws = await SlabClient.connect(server.url);
    try {
      const clients = [
        { name: 'ws', c: ws },
        { name: 'http msgpack', c: new SlabHttpClient(server.url) },
        { name: 'http json', c: new SlabHttpClient(server.url, { format: 'json' }) },
      ];
      for (const { name, c } of clients) {
        for (const type of QTYPES) {
          const rows = await c.embed(texts, { embeddingType: type });
          for (const row of rows) expect(row, `${name} ${type}`).toBeInstanceOf(SIGNED.has(type) ? Int8Array : Uint8Array);
          expectRows(rows, floatRows, type, `client ${name} ${type}`);
        }
        const floats = await c.embed(texts, { embeddingType: 'float' });
        expect(floats[0]).toBeInstanceOf(Float32Array);
        expect(maxAbsDiff(floats[0]!, floatRows[0]!)).toBeLessThan(TOLERANCE);
      }
    } finally {
      await ws.close();
    }
  });
});
