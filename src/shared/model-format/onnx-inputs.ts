/**
 * The input names of an ONNX graph, read from the file without decoding it:
 * a protobuf walk that steps over every field but ModelProto.graph and
 * GraphProto.input, so the weights (GraphProto.initializer, most of a file's
 * bytes) are never read. Start-up uses it to check a model's interface and to
 * report its real inputs (/info, KServe metadata) before the inference thread
 * has opened anything: a 400 MB model costs a few small reads.
 */
import { closeSync, fstatSync, openSync, readSync } from 'node:fs';

const MODEL_GRAPH = 7; // ModelProto.graph
const GRAPH_INPUT = 11; // GraphProto.input (ValueInfoProto)
const VALUE_INFO_NAME = 1; // ValueInfoProto.name

/** Protobuf wire types. */
const VARINT = 0;
const I64 = 1;
const LEN = 2;
const I32 = 5;

/** A varint in `buf` at `at`: its value and the index after it. */
function varintAt(buf: Uint8Array, at: number, end = buf.length): [value: number, next: number] {
  let value = 0;
  for (let i = 0; at + i < end && i < 10; i++) {
    const b = buf[at + i]!;
    value += (b & 0x7f) * 2 ** (7 * i);
    if (b < 0x80) return [value, at + i + 1];
  }
  throw new Error('a truncated or corrupt protobuf varint: not an ONNX model');
}

/** Reads a file at positions, a few bytes at a time. */
class FileBytes {
  private readonly scratch = Buffer.alloc(10);
  constructor(
    private readonly fd: number,
    readonly size: number,
  ) {}

  /** A varint at `pos`: its value and the position after it. */
  varint(pos: number): [value: number, next: number] {
    const n = readSync(this.fd, this.scratch, 0, Math.min(10, this.size - pos), pos);
    const [value, next] = varintAt(this.scratch, 0, n);
    return [value, pos + next];
  }

  bytes(pos: number, length: number): Buffer {
    const out = Buffer.alloc(length);
    if (readSync(this.fd, out, 0, length, pos) !== length) throw new Error('the file ends inside a field');
    return out;
  }
}

/** Calls `onField(field, start, length)` for each length-delimited field in [pos, end); steps over the others. */
function eachLenField(src: FileBytes, pos: number, end: number, onField: (field: number, start: number, length: number) => void): void {
  while (pos < end) {
    const [key, afterKey] = src.varint(pos);
    const field = Math.floor(key / 8);
    const wire = key % 8;
    if (wire === VARINT) pos = src.varint(afterKey)[1];
    else if (wire === I64) pos = afterKey + 8;
    else if (wire === I32) pos = afterKey + 4;
    else if (wire === LEN) {
      const [length, start] = src.varint(afterKey);
      onField(field, start, length);
      pos = start + length;
    } else throw new Error(`an unknown protobuf wire type ${wire}: not an ONNX model`);
  }
  if (pos !== end) throw new Error('a field runs past its message: not an ONNX model');
}

/** The names of the graph's inputs, in order (older exports also list their initializers there). */
export function onnxInputNames(path: string): string[] {
  const fd = openSync(path, 'r');
  try {
    const src = new FileBytes(fd, fstatSync(fd).size);
    const names: string[] = [];
    let graphs = 0;
    eachLenField(src, 0, src.size, (field, start, length) => {
      if (field !== MODEL_GRAPH) return;
      graphs++;
      eachLenField(src, start, start + length, (gField, gStart, gLength) => {
        if (gField !== GRAPH_INPUT) return;
        const info = src.bytes(gStart, gLength);
        let name = '';
        // ValueInfoProto is small, and its fields all length-delimited: walk it in memory.
        for (let at = 0; at < info.length; ) {
          const [key, afterKey] = varintAt(info, at);
          if (key % 8 !== LEN) break;
          const [len, start] = varintAt(info, afterKey);
          if (Math.floor(key / 8) === VALUE_INFO_NAME) name = info.toString('utf8', start, start + len);
          at = start + len;
        }
        names.push(name);
      });
    });
    if (graphs === 0) throw new Error('no graph in the file: not an ONNX model');
    return names;
  } finally {
    closeSync(fd);
  }
}
