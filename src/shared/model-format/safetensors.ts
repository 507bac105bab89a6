/**
 * The safetensors format (huggingface/safetensors): an 8-byte little-endian
 * header length, a JSON header naming each tensor's dtype, shape and byte
 * range, then the bytes. Read here for the weights a module keeps beside the
 * ONNX graph (PyLate's Dense projection: 1_Dense/model.safetensors; BGE-M3's
 * colbert_linear and sparse_linear) and for a checkpoint's weights
 * (src/main/checkpoint/), one tensor at a time, as float32 whether stored as
 * F32, F16 or BF16; written by the model generator and the tests.
 */
import { closeSync, fstatSync, openSync, readSync } from 'node:fs';

export interface F32Tensor {
  shape: number[];
  data: Float32Array;
}

type Header = Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;

/** A tensor's element type (safetensors' names: F32, F16, BF16, I64, ...) and shape. */
export interface TensorInfo {
  dtype: string;
  shape: number[];
}

/** A file of named tensors, read one tensor at a time (a checkpoint's weights need not all be in memory at once). */
export interface TensorFile {
  readonly path: string;
  names(): string[];
  info(name: string): TensorInfo | undefined;
  /** The tensor's elements, row-major, as little-endian bytes of its dtype. */
  bytes(name: string): Uint8Array;
  close(): void;
}

/** Every tensor of the file by name, as float32; throws naming the file on a malformed file or a dtype not F32, F16 or BF16. */
export function readSafetensors(path: string): Map<string, F32Tensor> {
  const file = openSafetensors(path);
  try {
    return new Map(file.names().map((name) => [name, { shape: file.info(name)!.shape, data: floatsOf(file.bytes(name), file.info(name)!.dtype, `${path}: tensor ${name}`) }]));
  } finally {
    file.close();
  }
}

/** Each tensor's dtype and shape, from the header alone (a start-up check need not read the weights). */
export function safetensorsShapes(path: string): Map<string, TensorInfo> {
  const file = openSafetensors(path);
  file.close();
  return new Map(file.names().map((name) => [name, file.info(name)!]));
}

/** Opens `path`, reading its header; throws naming the file when the header is malformed or its ranges do not fit the file. */
export function openSafetensors(path: string): TensorFile {
  const fd = openSync(path, 'r');
  const fail = (why: string): never => {
    closeSync(fd);
    throw new Error(`${path}: ${why}`);
  };
  const size = fstatSync(fd).size;
  const head = Buffer.alloc(8);
  if (readSync(fd, head, 0, 8, 0) < 8) fail('too short for a safetensors file');
  const length = Number(head.readBigUInt64LE(0));
  if (length > 100 * 2 ** 20 || length > size - 8) fail(`a header of ${length} bytes does not fit a file of ${size} (truncated, or not a safetensors file)`);
  const json = Buffer.alloc(length);
  readSync(fd, json, 0, length, 8);
  let header: Header = {};
  try {
    header = JSON.parse(json.toString('utf8')) as Header;
  } catch (err) {
    fail(`its header is not JSON (${(err as Error).message})`);
  }
  const base = 8 + length;
  const tensors = new Map(Object.entries(header).filter(([k]) => k !== '__metadata__'));
  for (const [name, t] of tensors) {
    const [start, end] = t.data_offsets ?? [];
    const bytes = ELEMENT_BYTES[t.dtype];
    const count = Array.isArray(t.shape) ? t.shape.reduce((a, b) => a * b, 1) : NaN;
    if (bytes !== undefined && (end! - start! !== count * bytes)) fail(`tensor ${name}'s bytes do not match its shape ${JSON.stringify(t.shape)}`);
    if (!(start! >= 0 && end! >= start! && base + end! <= size)) fail(`tensor ${name}'s bytes lie past the end of the file (truncated?)`);
  }
  let open = true;
  return {
    path,
    names: () => [...tensors.keys()],
    info: (name) => {
      const t = tensors.get(name);
      return t && { dtype: t.dtype, shape: t.shape };
    },
    bytes: (name) => {
      const t = tensors.get(name);
      if (!t) throw new Error(`${path}: no tensor ${name}`);
      if (!open) throw new Error(`${path}: closed`);
      const [start, end] = t.data_offsets;
      const out = Buffer.alloc(end - start);
      readSync(fd, out, 0, out.length, base + start);
      return out;
    },
    close: () => {
      if (open) closeSync(fd);
      open = false;
    },
  };
}

/** Bytes per element of each dtype a checkpoint may hold. */
export const ELEMENT_BYTES: Readonly<Record<string, number>> = { F64: 8, F32: 4, F16: 2, BF16: 2, I64: 8, I32: 4, I16: 2, I8: 1, U8: 1, BOOL: 1 };

/** float16's 65,536 values as float32, made once. */
let halfTable: Float32Array | undefined;

/** A tensor's little-endian F32, F16 or BF16 bytes as float32 (copied: the bytes need not be aligned); `what` names it in the error for any other dtype. */
export function floatsOf(raw: Uint8Array, dtype: string, what: string): Float32Array {
  const count = raw.byteLength / (ELEMENT_BYTES[dtype] ?? 1);
  const data = new Float32Array(count);
  if (dtype === 'F32') {
    new Uint8Array(data.buffer).set(raw);
    return data;
  }
  if (dtype !== 'F16' && dtype !== 'BF16') throw new Error(`${what} is ${dtype}; F32, F16 and BF16 weights are read`);
  const halves = new Uint16Array(count);
  new Uint8Array(halves.buffer).set(raw);
  if (dtype === 'BF16') {
    // bfloat16 is float32's top half.
    const bits = new Uint32Array(data.buffer);
    for (let i = 0; i < count; i++) bits[i] = halves[i]! << 16;
    return data;
  }
  halfTable ??= Float32Array.from({ length: 65_536 }, (_, h) => halfToFloat(h));
  for (let i = 0; i < count; i++) data[i] = halfTable[halves[i]!]!;
  return data;
}

/** IEEE 754 half precision to a number (subnormals, infinities and NaN included). */
function halfToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 0x1f) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/** A safetensors file of the tensors in the order given, stored as `dtype` (F16 and BF16 rounded to nearest even). */
export function encodeSafetensors(tensors: Record<string, F32Tensor>, dtype: 'F32' | 'F16' | 'BF16' = 'F32'): Uint8Array {
  const header: Header = {};
  const size = ELEMENT_BYTES[dtype]!;
  let at = 0;
  for (const [name, t] of Object.entries(tensors)) {
    header[name] = { dtype, shape: t.shape, data_offsets: [at, at + t.data.length * size] };
    at += t.data.length * size;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - ((8 + json.length) % 8)) % 8); // the data 8-byte aligned, as the reference writer pads
  const out = new Uint8Array(8 + json.length + at);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(new TextEncoder().encode(json), 8);
  let offset = 8 + json.length;
  for (const t of Object.values(tensors)) {
    const bytes = dtype === 'F32' ? new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength) : new Uint8Array((dtype === 'F16' ? halvesOf(t.data) : Uint16Array.from(t.data, floatToBfloat)).buffer);
    out.set(bytes, offset);
    offset += bytes.byteLength;
  }
  return out;
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** float32 to bfloat16's bits, rounded to nearest even. */
function floatToBfloat(x: number): number {
  f32[0] = x;
  const b = u32[0]!;
  return ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
}

/** Each float as float16's bits (floatToHalf), in a loop: Uint16Array.from with a mapping function is ten times slower. */
export function halvesOf(floats: Float32Array): Uint16Array {
  const out = new Uint16Array(floats.length);
  for (let i = 0; i < floats.length; i++) out[i] = floatToHalf(floats[i]!);
  return out;
}

/** A number to float16's bits, rounded to nearest even (overflow to infinity, underflow through subnormals). */
export function floatToHalf(x: number): number {
  f32[0] = x;
  const b = u32[0]!;
  const sign = (b >>> 16) & 0x8000;
  const exp = (b >>> 23) & 0xff;
  let mant = b & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    const half = mant >>> shift;
    const rest = mant & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    return sign | (half + (rest > mid || (rest === mid && half & 1) ? 1 : 0));
  }
  let half = (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && half & 1)) half++;
  return sign | half;
}
