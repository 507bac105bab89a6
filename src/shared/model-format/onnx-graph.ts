/**
 * A small ONNX graph builder over onnx-proto (protobufjs static code for the
 * ONNX schema, onnx v1.10 / IR 8).
 *
 * It is deliberately thin: it knows how to declare typed graph inputs/outputs,
 * add initializers (stored as little-endian `raw_data`, so float bytes are
 * exact and encoding is a memcpy), add nodes with auto-generated unique names,
 * and wrap a model into a ModelProto. It does no shape inference and no
 * validation of operator semantics; onnxruntime does that when it loads the
 * model.
 *
 * Import note: onnx-proto is a CommonJS module that sets
 * `module.exports = { onnx }`; Node's ESM loader cannot see a named `onnx`
 * export in it, so it must be reached through the default import
 * (`import onnxProto from 'onnx-proto'; ... onnxProto.onnx`).
 * Other modules should simply `import { onnx } from './onnx-graph.js'`.
 *
 * Naming: node names and auto-generated output names follow the torch.onnx
 * exporter's convention (`/encoder/layer.0/attention/self/MatMul` and
 * `/encoder/layer.0/attention/self/MatMul_output_0`), scoped by
 * {@link GraphBuilder.scoped}. Outside any scope names are `/MatMul`, ... and
 * a numeric suffix (`_1`, `_2`, ...) keeps them unique.
 */
import { closeSync, openSync, writeSync } from 'node:fs';
import { basename } from 'node:path';
import onnxProto from 'onnx-proto';
import { halvesOf } from './safetensors.js';

/**
 * The protobufjs `onnx` namespace, as a value (`onnx.ModelProto.decode`) and
 * as a type namespace (`onnx.IGraphProto`). The import-alias form keeps both
 * meanings; a plain `const { onnx } = onnxProto` would lose the types.
 * Emitted JS: `export var onnx = onnxProto.onnx;`.
 */
export import onnx = onnxProto.onnx;

/** onnxruntime's contrib operators' domain. */
export const MS_DOMAIN = 'com.microsoft';

export type ElemType = 'float' | 'float16' | 'int64' | 'int32' | 'bool';

/** ONNX TensorProto.DataType codes for the element types we use. */
export const ELEM_TYPE_CODE: Readonly<Record<ElemType, number>> = {
  float: onnx.TensorProto.DataType.FLOAT, // 1
  float16: onnx.TensorProto.DataType.FLOAT16, // 10
  int32: onnx.TensorProto.DataType.INT32, // 6
  int64: onnx.TensorProto.DataType.INT64, // 7
  bool: onnx.TensorProto.DataType.BOOL, // 9
};

/**
 * An attribute value for {@link GraphBuilder.node}.
 *
 * Plain values are typed by their JS form:
 * - integer `number` -> INT, non-integer `number` -> FLOAT
 * - `bigint` -> INT (for int64 values beyond 2^53, e.g. INT64_MAX in Slice)
 * - `number[]` -> INTS when every element is an integer (and for `[]`), else FLOATS
 * - `string` -> STRING (UTF-8)
 *
 * Escape hatches, for when the JS form is ambiguous:
 * - `{ f: 1 }` -> FLOAT even though 1 is integral (epsilon=1, alpha=1.0, ...)
 * - `{ floats: [1, 2] }` -> FLOATS even though every element is integral
 * - `{ ints: [...] }` -> INTS explicitly (numbers or bigints)
 * - `{ t: tensor }` -> TENSOR (e.g. the `value` of a Constant node)
 */
export type AttrValue =
  | number
  | bigint
  | number[]
  | string
  | { f: number }
  | { floats: number[] }
  | { ints: (number | bigint)[] }
  | { t: onnx.ITensorProto };

export type Attrs = Record<string, AttrValue>;

/** int64 fields in protobufjs take number | Long; a `{low, high}` pair is what Long is at runtime. */
type Int64 = number;
function int64(v: number | bigint): Int64 {
  if (typeof v === 'number') {
    if (!Number.isSafeInteger(v)) throw new RangeError(`int64 value ${v} is not a safe integer; pass a bigint`);
    return v;
  }
  const n = BigInt.asIntN(64, v);
  if (n !== v) throw new RangeError(`int64 value ${v} out of range`);
  if (n >= BigInt(Number.MIN_SAFE_INTEGER) && n <= BigInt(Number.MAX_SAFE_INTEGER)) return Number(n);
  // protobufjs' LongBits.from accepts any {low, high} object (what a long.js Long is).
  const low = Number(BigInt.asIntN(32, n));
  const high = Number(BigInt.asIntN(32, n >> 32n));
  return { low, high, unsigned: false } as unknown as Int64;
}

const utf8 = new TextEncoder();

function makeAttribute(name: string, value: AttrValue): onnx.IAttributeProto {
  const T = onnx.AttributeProto.AttributeType;
  if (typeof value === 'number') {
    if (!Number.isFinite(value) || !Number.isInteger(value)) return { name, type: T.FLOAT, f: value };
    return { name, type: T.INT, i: int64(value) };
  }
  if (typeof value === 'bigint') return { name, type: T.INT, i: int64(value) };
  if (typeof value === 'string') return { name, type: T.STRING, s: utf8.encode(value) };
  if (Array.isArray(value)) {
    if (value.every((x) => Number.isInteger(x))) return { name, type: T.INTS, ints: value.map(int64) };
    return { name, type: T.FLOATS, floats: value.slice() };
  }
  if ('f' in value) return { name, type: T.FLOAT, f: value.f };
  if ('floats' in value) return { name, type: T.FLOATS, floats: value.floats.slice() };
  if ('ints' in value) return { name, type: T.INTS, ints: value.ints.map(int64) };
  if ('t' in value) return { name, type: T.TENSOR, t: value.t };
  throw new TypeError(`unsupported attribute value for "${name}"`);
}

function valueInfo(name: string, elem: ElemType, dims: (number | string)[]): onnx.IValueInfoProto {
  return {
    name,
    type: {
      tensorType: {
        elemType: ELEM_TYPE_CODE[elem],
        shape: {
          dim: dims.map((d) => (typeof d === 'number' ? { dimValue: int64(d) } : { dimParam: d })),
        },
      },
    },
  };
}

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** Little-endian bytes of a typed array; a zero-copy view on little-endian hosts. */
function rawBytes(data: Float32Array | BigInt64Array | Uint16Array): Uint8Array {
  if (LITTLE_ENDIAN) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  const out = new Uint8Array(data.byteLength);
  const dv = new DataView(out.buffer);
  if (data instanceof Float32Array) data.forEach((x, i) => dv.setFloat32(i * 4, x, true));
  else if (data instanceof Uint16Array) data.forEach((x, i) => dv.setUint16(i * 2, x, true));
  else data.forEach((x, i) => dv.setBigInt64(i * 8, x, true));
  return out;
}

/**
 * Builds a tensor proto (raw_data, little-endian). Used for initializers and
 * for Constant-node `value` attributes. The typed array is referenced, not
 * copied: don't mutate it afterwards.
 */
export function makeTensor(
  name: string,
  elem: 'float' | 'float16' | 'int64',
  data: Float32Array | BigInt64Array | number[],
  dims: number[],
): onnx.ITensorProto {
  let arr: Float32Array | BigInt64Array | Uint16Array;
  if (elem === 'float' || elem === 'float16') {
    if (data instanceof BigInt64Array) throw new TypeError(`tensor "${name}": float data given as BigInt64Array`);
    const floats = data instanceof Float32Array ? data : Float32Array.from(data);
    arr = elem === 'float' ? floats : halvesOf(floats);
  } else {
    if (data instanceof Float32Array) throw new TypeError(`tensor "${name}": int64 data given as Float32Array`);
    if (data instanceof BigInt64Array) arr = data;
    else {
      arr = new BigInt64Array(data.length);
      data.forEach((x, i) => {
        if (!Number.isSafeInteger(x)) throw new RangeError(`tensor "${name}": ${x} is not an integer`);
        arr[i] = BigInt(x);
      });
    }
  }
  const count = dims.reduce((a, b) => a * b, 1);
  if (count !== arr.length) {
    throw new RangeError(`tensor "${name}": dims [${dims.join(', ')}] need ${count} elements, got ${arr.length}`);
  }
  return { name, dataType: ELEM_TYPE_CODE[elem], dims: dims.map(int64), rawData: rawBytes(arr) };
}

export class GraphBuilder {
  private g: onnx.IGraphProto & {
    node: onnx.INodeProto[];
    input: onnx.IValueInfoProto[];
    output: onnx.IValueInfoProto[];
    initializer: onnx.ITensorProto[];
  };
  /** Every tensor and node name in the graph, to keep generated names unique. */
  private readonly used = new Set<string>();
  private readonly prefixes: string[] = [];

  constructor(name: string) {
    this.g = { name, node: [], input: [], output: [], initializer: [] };
  }

  /**
   * Extends an existing graph (e.g. `decodeModel(bytes).graph`) in place:
   * everything added through the returned builder is appended to `graph`'s
   * own arrays, and generated names avoid every name already in it.
   */
  static wrap(graph: onnx.IGraphProto): GraphBuilder {
    const b = new GraphBuilder(graph.name ?? 'graph');
    graph.node ??= [];
    graph.input ??= [];
    graph.output ??= [];
    graph.initializer ??= [];
    // Work on the caller's object (its arrays are now all set), so additions land in it.
    b.g = graph as GraphBuilder['g'];
    for (const vi of [...b.g.input, ...b.g.output, ...(graph.valueInfo ?? [])]) if (vi.name) b.used.add(vi.name);
    for (const t of b.g.initializer) if (t.name) b.used.add(t.name);
    for (const n of b.g.node) {
      if (n.name) b.used.add(n.name);
      for (const o of n.output ?? []) b.used.add(o);
    }
    return b;
  }

  /** Declares a graph input. `dims` entries are fixed sizes or symbolic names ('batch_size'). */
  addInput(name: string, elem: ElemType, dims: (number | string)[]): string {
    this.claim(name);
    this.g.input.push(valueInfo(name, elem, dims));
    return name;
  }

  /** Declares `name` (an existing tensor) as a graph output. */
  addOutput(name: string, elem: ElemType, dims: (number | string)[]): string {
    if (this.g.output.some((o) => o.name === name)) throw new Error(`"${name}" is already a graph output`);
    this.used.add(name);
    this.g.output.push(valueInfo(name, elem, dims));
    return name;
  }

  /** Drops a graph output; the node producing it stays (onnxruntime prunes dead nodes). */
  removeOutput(name: string): void {
    const i = this.g.output.findIndex((o) => o.name === name);
    if (i < 0) throw new Error(`"${name}" is not a graph output`);
    this.g.output.splice(i, 1);
  }

  outputNames(): string[] {
    return this.g.output.map((o) => o.name ?? '');
  }

  /**
   * Adds a constant tensor. `dims: []` makes a scalar. Float data is stored
   * as raw little-endian bytes; a Float32Array/BigInt64Array is referenced,
   * not copied (don't mutate it afterwards).
   */
  addInitializer(
    name: string,
    elem: 'float' | 'float16' | 'int64',
    data: Float32Array | BigInt64Array | number[],
    dims: number[],
  ): string {
    this.claim(name);
    this.g.initializer.push(makeTensor(name, elem, data, dims));
    return name;
  }

  /**
   * Adds a node; returns its output names (auto-generated unique names
   * unless `outputs` is given). `outputs` may be an array of explicit names
   * or a count of outputs to generate (default 1). Use '' in `inputs` for an
   * omitted optional input.
   */
  node(opType: string, inputs: string[], attrs?: Attrs, outputs?: string[] | number, domain?: string): string[] {
    const nodeName = this.unique(`${this.prefix()}/${opType}`);
    let outs: string[];
    if (Array.isArray(outputs)) {
      for (const o of outputs) if (o !== '') this.claim(o); // '': an optional output left out
      outs = outputs;
    } else {
      const count = outputs ?? 1;
      outs = [];
      for (let i = 0; i < count; i++) outs.push(this.unique(`${nodeName}_output_${i}`));
    }
    const node: onnx.INodeProto = { name: nodeName, opType, input: inputs.slice(), output: outs, ...(domain ? { domain } : {}) };
    const attrNames = attrs ? Object.keys(attrs) : [];
    if (attrNames.length > 0) node.attribute = attrNames.map((k) => makeAttribute(k, attrs![k]!));
    this.g.node.push(node);
    return outs;
  }

  /** Convenience: one-output node, returns that output's name. */
  op(opType: string, inputs: string[], attrs?: Attrs): string {
    return this.node(opType, inputs, attrs, 1)[0]!;
  }

  /** One-output node of onnxruntime's contrib ops (com.microsoft: Attention, SkipLayerNormalization, ...). */
  msOp(opType: string, inputs: string[], attrs?: Attrs): string {
    return this.node(opType, inputs, attrs, 1, MS_DOMAIN)[0]!;
  }

  /**
   * Runs `fn` with `scope` appended to the node-name prefix, so nodes come
   * out as `/encoder/layer.0/attention/MatMul` like a torch.onnx export.
   */
  scoped<T>(scope: string, fn: () => T): T {
    this.prefixes.push(scope.replace(/^\/+|\/+$/g, ''));
    try {
      return fn();
    } finally {
      this.prefixes.pop();
    }
  }

  /** Whether a tensor or node of this name exists already. */
  has(name: string): boolean {
    return this.used.has(name);
  }

  graph(): onnx.IGraphProto {
    return this.g;
  }

  private prefix(): string {
    return this.prefixes.length ? '/' + this.prefixes.join('/') : '';
  }

  private claim(name: string): void {
    if (!name) throw new Error('tensor names must be non-empty');
    if (this.used.has(name)) throw new Error(`name "${name}" is already used in graph "${this.g.name}"`);
    this.used.add(name);
  }

  private unique(base: string): string {
    let name = base;
    for (let i = 1; this.used.has(name); i++) name = `${base}_${i}`;
    this.used.add(name);
    return name;
  }
}

export interface ModelOptions {
  /** Default opset of the ai.onnx domain: 17 (LayerNormalization needs >= 17). */
  opset?: number;
  /** Default 8 (ONNX 1.12, the IR that shipped with opset 17). */
  irVersion?: number;
  /** producer_name; default 'slabserve-modelgen'. */
  producer?: string;
  docString?: string;
  /** metadata_props key/value pairs. */
  metadata?: Record<string, string>;
}

export function makeModel(graph: onnx.IGraphProto, opts: ModelOptions = {}): onnx.IModelProto {
  const model: onnx.IModelProto = {
    irVersion: opts.irVersion ?? 8,
    opsetImport: [{ domain: '', version: opts.opset ?? 17 }],
    producerName: opts.producer ?? 'slabserve-modelgen',
    producerVersion: '1',
    graph,
  };
  if ((graph.node ?? []).some((n) => n.domain === MS_DOMAIN)) importMsOpset(model);
  if (opts.docString) model.docString = opts.docString;
  if (opts.metadata) model.metadataProps = Object.entries(opts.metadata).map(([key, value]) => ({ key, value }));
  return model;
}

/** Square [n, n] matrices (row-major) side by side: [n, n * parts], row by row (Q, K and V as one projection). */
export function concatColumns(parts: Float32Array[], n: number): Float32Array {
  const out = new Float32Array(n * n * parts.length);
  for (let r = 0; r < n; r++) parts.forEach((p, k) => out.set(p.subarray(r * n, (r + 1) * n), r * n * parts.length + k * n));
  return out;
}

/** Where ONNX external data's offsets fall: a page, so onnxruntime can map each tensor. */
const EXTERNAL_DATA_ALIGNMENT = 4096;

/**
 * Moves the initializers of `model` of at least `minBytes` into the file `dataPath` (ONNX
 * external data, named in the graph `location`: a file beside the graph), so that the
 * graph itself stays small: protobuf cannot encode a model of 2 GiB or more. Returns the bytes moved.
 */
export function moveToExternalData(model: onnx.IModelProto, dataPath: string, location = basename(dataPath), minBytes = 1024): number {
  const fd = openSync(dataPath, 'w');
  let offset = 0;
  try {
    for (const t of model.graph?.initializer ?? []) {
      const bytes = t.rawData;
      if (!bytes || bytes.byteLength < minBytes) continue;
      offset = Math.ceil(offset / EXTERNAL_DATA_ALIGNMENT) * EXTERNAL_DATA_ALIGNMENT;
      writeSync(fd, bytes, 0, bytes.byteLength, offset);
      t.externalData = [
        { key: 'location', value: location },
        { key: 'offset', value: String(offset) },
        { key: 'length', value: String(bytes.byteLength) },
      ];
      t.dataLocation = onnx.TensorProto.DataLocation.EXTERNAL;
      t.rawData = new Uint8Array(0);
      offset += bytes.byteLength;
    }
  } finally {
    closeSync(fd);
  }
  return offset;
}

/** Declares onnxruntime's contrib operator set (com.microsoft, version 1) in `model`, once. */
export function importMsOpset(model: onnx.IModelProto): void {
  const opsets = (model.opsetImport ??= []);
  if (!opsets.some((o) => o.domain === MS_DOMAIN)) opsets.push({ domain: MS_DOMAIN, version: 1 });
}

export function encodeModel(model: onnx.IModelProto): Uint8Array {
  return onnx.ModelProto.encode(model).finish();
}

/** Decodes model bytes. int64 fields come back as long.js `Long` objects (use Number(x) or x.toNumber()). */
export function decodeModel(bytes: Uint8Array): onnx.ModelProto {
  return onnx.ModelProto.decode(bytes);
}
