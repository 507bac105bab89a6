/**
 * Dynamic int8 quantization of a float32 ONNX model, the form
 * onnxruntime.quantization.quantize_dynamic writes (and optimum's
 * `model_quantized.onnx`): every MatMul by a constant 2-D weight becomes
 *
 *   DynamicQuantizeLinear(x) -> x_q (uint8), x_scale, x_zero_point
 *   MatMulInteger(x_q, W_q, x_zero_point, 0) -> int32 -> Cast float -> * (x_scale * w_scale)
 *
 * with W_q the weight rounded to int8 on one symmetric per-tensor scale
 * (max |W| / 127). Activations are quantized per batch, at run time.
 */
import { decodeModel, encodeModel, onnx } from '../../src/shared/model-format/onnx-graph.js';
import { floatToHalf, halvesOf } from '../../src/shared/model-format/safetensors.js';

const INT8 = onnx.TensorProto.DataType.INT8;
const FLOAT = onnx.TensorProto.DataType.FLOAT;

/** The float32 values of an initializer stored as raw little-endian bytes (ours are). */
function floats(t: onnx.ITensorProto): Float32Array | null {
  if (t.dataType !== FLOAT || !t.rawData) return null;
  const raw = t.rawData;
  return new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength));
}

/** Returns the model with its MatMuls by constant weights quantized to int8. */
export function quantizeDynamicInt8(modelBytes: Uint8Array): Uint8Array {
  const model = decodeModel(modelBytes);
  const g = model.graph!;
  const inits = new Map((g.initializer ?? []).map((t) => [t.name!, t]));
  const nodes: onnx.INodeProto[] = [];
  const drop = new Set<string>();
  let k = 0;
  for (const node of g.node ?? []) {
    const w = node.opType === 'MatMul' ? inits.get(node.input![1]!) : undefined;
    const values = w && (w.dims ?? []).length === 2 ? floats(w) : null;
    if (!w || !values) {
      nodes.push(node);
      continue;
    }
    const scale = Math.max(1e-12, values.reduce((m, v) => Math.max(m, Math.abs(v)), 0) / 127);
    const q = Int8Array.from(values, (v) => Math.max(-127, Math.min(127, Math.round(v / scale))));
    const base = `${w.name}_quantized`;
    g.initializer!.push(
      { name: base, dataType: INT8, dims: w.dims, rawData: new Uint8Array(q.buffer) },
      { name: `${base}_scale`, dataType: FLOAT, dims: [], rawData: new Uint8Array(Float32Array.of(scale).buffer) },
      { name: `${base}_zero_point`, dataType: INT8, dims: [], rawData: new Uint8Array(1) },
    );
    drop.add(w.name!);
    const n = `${node.name ?? 'MatMul'}_quant_${k++}`;
    const [x] = node.input!;
    const out = node.output![0]!;
    nodes.push(
      { name: `${n}_x`, opType: 'DynamicQuantizeLinear', input: [x!], output: [`${n}_xq`, `${n}_xs`, `${n}_xz`] },
      { name: `${n}_mm`, opType: 'MatMulInteger', input: [`${n}_xq`, base, `${n}_xz`, `${base}_zero_point`], output: [`${n}_i32`] },
      { name: `${n}_cast`, opType: 'Cast', input: [`${n}_i32`], output: [`${n}_f`], attribute: [{ name: 'to', type: onnx.AttributeProto.AttributeType.INT, i: FLOAT }] },
      { name: `${n}_scale`, opType: 'Mul', input: [`${n}_xs`, `${base}_scale`], output: [`${n}_s`] },
      { name: `${n}_out`, opType: 'Mul', input: [`${n}_f`, `${n}_s`], output: [out] },
    );
  }
  g.node = nodes;
  // A weight still read elsewhere stays; the others are replaced by their int8 form.
  const stillRead = new Set(nodes.flatMap((n) => n.input ?? []));
  g.initializer = g.initializer!.filter((t) => !drop.has(t.name!) || stillRead.has(t.name!));
  return encodeModel(model);
}

const FLOAT16 = onnx.TensorProto.DataType.FLOAT16;

/** The IEEE half-precision bits nearest to `value` (round to nearest even; overflow to infinity). */
export const toHalfBits = floatToHalf;

/**
 * The fp16 variant (model_fp16.onnx) of a float32 model: every weight stored
 * as float16 (half the file) and cast back to float32 inside the graph, and
 * the outputs given as float16, as an fp16 export's are. onnxruntime folds
 * the weight casts at load, so on a CPU it computes in float32 on
 * float16-rounded weights; what it exercises is the file, its outputs'
 * type and the server's handling of both.
 */
export function toFloat16Variant(modelBytes: Uint8Array): Uint8Array {
  const model = decodeModel(modelBytes);
  const g = model.graph!;
  const casts: onnx.INodeProto[] = [];
  g.initializer = (g.initializer ?? []).map((t) => {
    const values = floats(t);
    if (!values || values.length < 2) return t; // scalars (epsilons, constants) stay float32
    const half = halvesOf(values);
    casts.push({ name: `${t.name}_to_float`, opType: 'Cast', input: [`${t.name}_fp16`], output: [t.name!], attribute: [{ name: 'to', type: onnx.AttributeProto.AttributeType.INT, i: FLOAT }] });
    return { name: `${t.name}_fp16`, dataType: FLOAT16, dims: t.dims, rawData: new Uint8Array(half.buffer) };
  });
  const outputs: onnx.INodeProto[] = [];
  for (const o of g.output ?? []) {
    const name = o.name!;
    for (const n of g.node ?? []) n.output = n.output!.map((x) => (x === name ? `${name}_float` : x));
    outputs.push({ name: `${name}_to_fp16`, opType: 'Cast', input: [`${name}_float`], output: [name], attribute: [{ name: 'to', type: onnx.AttributeProto.AttributeType.INT, i: FLOAT16 }] });
    o.type!.tensorType!.elemType = FLOAT16;
  }
  g.node = [...casts, ...(g.node ?? []), ...outputs];
  return encodeModel(model);
}
