/**
 * The safetensors format (huggingface/safetensors): an 8-byte little-endian
 * header length, a JSON header naming each tensor's dtype, shape and byte
 * range, then the bytes. Read here for the weights a module keeps beside the
 * ONNX graph (PyLate's Dense projection: 1_Dense/model.safetensors; BGE-M3's
 * colbert_linear and sparse_linear), as float32 whether stored as F32, F16 or
 * BF16; written (F32) by the model generator.
 */
import { closeSync, openSync, readFileSync, readSync } from 'node:fs';

export interface F32Tensor {
  shape: number[];
  data: Float32Array;
}

type Header = Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;

/** Every tensor of the file by name; throws naming the file on anything but F32 tensors in a well-formed file. */
export function readSafetensors(path: string): Map<string, F32Tensor> {
  const bytes = readFileSync(path);
  const fail = (why: string): never => {
    throw new Error(`${path}: ${why}`);
  };
  if (bytes.length < 8) fail('too short for a safetensors file');
  const headerLength = Number(bytes.readBigUInt64LE(0));
  if (headerLength > bytes.length - 8) fail('its header is longer than the file');
  let header: Header;
  try {
    header = JSON.parse(bytes.subarray(8, 8 + headerLength).toString('utf8')) as Header;
  } catch (err) {
    return fail(`its header is not JSON (${(err as Error).message})`);
  }
  const base = 8 + headerLength;
  const out = new Map<string, F32Tensor>();
  for (const [name, t] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const size = ELEMENT_BYTES[t.dtype];
    if (size === undefined) fail(`tensor ${name} is ${t.dtype}; F32, F16 and BF16 weights are read`);
    const [start, end] = t.data_offsets;
    const count = t.shape.reduce((a, b) => a * b, 1);
    if (end - start !== count * size! || base + end > bytes.length) fail(`tensor ${name}'s bytes do not match its shape ${JSON.stringify(t.shape)}`);
    out.set(name, { shape: t.shape, data: toFloat32(bytes.subarray(base + start, base + end), t.dtype, count) });
  }
  return out;
}

/** Each tensor's dtype and shape, from the header alone (a start-up check need not read the weights). */
export function safetensorsShapes(path: string): Map<string, { dtype: string; shape: number[] }> {
  const fd = openSync(path, 'r');
  try {
    const head = Buffer.alloc(8);
    if (readSync(fd, head, 0, 8, 0) < 8) throw new Error(`${path}: too short for a safetensors file`);
    const length = Number(head.readBigUInt64LE(0));
    if (length > 100 * 2 ** 20) throw new Error(`${path}: a header of ${length} bytes is not a safetensors header`);
    const json = Buffer.alloc(length);
    readSync(fd, json, 0, length, 8);
    let header: Header;
    try {
      header = JSON.parse(json.toString('utf8')) as Header;
    } catch (err) {
      throw new Error(`${path}: its header is not JSON (${(err as Error).message})`);
    }
    return new Map(Object.entries(header).filter(([k]) => k !== '__metadata__').map(([k, t]) => [k, { dtype: t.dtype, shape: t.shape }]));
  } finally {
    closeSync(fd);
  }
}

const ELEMENT_BYTES: Record<string, number> = { F32: 4, F16: 2, BF16: 2 };

/** A tensor's little-endian bytes as float32 (copied out: the file's buffer is not aligned at the data). */
function toFloat32(raw: Uint8Array, dtype: string, count: number): Float32Array {
  const data = new Float32Array(count);
  if (dtype === 'F32') {
    new Uint8Array(data.buffer).set(raw);
    return data;
  }
  const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  const bits = new Uint32Array(1);
  const asFloat = new Float32Array(bits.buffer);
  for (let i = 0; i < count; i++) {
    const h = view.getUint16(i * 2, true);
    if (dtype === 'BF16') {
      bits[0] = h << 16; // bfloat16 is float32's top half
      data[i] = asFloat[0]!;
    } else {
      data[i] = halfToFloat(h);
    }
  }
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

/** A safetensors file of F32 tensors, in the order given. */
export function encodeSafetensors(tensors: Record<string, F32Tensor>): Uint8Array {
  const header: Header = {};
  let at = 0;
  for (const [name, t] of Object.entries(tensors)) {
    header[name] = { dtype: 'F32', shape: t.shape, data_offsets: [at, at + t.data.byteLength] };
    at += t.data.byteLength;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - ((8 + json.length) % 8)) % 8); // the data 8-byte aligned, as the reference writer pads
  const out = new Uint8Array(8 + json.length + at);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(new TextEncoder().encode(json), 8);
  let offset = 8 + json.length;
  for (const t of Object.values(tensors)) {
    out.set(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength), offset);
    offset += t.data.byteLength;
  }
  return out;
}
