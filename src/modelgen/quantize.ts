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
import { decodeModel, encodeModel, onnx } from '../shared/onnx-graph.js';

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
