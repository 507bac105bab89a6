/**
 * The safetensors format (huggingface/safetensors): an 8-byte little-endian
 * header length, a JSON header naming each tensor's dtype, shape and byte
 * range, then the bytes. Read here for the weights a sentence-transformers
 * module keeps beside the ONNX graph (PyLate's Dense projection:
 * 1_Dense/model.safetensors), and written by the model generator. F32 only:
 * what such a module is saved in unless converted.
 */
import { readFileSync } from 'node:fs';

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
    if (t.dtype !== 'F32') fail(`tensor ${name} is ${t.dtype}; only F32 weights are read (convert the module to float32)`);
    const [start, end] = t.data_offsets;
    const count = t.shape.reduce((a, b) => a * b, 1);
    if (end - start !== count * 4 || base + end > bytes.length) fail(`tensor ${name}'s bytes do not match its shape ${JSON.stringify(t.shape)}`);
    // Copied out: the file's buffer is not 4-byte aligned at the data.
    const data = new Float32Array(count);
    new Uint8Array(data.buffer).set(bytes.subarray(base + start, base + end));
    out.set(name, { shape: t.shape, data });
  }
  return out;
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
