/**
 * A `torch.save`d state dict (pytorch_model.bin), read without Python and
 * without running any of it: the zip archive torch writes (entries stored,
 * never compressed), and its `data.pkl` unpickled by a reader that knows only
 * the opcodes and the globals a state dict needs. Any other global (a class,
 * a function: what a malicious pickle calls) is refused by name before
 * anything is built.
 *
 *   <archive>/data.pkl      the dict: name -> _rebuild_tensor_v2(storage, offset, size, stride, ...)
 *   <archive>/data/<key>    each storage's bytes (little-endian)
 */
import { closeSync, fstatSync, openSync, readSync } from 'node:fs';
import { ELEMENT_BYTES, type TensorFile, type TensorInfo } from '../../shared/model-format/safetensors.js';

/** torch's storage classes by the element type they hold (safetensors' names for them). */
const STORAGES: Record<string, string> = {
  FloatStorage: 'F32',
  HalfStorage: 'F16',
  BFloat16Storage: 'BF16',
  DoubleStorage: 'F64',
  LongStorage: 'I64',
  IntStorage: 'I32',
  ShortStorage: 'I16',
  CharStorage: 'I8',
  ByteStorage: 'U8',
  BoolStorage: 'BOOL',
};

/** The only globals a state dict's pickle may name. */
const GLOBALS = new Set([
  'collections OrderedDict',
  'torch._utils _rebuild_tensor_v2',
  'torch._utils _rebuild_parameter',
  ...Object.keys(STORAGES).map((s) => `torch ${s}`),
]);

interface ZipEntry {
  name: string;
  /** Where its bytes start in the file. */
  offset: number;
  size: number;
}

interface Storage {
  dtype: string;
  key: string;
}

interface PickledTensor {
  storage: Storage;
  storageOffset: number;
  shape: number[];
  stride: number[];
}

/** Opens `path`; throws naming the file and the reason when it is not a readable state dict. */
export function openTorchFile(path: string): TensorFile {
  const fd = openSync(path, 'r');
  try {
    const entries = readZip(fd, path);
    const pkl = [...entries.values()].find((e) => /^[^/]+\/data\.pkl$/.test(e.name));
    if (!pkl) throw new Error(`${path}: no data.pkl in the archive: not a torch.save file`);
    const root = pkl.name.slice(0, -'data.pkl'.length);
    const dict = unpickle(readAt(fd, pkl.offset, pkl.size), path);
    const tensors = stateDictOf(dict, path);
    return new TorchFile(path, fd, entries, root, tensors);
  } catch (err) {
    closeSync(fd);
    throw err;
  }
}

class TorchFile implements TensorFile {
  constructor(
    readonly path: string,
    private fd: number,
    private readonly entries: Map<string, ZipEntry>,
    private readonly root: string,
    private readonly tensors: Map<string, PickledTensor>,
  ) {}

  names(): string[] {
    return [...this.tensors.keys()];
  }

  info(name: string): TensorInfo | undefined {
    const t = this.tensors.get(name);
    return t && { dtype: t.storage.dtype, shape: t.shape };
  }

  /** The tensor's elements in row-major order, as little-endian bytes of its dtype. */
  bytes(name: string): Uint8Array {
    const t = this.tensors.get(name);
    if (!t) throw new Error(`${this.path}: no tensor ${name}`);
    const entry = this.entries.get(`${this.root}data/${t.storage.key}`);
    if (!entry) throw new Error(`${this.path}: tensor ${name}'s storage ${t.storage.key} is not in the archive`);
    const size = ELEMENT_BYTES[t.storage.dtype]!;
    const count = t.shape.reduce((a, b) => a * b, 1);
    const storage = readAt(this.fd, entry.offset, entry.size);
    const out = new Uint8Array(count * size);
    // Row-major contiguous is the common case; any stride (a saved view) is gathered element by element.
    const contiguous = t.stride.every((s, i) => s === t.shape.slice(i + 1).reduce((a, b) => a * b, 1));
    if (contiguous) {
      const start = t.storageOffset * size;
      if (start + out.length > storage.length) throw new Error(`${this.path}: tensor ${name} reaches past its storage (a truncated file?)`);
      out.set(storage.subarray(start, start + out.length));
      return out;
    }
    const index = new Array<number>(t.shape.length).fill(0);
    for (let i = 0; i < count; i++) {
      let at = t.storageOffset;
      for (let d = 0; d < index.length; d++) at += index[d]! * t.stride[d]!;
      if ((at + 1) * size > storage.length) throw new Error(`${this.path}: tensor ${name} reaches past its storage (a truncated file?)`);
      out.set(storage.subarray(at * size, (at + 1) * size), i * size);
      for (let d = index.length - 1; d >= 0; d--) {
        if (++index[d]! < t.shape[d]!) break;
        index[d] = 0;
      }
    }
    return out;
  }

  close(): void {
    if (this.fd >= 0) closeSync(this.fd);
    this.fd = -1;
  }
}

function readAt(fd: number, offset: number, size: number): Buffer {
  const out = Buffer.alloc(size);
  let got = 0;
  while (got < size) {
    const n = readSync(fd, out, got, size - got, offset + got);
    if (n === 0) break;
    got += n;
  }
  if (got < size) throw new Error(`the file ends ${size - got} bytes early (truncated?)`);
  return out;
}

/** The archive's entries by name, from its central directory (zip64 included, as torch writes for large files). */
function readZip(fd: number, path: string): Map<string, ZipEntry> {
  const fileSize = fstatSync(fd).size;
  const tailSize = Math.min(fileSize, 65_557);
  const tail = readAt(fd, fileSize - tailSize, tailSize);
  const eocd = tail.lastIndexOf(Buffer.from([0x50, 0x4b, 0x05, 0x06]));
  if (eocd < 0) {
    const legacy = fileSize >= 2 && readAt(fd, 0, 2)[0] === 0x80;
    throw new Error(`${path}: ${legacy ? 'saved in the format of torch before 1.6 (not a zip archive): load it and save it again with a newer torch, or as safetensors' : 'not a zip archive (truncated or not a torch.save file)'}`);
  }
  let count = tail.readUInt16LE(eocd + 10);
  let dirSize = tail.readUInt32LE(eocd + 12);
  let dirOffset = tail.readUInt32LE(eocd + 16);
  if (dirOffset === 0xffffffff || count === 0xffff) {
    const locator = eocd - 20;
    if (locator < 0 || tail.readUInt32LE(locator) !== 0x07064b50) throw new Error(`${path}: a zip64 archive without its locator`);
    const record = readAt(fd, Number(tail.readBigUInt64LE(locator + 8)), 56);
    count = Number(record.readBigUInt64LE(32));
    dirSize = Number(record.readBigUInt64LE(40));
    dirOffset = Number(record.readBigUInt64LE(48));
  }
  if (dirOffset + dirSize > fileSize) throw new Error(`${path}: the zip directory lies past the end of the file (truncated?)`);
  const dir = readAt(fd, dirOffset, dirSize);
  const entries = new Map<string, ZipEntry>();
  for (let at = 0, i = 0; i < count; i++) {
    if (dir.readUInt32LE(at) !== 0x02014b50) throw new Error(`${path}: a damaged zip directory`);
    const method = dir.readUInt16LE(at + 10);
    let size = dir.readUInt32LE(at + 20);
    const nameLength = dir.readUInt16LE(at + 28);
    const extraLength = dir.readUInt16LE(at + 30);
    const commentLength = dir.readUInt16LE(at + 32);
    let local = dir.readUInt32LE(at + 42);
    const name = dir.subarray(at + 46, at + 46 + nameLength).toString('utf8');
    // zip64: each of the sizes and the offset that overflowed 32 bits follows in extra field 0x0001, in this order.
    for (let e = at + 46 + nameLength; e < at + 46 + nameLength + extraLength; e += 4 + dir.readUInt16LE(e + 2)) {
      if (dir.readUInt16LE(e) !== 1) continue;
      let f = e + 4;
      const next = (): number => Number(dir.readBigUInt64LE((f += 8) - 8));
      const uncompressed = dir.readUInt32LE(at + 24) === 0xffffffff ? next() : undefined;
      const compressed = size === 0xffffffff ? next() : undefined;
      size = compressed ?? uncompressed ?? size;
      if (local === 0xffffffff) local = next();
    }
    if (method !== 0) throw new Error(`${path}: entry ${name} is compressed (method ${method}); torch.save stores its entries`);
    const header = readAt(fd, local, 30);
    if (header.readUInt32LE(0) !== 0x04034b50) throw new Error(`${path}: entry ${name}'s local header is damaged`);
    entries.set(name, { name, offset: local + 30 + header.readUInt16LE(26) + header.readUInt16LE(28), size });
    at += 46 + nameLength + extraLength + commentLength;
  }
  return entries;
}

/** What a restricted unpickler builds: plain values, the allowed globals, tensors and storages. */
type Value = null | boolean | number | bigint | string | Value[] | Map<Value, Value> | Global | Storage | PickledTensor | Reduced | { tuple: Value[] };
interface Global {
  global: string;
}
interface Reduced {
  reduced: string;
  args: Value[];
}

const MARK = Symbol('mark');

/** The pickle's value; refuses opcodes and globals a state dict never uses. */
function unpickle(data: Buffer, path: string): Value {
  const stack: (Value | typeof MARK)[] = [];
  const memo = new Map<number, Value>();
  let at = 0;
  const fail = (why: string): never => {
    throw new Error(`${path}: not a plain state dict: ${why}`);
  };
  const pop = (): Value => {
    const v = stack.pop();
    if (v === undefined || v === MARK) return fail('a malformed pickle');
    return v;
  };
  const popMark = (): Value[] => {
    const i = stack.lastIndexOf(MARK);
    if (i < 0) fail('a malformed pickle (no mark)');
    return stack.splice(i).slice(1) as Value[];
  };
  const top = (): Value => {
    const v = stack[stack.length - 1];
    if (v === undefined || v === MARK) return fail('a malformed pickle');
    return v;
  };
  const line = (): string => {
    const end = data.indexOf(0x0a, at);
    if (end < 0) fail('a malformed pickle');
    const s = data.subarray(at, end).toString('utf8');
    at = end + 1;
    return s;
  };
  const str = (n: number): string => {
    const s = data.subarray(at, at + n).toString('utf8');
    at += n;
    return s;
  };
  const setItems = (dict: Value, items: Value[]): void => {
    if (!(dict instanceof Map)) fail('items set on something not a dict');
    for (let i = 0; i + 1 < items.length; i += 2) (dict as Map<Value, Value>).set(items[i]!, items[i + 1]!);
  };
  while (at < data.length) {
    const op = data[at++]!;
    switch (op) {
      case 0x80: at++; break; // PROTO
      case 0x95: at += 8; break; // FRAME
      case 0x7d: stack.push(new Map()); break; // EMPTY_DICT
      case 0x5d: stack.push([]); break; // EMPTY_LIST
      case 0x29: stack.push({ tuple: [] }); break; // EMPTY_TUPLE
      case 0x28: stack.push(MARK); break; // MARK
      case 0x74: stack.push({ tuple: popMark() }); break; // TUPLE
      case 0x85: stack.push({ tuple: [pop()] }); break; // TUPLE1
      case 0x86: { const b = pop(); stack.push({ tuple: [pop(), b] }); break; } // TUPLE2
      case 0x87: { const c = pop(); const b = pop(); stack.push({ tuple: [pop(), b, c] }); break; } // TUPLE3
      case 0x4e: stack.push(null); break; // NONE
      case 0x88: stack.push(true); break; // NEWTRUE
      case 0x89: stack.push(false); break; // NEWFALSE
      case 0x4b: stack.push(data[at++]!); break; // BININT1
      case 0x4d: stack.push(data.readUInt16LE(at)); at += 2; break; // BININT2
      case 0x4a: stack.push(data.readInt32LE(at)); at += 4; break; // BININT
      case 0x8a: { // LONG1
        const n = data[at++]!;
        let v = 0n;
        for (let i = n - 1; i >= 0; i--) v = (v << 8n) | BigInt(data[at + i]!);
        if (n > 0 && data[at + n - 1]! & 0x80) v -= 1n << BigInt(8 * n);
        at += n;
        stack.push(Number.isSafeInteger(Number(v)) ? Number(v) : v);
        break;
      }
      case 0x47: stack.push(data.readDoubleBE(at)); at += 8; break; // BINFLOAT
      case 0x58: { const n = data.readUInt32LE(at); at += 4; stack.push(str(n)); break; } // BINUNICODE
      case 0x8c: { const n = data[at++]!; stack.push(str(n)); break; } // SHORT_BINUNICODE
      case 0x55: { const n = data[at++]!; stack.push(str(n)); break; } // SHORT_BINSTRING
      case 0x54: { const n = data.readUInt32LE(at); at += 4; stack.push(str(n)); break; } // BINSTRING
      case 0x71: memo.set(data[at++]!, top()); break; // BINPUT
      case 0x72: memo.set(data.readUInt32LE(at), top()); at += 4; break; // LONG_BINPUT
      case 0x94: memo.set(memo.size, top()); break; // MEMOIZE
      case 0x68: stack.push(memo.get(data[at++]!) ?? fail('a memo entry read before it was written')); break; // BINGET
      case 0x6a: stack.push(memo.get(data.readUInt32LE(at)) ?? fail('a memo entry read before it was written')); at += 4; break; // LONG_BINGET
      case 0x63: { // GLOBAL
        const name = `${line()} ${line()}`;
        if (!GLOBALS.has(name)) fail(`it names ${name.replace(' ', '.')}, which a state dict never does (refused: unpickling it could run code)`);
        stack.push({ global: name });
        break;
      }
      case 0x93: { // STACK_GLOBAL
        const name = pop();
        const module = pop();
        const full = `${String(module)} ${String(name)}`;
        if (!GLOBALS.has(full)) fail(`it names ${String(module)}.${String(name)}, which a state dict never does (refused: unpickling it could run code)`);
        stack.push({ global: full });
        break;
      }
      case 0x51: stack.push(storageOf(pop(), fail)); break; // BINPERSID
      case 0x52: { // REDUCE
        const args = pop();
        const fn = pop();
        stack.push(reduce(fn, args, fail));
        break;
      }
      case 0x73: { const v = pop(); const k = pop(); setItems(top(), [k, v]); break; } // SETITEM
      case 0x75: { const items = popMark(); setItems(top(), items); break; } // SETITEMS
      case 0x61: { const v = pop(); const list = top(); if (!Array.isArray(list)) fail('append to something not a list'); (list as Value[]).push(v); break; } // APPEND
      case 0x65: { const items = popMark(); const list = top(); if (!Array.isArray(list)) fail('append to something not a list'); (list as Value[]).push(...items); break; } // APPENDS
      case 0x62: pop(); break; // BUILD: a state dict's _metadata attribute, not needed
      case 0x2e: return pop(); // STOP
      default:
        fail(`opcode 0x${op.toString(16)} at byte ${at - 1}, which a state dict's pickle never holds`);
    }
  }
  return fail('the pickle has no end (truncated?)');
}

/** A persistent id: ('storage', torch.<Type>Storage, key, location, numel). */
function storageOf(pid: Value, fail: (why: string) => never): Storage {
  const t = pid && typeof pid === 'object' && 'tuple' in pid ? pid.tuple : [];
  const type = t[1];
  if (t[0] !== 'storage' || !type || typeof type !== 'object' || !('global' in type) || typeof t[2] !== 'string') return fail('a persistent id that is not a storage');
  return { dtype: STORAGES[type.global.split(' ')[1]!]!, key: t[2] };
}

function reduce(fn: Value, args: Value, fail: (why: string) => never): Value {
  if (!fn || typeof fn !== 'object' || !('global' in fn)) return fail('a call of something not a global');
  const a = args && typeof args === 'object' && 'tuple' in args ? args.tuple : fail('a call without an argument tuple');
  switch (fn.global) {
    case 'collections OrderedDict':
      return new Map();
    case 'torch._utils _rebuild_tensor_v2': {
      const [storage, offset, size, stride] = a;
      const ints = (v: Value | undefined) => (v && typeof v === 'object' && 'tuple' in v && v.tuple.every((x) => typeof x === 'number') ? (v.tuple as number[]) : fail('a tensor with a malformed size or stride'));
      if (!storage || typeof storage !== 'object' || !('key' in storage) || typeof offset !== 'number') return fail('a tensor without its storage');
      return { storage, storageOffset: offset, shape: ints(size), stride: ints(stride) };
    }
    case 'torch._utils _rebuild_parameter':
      return a[0] ?? fail('a parameter without its tensor');
    default:
      return fail(`a call of ${fn.global.replace(' ', '.')}`);
  }
}

/** The tensors of the pickled dict (a dict of name -> tensor; other entries, as a `_metadata`, are ignored). */
function stateDictOf(v: Value, path: string): Map<string, PickledTensor> {
  if (!(v instanceof Map)) throw new Error(`${path}: not a plain state dict: the pickle holds no dict`);
  const out = new Map<string, PickledTensor>();
  for (const [k, t] of v) {
    if (typeof k === 'string' && t && typeof t === 'object' && 'storage' in t) out.set(k, t);
  }
  if (out.size === 0) throw new Error(`${path}: not a plain state dict: the dict holds no tensor`);
  return out;
}
