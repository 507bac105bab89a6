/**
 * Quantized embeddings, for vector databases that store int8 or binary
 * vectors: `embedding_type` on /embed, OpenAI's /v1/embeddings (an extension
 * field) and the WebSocket API. Cohere's names; the exact definitions, for a
 * row v of d float32 components as the float answer would give it:
 *
 *   float    v as it is.
 *   int8     x = v / ||v||2, in float64 (the square root of the squares summed
 *            in component order; a zero row, or one whose norm is not finite,
 *            a NaN or infinity in it, gives x = 0), then
 *            q_i = clamp(round(x_i * 127), -127, 127):
 *            [-1, 1] onto [-127, 127], symmetric (q(-x) = -q(x)); -128 never
 *            occurs. d bytes (Int8Array).
 *   uint8    the same x, q_i = clamp(round((x_i + 1) * 127.5), 0, 255):
 *            [-1, 1] onto [0, 255]; x = 0 gives 128. d bytes (Uint8Array).
 *   ubinary  one bit per component, set where v_i > 0 (0, -0 and NaN give 0),
 *            packed 8 to a byte, the first component in the most significant
 *            bit (numpy's packbits, bitorder "big"); when d is not a multiple
 *            of 8 the last byte's low bits are 0. ceil(d / 8) bytes
 *            (Uint8Array): sentence-transformers' quantize_embeddings
 *            "ubinary", np.packbits(v > 0).
 *   binary   the ubinary byte b as the int8 b - 128 (Int8Array):
 *            quantize_embeddings' "binary", np.packbits(v > 0) - 128.
 *
 * `round` is round half away from zero (2.5 -> 3, -2.5 -> -3) in float64.
 * sentence-transformers computes its int8/uint8 from per-dimension ranges of
 * a calibration set; there is none at serving time, so the fixed range
 * [-1, 1] of a unit vector is used instead.
 *
 * Pure: no I/O, no dependency; every dialect answers from these functions.
 */

/** Every `embedding_type`, Cohere's names. */
export const EMBEDDING_TYPES = ['float', 'int8', 'uint8', 'binary', 'ubinary'] as const;
export type EmbeddingType = (typeof EMBEDDING_TYPES)[number];
export type QuantizedType = Exclude<EmbeddingType, 'float'>;
/** A quantized row: int8 and binary signed, uint8 and ubinary unsigned. */
export type QuantizedRow = Int8Array | Uint8Array;

export function isEmbeddingType(x: unknown): x is EmbeddingType {
  return typeof x === 'string' && (EMBEDDING_TYPES as readonly string[]).includes(x);
}

/** Whether a type's values scale the L2-normalised row (int8, uint8) rather than read signs (binary, ubinary). */
export function scalesTheUnitRow(type: QuantizedType): boolean {
  return type === 'int8' || type === 'uint8';
}

/** Bytes of one quantized row of `dim` components. */
export function quantizedBytes(type: QuantizedType, dim: number): number {
  return scalesTheUnitRow(type) ? dim : Math.ceil(dim / 8);
}

/** Round half away from zero. */
function roundHalfAway(s: number): number {
  return s < 0 ? -Math.round(-s) : Math.round(s);
}

function clamp(q: number, lo: number, hi: number): number {
  return q < lo ? lo : q > hi ? hi : q;
}

/** x = v / ||v||2, in float64 (squares summed in order); x = 0 where the norm is 0 or not finite. */
export function unitRow(v: Float32Array): Float64Array {
  let sum = 0;
  for (let i = 0; i < v.length; i++) sum += v[i]! * v[i]!;
  const norm = Math.sqrt(sum);
  const x = new Float64Array(v.length);
  if (norm > 0 && norm < Infinity) for (let i = 0; i < v.length; i++) x[i] = v[i]! / norm;
  return x;
}

/** int8: round(x * 127) of the unit row, clamped to [-127, 127]. */
export function quantizeInt8(v: Float32Array): Int8Array {
  const x = unitRow(v);
  const out = new Int8Array(v.length);
  for (let i = 0; i < v.length; i++) out[i] = clamp(roundHalfAway(x[i]! * 127), -127, 127);
  return out;
}

/** uint8: round((x + 1) * 127.5) of the unit row, clamped to [0, 255]. */
export function quantizeUint8(v: Float32Array): Uint8Array {
  const x = unitRow(v);
  const out = new Uint8Array(v.length);
  for (let i = 0; i < v.length; i++) out[i] = clamp(roundHalfAway((x[i]! + 1) * 127.5), 0, 255);
  return out;
}

/** ubinary: the bits v_i > 0, most significant first, 8 to a byte (np.packbits). */
export function packSignBits(v: Float32Array): Uint8Array {
  const out = new Uint8Array(Math.ceil(v.length / 8));
  for (let i = 0; i < v.length; i++) if (v[i]! > 0) out[i >> 3]! |= 0x80 >> (i & 7);
  return out;
}

/** binary: each ubinary byte b as b - 128. */
export function packSignBitsSigned(v: Float32Array): Int8Array {
  const packed = packSignBits(v);
  const out = new Int8Array(packed.length);
  for (let i = 0; i < packed.length; i++) out[i] = packed[i]! - 128;
  return out;
}

/** One row as `type` says. */
export function quantizeRow(v: Float32Array, type: QuantizedType): QuantizedRow {
  switch (type) {
    case 'int8':
      return quantizeInt8(v);
    case 'uint8':
      return quantizeUint8(v);
    case 'binary':
      return packSignBitsSigned(v);
    case 'ubinary':
      return packSignBits(v);
  }
}

/** A quantized row's bytes (a view: an int8 row's two's-complement bytes), as msgpack `bin` and base64 carry it. */
export function rowBytes(q: QuantizedRow): Uint8Array {
  return q instanceof Uint8Array ? q : new Uint8Array(q.buffer, q.byteOffset, q.byteLength);
}
