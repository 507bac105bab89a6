/**
 * float32 embedding rows as JSON bytes, each number the SHORTEST decimal that
 * reads back to the same float32 (what text-embeddings-inference's
 * serde_json/ryu writes for f32), written straight into a Uint8Array.
 *
 * Why: JSON.stringify(Array.from(row)) prints each float32 as the double it
 * widens to (0.012345678918063641: ~19 bytes) and builds a string that is
 * then encoded again; this writes ~11 bytes per number with arithmetic only,
 * and faster (bench/micro/float-json.ts measures it).
 *
 * "Reads back": a client parses the JSON number into a double and rounds that
 * to float32, i.e. Math.fround(Number(s)) === v. Format: JavaScript's
 * Number#toString (plain decimal; exponent form, "1.5e-7", "3.4028235e+38",
 * when the decimal exponent is < -6 or > 20). NaN and ±Infinity are written
 * as null, as JSON.stringify does; -0 as "-0" (JSON.parse reads it as -0).
 *
 * Fast path (a = |v| normal, not a power of two, about 1e-14 <= a < 1e22):
 * with k the decimal exponent of the bottom of a's binade (a table),
 * x = a * 10^(8-k) has 9 or 10 digits before the point; w is half the float32
 * spacing at a, scaled alike. A decimal reads back to a iff it lies within w
 * of x (the interval is symmetric except at powers of two; at its ends the
 * double rounding of the parse decides, within a sliver < 2^-19). If any
 * multiple of 10^j is inside, the one nearest x is, so j (digits dropped)
 * grows while round(x / 10^j) * 10^j is inside; a multiple of 10^(j+1) is a
 * multiple of 10^j, so the first j that fails ends the search. x, w and 10^j
 * are exact doubles when 8 - k <= 12 (usual embedding magnitudes), within
 * 2^-20 otherwise; a candidate within MARGIN (2^-16) of an end, or of a tie
 * between two candidates, goes to the slow path. Round trip guaranteed: the
 * chosen n * 10^q is then checked exactly as a parser reads it (|q| <= 22, so
 * 10^|q| is an exact double and n * 10^q or n / 10^-q is one correctly rounded
 * IEEE operation, the double a correct parser makes of "n e q"):
 * Math.fround(it) must be a, else the slow path.
 *
 * Slow path (subnormals, tiny and huge magnitudes, powers of two, ambiguous
 * cases): for p = 1..9 digits, a.toExponential(p - 1) (correctly rounded)
 * and its two neighbours, each tried with Number() on its text; the first that
 * reads back is the shortest (at powers of two such as 2^-96 or 2^87 the
 * nearest fails and the neighbour on the wide side is shorter). Both paths
 * write the nearer of two candidates that read back, the upper one on an exact
 * tie (as ryu does), so the output is the true shortest, no exception.
 */

/** Most bytes writeFloat32 writes: "-123456789000000000000" or "-0.00000123456789". */
export const MAX_FLOAT32_CHARS = 22;

/** 10^0 .. 10^22, all exact doubles. */
const P10 = Float64Array.from({ length: 23 }, (_, i) => Number(`1e${i}`));
/** 10^-j (rounded): only used to pick the nearest multiple of 10^j. */
const INV10 = Float64Array.from({ length: 10 }, (_, i) => 1 / P10[i]!);
/** Candidates this close (in units of x) to the boundary or to a tie take the slow path. */
const MARGIN = 2 ** -16;

/** Per float32 exponent field: floor(log10) of the binade's bottom (-128: not a normal number), half a spacing. */
const BINADE_K = new Int32Array(256).fill(-128);
const HALF_SPACING = new Float64Array(256);
for (let f = 1; f < 255; f++) {
  const bottom = 2 ** (f - 127);
  let k = Math.floor(Math.log10(bottom));
  while (Number(`1e${k}`) > bottom) k--;
  while (Number(`1e${k + 1}`) <= bottom) k++;
  BINADE_K[f] = k;
  HALF_SPACING[f] = 2 ** (f - 151);
}

/** ASCII of the tens and of the units digit of 0..99. */
const TENS = Uint8Array.from({ length: 100 }, (_, i) => 48 + Math.floor(i / 10));
const UNITS = Uint8Array.from({ length: 100 }, (_, i) => 48 + (i % 10));

/** Writes the nd digits of the integer n (< 2^31) so that the last one is at out[end - 1]. */
function putDigits(out: Uint8Array, end: number, n: number, nd: number): void {
  for (; nd >= 2; nd -= 2) {
    const t = (n / 100) | 0;
    const r = n - t * 100;
    out[--end] = UNITS[r]!;
    out[--end] = TENS[r]!;
    n = t;
  }
  if (nd > 0) out[--end] = 48 + n;
}

/** Writes the nd digits of n with a '.' after the first `ip` (0 < ip < nd). */
function putPointed(out: Uint8Array, at: number, n: number, nd: number, ip: number): number {
  putDigits(out, at + nd + 1, n, nd);
  for (let i = 0; i < ip; i++) out[at + i] = out[at + i + 1]!;
  out[at + ip] = 46; // '.'
  return at + nd + 1;
}

/** Writes n * 10^(e - nd + 1), n with nd digits and no trailing zero, as Number#toString does. */
function putNumber(out: Uint8Array, at: number, n: number, nd: number, e: number): number {
  if (e < 0 && e >= -6) {
    out[at++] = 48; // '0'
    out[at++] = 46; // '.'
    for (let z = e + 1; z < 0; z++) out[at++] = 48;
    putDigits(out, at + nd, n, nd);
    return at + nd;
  }
  if (e < -6 || e > 20) {
    if (nd > 1) at = putPointed(out, at, n, nd, 1);
    else out[at++] = 48 + n;
    out[at++] = 101; // 'e'
    out[at++] = e < 0 ? 45 : 43; // '-' or '+'
    const ae = e < 0 ? -e : e;
    if (ae >= 10) out[at++] = TENS[ae]!;
    out[at++] = UNITS[ae]!;
    return at;
  }
  if (e + 1 < nd) return putPointed(out, at, n, nd, e + 1);
  putDigits(out, at + nd, n, nd);
  at += nd;
  for (let z = e + 1 - nd; z > 0; z--) out[at++] = 48;
  return at;
}

/** Writes the integer n (> 0) times 10^q, trailing zeros of n dropped. */
function putScaled(out: Uint8Array, at: number, n: number, q: number): number {
  for (let t = Math.floor(n / 10); t * 10 === n; t = Math.floor(n / 10)) {
    n = t;
    q++;
  }
  let nd = 1;
  while (nd < 10 && n >= P10[nd]!) nd++;
  return putNumber(out, at, n, nd, q + nd - 1);
}

/** Fast path for a = |v| > 0 with float32 bits `bits`; -1 where it does not apply. */
function writeFast(out: Uint8Array, at: number, a: number, bits: number): number {
  const field = bits >>> 23;
  const k = BINADE_K[field]!; // floor(log10 a) is k or k + 1
  if (k < -14 || k > 21 || (bits & 0x7fffff) === 0) return -1;
  const e = 8 - k;
  const p = P10[e < 0 ? -e : e]!;
  const x = e < 0 ? a / p : a * p; // 9 or 10 digits before the point
  const w = e < 0 ? HALF_SPACING[field]! / p : HALF_SPACING[field]! * p;
  const inside = w - MARGIN;
  let n = Math.floor(x + 0.5);
  let j = 0;
  for (; j < 9; j++) {
    const c = Math.floor(x * INV10[j + 1]! + 0.5);
    const d = Math.abs(c * P10[j + 1]! - x);
    if (d >= inside) {
      if (d <= w + MARGIN) return -1;
      break;
    }
    n = c;
  }
  if (Math.abs(x * INV10[j]! - n) > 0.5 - MARGIN) return -1; // (near) tie
  let q = j - e;
  if (Math.fround(q < 0 ? n / P10[-q]! : n * P10[q]!) !== a) return -1;
  // With 10 digits before the point, j >= 1 always (w >= 29), so n <= 10^9 < 2^31.
  let nd = (x >= 1e9 ? 10 : 9) - j;
  if (n === P10[nd]) {
    n = 1; // rounded up to a power of ten
    q += nd;
    nd = 1;
  } else if (n < P10[nd - 1]!) return -1;
  return putNumber(out, at, n | 0, nd, q + nd - 1);
}

/** Slow exact path for any positive finite a. */
function writeSlow(out: Uint8Array, at: number, a: number): number {
  for (let p = 1; p <= 9; p++) {
    const s = a.toExponential(p - 1); // "d.ddde±x", correctly rounded (ties up)
    const i = s.indexOf('e');
    const d = Number(s.slice(0, i).replace('.', ''));
    const q = Number(s.slice(i + 1)) - (p - 1);
    for (const n of [d, d - 1, d + 1]) {
      if (n > 0 && Math.fround(Number(`${n}e${q}`)) === a) return putScaled(out, at, n, q);
    }
  }
  throw new Error(`float-json: no 9-digit decimal reads back to ${a}`); // cannot happen
}

/** Writes the float32 with value v and bits `bits` (same float). */
function writeBits(out: Uint8Array, at: number, v: number, bits: number): number {
  if ((bits & 0x7f800000) === 0x7f800000) {
    out[at] = 110; // null
    out[at + 1] = 117;
    out[at + 2] = 108;
    out[at + 3] = 108;
    return at + 4;
  }
  if (bits >>> 31 !== 0) {
    out[at++] = 45; // '-' (-0 too)
    bits &= 0x7fffffff;
    v = -v;
  }
  if (bits === 0) {
    out[at] = 48;
    return at + 1;
  }
  const end = writeFast(out, at, v, bits);
  return end >= 0 ? end : writeSlow(out, at, v);
}

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/**
 * Writes the shortest decimal that reads back to the float32 value v (already
 * a float32, e.g. read from a Float32Array; any other number is first rounded
 * to float32) as a JSON number at out[at..]; returns the offset after it. At
 * most MAX_FLOAT32_CHARS bytes.
 */
export function writeFloat32(out: Uint8Array, at: number, v: number): number {
  F32[0] = v;
  return writeBits(out, at, F32[0]!, U32[0]!);
}

/** Writes `[a,b,...]` for one row at out[at..]; out needs row.length * (MAX_FLOAT32_CHARS + 1) + 2 bytes. */
export function float32RowJsonInto(out: Uint8Array, at: number, row: Float32Array): number {
  const bits = new Uint32Array(row.buffer, row.byteOffset, row.length);
  out[at++] = 91; // '['
  for (let i = 0; i < row.length; i++) {
    if (i > 0) out[at++] = 44; // ','
    at = writeBits(out, at, row[i]!, bits[i]!);
  }
  out[at++] = 93; // ']'
  return at;
}

/** Scratch space reused across calls (bounded: bigger answers get their own buffer). */
let scratch = new Uint8Array(1 << 14);
const SCRATCH_MAX = 1 << 20;

/** The scratch buffer if it holds `bound` bytes (grown up to SCRATCH_MAX), else a buffer of its own. */
function scratchOf(bound: number): Uint8Array {
  if (bound <= scratch.length) return scratch;
  const out = new Uint8Array(bound);
  if (bound <= SCRATCH_MAX) scratch = out;
  return out;
}

/**
 * The JSON text `[[a,b,...],[...]]` (no spaces) of the rows, as a view of a
 * scratch buffer: valid only until the next call on this thread. For a
 * writer that copies it at once (uWS's end() copies what it does not send).
 */
export function float32RowsJsonView(rows: readonly Float32Array[]): Uint8Array {
  let bound = 2;
  for (const row of rows) bound += row.length * (MAX_FLOAT32_CHARS + 1) + 3;
  const out = scratchOf(bound);
  let at = 0;
  out[at++] = 91;
  for (let r = 0; r < rows.length; r++) {
    if (r > 0) out[at++] = 44;
    at = float32RowJsonInto(out, at, rows[r]!);
  }
  out[at++] = 93;
  return out.subarray(0, at);
}

/**
 * The JSON text `[[a,b,...],[...]]` (no spaces) of the rows, as a new
 * Uint8Array of exactly its length (a copy: it stays valid after later calls).
 */
export function float32RowsJson(rows: readonly Float32Array[]): Uint8Array {
  return float32RowsJsonView(rows).slice();
}

const utf8 = new TextEncoder();

/**
 * JSON text made of `pieces` (JSON fragments) with a row between every two:
 * pieces[0] row[0] pieces[1] ... row[n-1] pieces[n]; each row as
 * float32RowJsonInto writes it. For answers whose rows sit inside objects
 * (OpenAI's `data[i].embedding`): the same float text as /embed's rows.
 */
export function float32RowsInJson(pieces: readonly string[], rows: readonly Float32Array[]): Uint8Array {
  if (pieces.length !== rows.length + 1) throw new RangeError(`${pieces.length} pieces for ${rows.length} rows: want one more piece than rows`);
  let bound = 0;
  for (const p of pieces) bound += p.length * 3; // UTF-8: at most 3 bytes a UTF-16 unit
  for (const row of rows) bound += row.length * (MAX_FLOAT32_CHARS + 1) + 2;
  const out = new Uint8Array(bound);
  let at = 0;
  for (let i = 0; i < pieces.length; i++) {
    at += utf8.encodeInto(pieces[i]!, out.subarray(at)).written;
    if (i < rows.length) at = float32RowJsonInto(out, at, rows[i]!);
  }
  return out.subarray(0, at);
}

/**
 * The JSON text `[[{"index":i,"value":v},...],...]` of sparse rows (TEI's
 * /embed_sparse answer), each value the shortest decimal of its float32.
 */
export function sparseRowsJson(rows: readonly { indices: Uint32Array; values: Float32Array }[]): Uint8Array {
  const HEAD = '{"index":';
  const MID = ',"value":';
  let bound = 2;
  for (const r of rows) bound += 3 + r.indices.length * (HEAD.length + 10 + MID.length + MAX_FLOAT32_CHARS + 2);
  const out = new Uint8Array(bound);
  let at = 0;
  out[at++] = 91;
  for (let r = 0; r < rows.length; r++) {
    if (r > 0) out[at++] = 44;
    out[at++] = 91;
    const { indices, values } = rows[r]!;
    for (let k = 0; k < indices.length; k++) {
      if (k > 0) out[at++] = 44;
      at += utf8.encodeInto(HEAD, out.subarray(at)).written;
      at += utf8.encodeInto(String(indices[k]), out.subarray(at)).written;
      at += utf8.encodeInto(MID, out.subarray(at)).written;
      at = writeFloat32(out, at, values[k]!);
      out[at++] = 125; // '}'
    }
    out[at++] = 93;
  }
  out[at++] = 93;
  return out.subarray(0, at);
}

/**
 * The JSON text `[[[a,...],...],...]` of lists of rows (TEI's /embed_all: per
 * input, per token), as a view of the scratch buffer (float32RowsJsonView's):
 * valid until the next call on this thread. A token answer is ten times a
 * pooled row's bytes; a fresh buffer each would be much of the gateway's GC.
 */
export function float32RowListsJsonView(lists: readonly (readonly Float32Array[])[]): Uint8Array {
  let bound = 2 + lists.length * 3;
  for (const rows of lists) for (const row of rows) bound += row.length * (MAX_FLOAT32_CHARS + 1) + 3;
  const out = scratchOf(bound);
  let at = 0;
  out[at++] = 91;
  for (let l = 0; l < lists.length; l++) {
    if (l > 0) out[at++] = 44;
    out[at++] = 91;
    const rows = lists[l]!;
    for (let r = 0; r < rows.length; r++) {
      if (r > 0) out[at++] = 44;
      at = float32RowJsonInto(out, at, rows[r]!);
    }
    out[at++] = 93;
  }
  out[at++] = 93;
  return out.subarray(0, at);
}

/** One input of /embed's `outputs` answer: the outputs asked for. */
export interface OutputsItem {
  dense?: Float32Array;
  sparse?: { indices: Uint32Array; values: Float32Array };
  colbert?: readonly Float32Array[];
}

/** The JSON text `[{"dense": [...], "sparse": [{index, value}], "colbert": [[...]]}, ...]`, each key where the item has it. */
export function outputsJson(items: readonly OutputsItem[]): Uint8Array {
  const parts: Uint8Array[] = [];
  const text = (s: string) => parts.push(new TextEncoder().encode(s));
  // Each writer makes a list; one item's value is that list without its outer brackets, copied out of the scratch buffer.
  const inner = (listJson: Uint8Array) => parts.push(listJson.slice(1, listJson.length - 1));
  text('[');
  items.forEach((x, i) => {
    text(i > 0 ? ',{' : '{');
    let sep = '';
    if (x.dense) {
      text(`${sep}"dense":`);
      inner(float32RowsJsonView([x.dense]));
      sep = ',';
    }
    if (x.sparse) {
      text(`${sep}"sparse":`);
      inner(sparseRowsJson([x.sparse]));
      sep = ',';
    }
    if (x.colbert) {
      text(`${sep}"colbert":`);
      inner(float32RowListsJsonView([x.colbert]));
    }
    text('}');
  });
  text(']');
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
