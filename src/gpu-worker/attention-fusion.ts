/**
 * The self-attention of a Hugging Face BERT export as one com.microsoft
 * Attention node, the op onnxruntime's AttentionFusion makes where it can
 * read the graph's shapes (it cannot on these exports, as with the LayerNorms:
 * fusion.ts). Per layer,
 *
 *   q, k, v = Add(MatMul(x, Wq|Wk|Wv), bq|bk|bv), each Reshape'd to
 *             [B, S, heads, d] and Transpose'd (k to [B, heads, d, S])
 *   context = Reshape(Transpose(MatMul(Softmax(Add(MatMul(q, k) / sqrt(d), mask)), v)), [B, S, H])
 *
 * becomes Attention(x, [Wq Wk Wv], [bq bk bv], attention_mask as int32) with
 * num_heads, and the mask's fill value (the graph's (1 - mask) * fill) as
 * mask_filter_value. Seventeen nodes, three GEMMs and four Transposes become
 * one kernel. It saves per-node work, not arithmetic, so a run of one row
 * (the lone caller) gains most and batches little (docs/tuning.md, Graph
 * fusion, has the figures; bench/micro/fusion.ts measures them).
 *
 * Only the plain pattern is rewritten: float32 weights [H, H] and biases [H]
 * held in the file (not external data), the same x for q, k and v, reshape
 * shapes and scalars given as constants (initializers or Constant nodes), the
 * shapes agreeing with the scale (d = H / heads, the scale 1/sqrt(d)), the mask computed from the graph input attention_mask,
 * every intermediate used once. The runner's trial run covers the rest
 * (runner.ts, ModelRunner.create).
 */
import { concatColumns, importMsOpset, makeTensor, MS_DOMAIN, onnx } from '../shared/model-format/onnx-graph.js';
import { attr, GraphIndex } from './fusion.js';

type Node = onnx.INodeProto;
const FLOAT = onnx.TensorProto.DataType.FLOAT;

/** The graph input Attention takes as its mask, and the Cast that makes it int32. */
const MASK_INPUT = 'attention_mask';
const MASK_INT32 = 'slabserve_attention_mask_int32';

/** The bytes in a buffer of their own (a decoded tensor's rawData may be a view of a larger one, at any offset). */
function copied(bytes: Uint8Array): ArrayBuffer {
  return new Uint8Array(bytes).buffer;
}

/** The tensor `name` holds where it is a constant: an initializer, or a Constant node's value (torch.onnx writes scalars both ways). */
function constant(g: GraphIndex, name: string | undefined): onnx.ITensorProto | undefined {
  if (name === undefined) return undefined;
  const node = g.producer.get(name);
  if (node?.opType === 'Constant' && (node.domain ?? '') === '') return attr(node, 'value')?.t ?? undefined;
  return g.initializers.get(name);
}

/** A float32 constant's values, or undefined (another type, or data outside the file). */
function floats(g: GraphIndex, name: string | undefined): Float32Array | undefined {
  const t = constant(g, name);
  if (!t || t.dataType !== FLOAT) return undefined;
  if (t.rawData && t.rawData.byteLength > 0) return t.rawData.byteLength % 4 === 0 ? new Float32Array(copied(t.rawData)) : undefined;
  return t.floatData && t.floatData.length > 0 ? Float32Array.from(t.floatData) : undefined;
}

/** An int64 constant's values as numbers, or undefined. */
function ints(g: GraphIndex, name: string | undefined): number[] | undefined {
  const t = constant(g, name);
  if (!t || t.dataType !== onnx.TensorProto.DataType.INT64) return undefined;
  if (t.rawData && t.rawData.byteLength > 0) return t.rawData.byteLength % 8 === 0 ? Array.from(new BigInt64Array(copied(t.rawData)), Number) : undefined;
  return t.int64Data?.map(Number);
}

/** The one value of a float32 scalar constant (or one-element tensor), or undefined. */
function scalar(g: GraphIndex, name: string | undefined): number | undefined {
  const v = floats(g, name);
  return v?.length === 1 ? v[0] : undefined;
}

/** `name`'s producer if it is an `opType` of the default domain whose output only one node uses. */
const sole = (g: GraphIndex, name: string | undefined, opType: string) => (name === undefined ? undefined : g.soleProducer(name, opType));

/** Whether Transpose `t` has exactly permutation `perm`. */
function permIs(t: Node | undefined, perm: number[]): t is Node {
  const p = t && attr(t, 'perm')?.ints?.map(Number);
  return p !== undefined && p.length === perm.length && p.every((v, i) => v === perm[i]);
}

/** One head projection: Transpose(Reshape(Add(MatMul(x, W), b), [_, _, heads, d]), perm). */
interface Projection {
  x: string;
  weight: Float32Array;
  bias: Float32Array;
  heads: number;
  headSize: number;
  nodes: Node[];
}

function projection(g: GraphIndex, name: string | undefined, perm: number[]): Projection | null {
  const transpose = sole(g, name, 'Transpose');
  if (!permIs(transpose, perm)) return null;
  const reshape = sole(g, transpose.input?.[0], 'Reshape');
  const shape = ints(g, reshape?.input?.[1]);
  if (!reshape || shape?.length !== 4) return null;
  const add = sole(g, reshape.input?.[0], 'Add');
  if (!add || add.input?.length !== 2) return null;
  for (const side of [0, 1]) {
    const matMul = sole(g, add.input[side], 'MatMul');
    const bias = floats(g, add.input[1 - side]);
    const weight = floats(g, matMul?.input?.[1]);
    const dims = matMul && constant(g, matMul.input![1])?.dims?.map(Number);
    if (!matMul || !bias || !weight || dims?.length !== 2 || dims[0] !== dims[1] || bias.length !== dims[1]) continue;
    const [heads, headSize] = [shape[2]!, shape[3]!];
    if (heads < 1 || headSize < 1 || heads * headSize !== dims[1]) return null;
    return { x: matMul.input![0]!, weight, bias, heads, headSize, nodes: [transpose, reshape, add, matMul] };
  }
  return null;
}

/** The extended mask every layer adds: Mul(Sub(1, Cast(Unsqueeze...(attention_mask))), fill); its fill value, or undefined. */
function maskFill(g: GraphIndex, name: string): number | undefined {
  const mul = g.producer.get(name);
  if (mul?.opType !== 'Mul' || mul.input?.length !== 2) return undefined;
  for (const side of [0, 1]) {
    const fill = scalar(g, mul.input[1 - side]);
    const sub = g.producer.get(mul.input[side]!);
    if (fill === undefined || sub?.opType !== 'Sub' || scalar(g, sub.input?.[0]) !== 1) continue;
    let from = g.producer.get(sub.input![1]!);
    if (from?.opType !== 'Cast') continue;
    from = g.producer.get(from.input![0]!);
    while (from?.opType === 'Unsqueeze') {
      if (from.input![0] === MASK_INPUT) return fill;
      from = g.producer.get(from.input![0]!);
    }
  }
  return undefined;
}

/** The Attention for the self-attention ending in Reshape `out`, with the nodes it replaces; null where it is not plainly one. */
function attention(g: GraphIndex, out: Node): { fused: Node; replaced: Node[]; weight: Float32Array; bias: Float32Array; width: number } | null {
  const outShape = out.opType === 'Reshape' && (out.domain ?? '') === '' ? ints(g, out.input?.[1]) : undefined;
  if (outShape?.length !== 3) return null;
  const back = sole(g, out.input?.[0], 'Transpose');
  if (!permIs(back, [0, 2, 1, 3])) return null;
  const context = sole(g, back.input?.[0], 'MatMul');
  const softmax = sole(g, context?.input?.[0], 'Softmax');
  const axis = softmax && attr(softmax, 'axis');
  if (!context || !softmax || (axis !== undefined && Number(axis.i) !== -1 && Number(axis.i) !== 3)) return null;
  const masked = sole(g, softmax.input?.[0], 'Add');
  if (!masked || masked.input?.length !== 2) return null;
  for (const side of [0, 1]) {
    const fill = maskFill(g, masked.input[1 - side]!);
    const scaled = g.producer.get(masked.input[side]!);
    if (fill === undefined || !scaled || g.uses.get(masked.input[side]!) !== 1) continue;
    if ((scaled.opType !== 'Div' && scaled.opType !== 'Mul') || (scaled.domain ?? '') !== '') continue;
    const by = scalar(g, scaled.input?.[1]);
    const scores = sole(g, scaled.input?.[0], 'MatMul');
    const q = projection(g, scores?.input?.[0], [0, 2, 1, 3]);
    const k = projection(g, scores?.input?.[1], [0, 2, 3, 1]);
    const v = projection(g, context.input?.[1], [0, 2, 1, 3]);
    if (by === undefined || !scores || !q || !k || !v) continue;
    const { heads, headSize } = q;
    const same = [k, v].every((p) => p.x === q.x && p.heads === heads && p.headSize === headSize);
    // Attention scales by 1/sqrt(d): the graph must do the same.
    const scale = scaled.opType === 'Div' ? 1 / by : by;
    const width = heads * headSize;
    if (!same || Math.abs(scale * Math.sqrt(headSize) - 1) > 1e-6 || (outShape[2] !== width && outShape[2] !== -1)) continue;
    const fused: Node = {
      name: `${out.name ?? 'attention'}/slabserve_attention`,
      opType: 'Attention',
      domain: MS_DOMAIN,
      input: [q.x, '', '', MASK_INT32], // weights and bias named by fuseAttention
      output: [out.output![0]!],
      attribute: [
        { name: 'num_heads', type: onnx.AttributeProto.AttributeType.INT, i: heads },
        { name: 'mask_filter_value', type: onnx.AttributeProto.AttributeType.FLOAT, f: fill },
      ],
    };
    return {
      fused,
      replaced: [out, back, context, softmax, masked, scaled, scores, ...q.nodes, ...k.nodes, ...v.nodes],
      weight: concatColumns([q.weight, k.weight, v.weight], width),
      bias: Float32Array.from([...q.bias, ...k.bias, ...v.bias]),
      width,
    };
  }
  return null;
}

/**
 * Rewrites every self-attention of the pattern in the header into one Attention node, in place
 * (at the position of its last node: its inputs are all made before it). Returns how many.
 */
export function fuseAttention(model: onnx.IModelProto): number {
  const graph = model.graph;
  const maskInput = graph?.input?.find((i) => i.name === MASK_INPUT);
  if (!graph?.node || !maskInput) return 0;
  const g = new GraphIndex(graph);
  const dropped = new Set<Node>();
  const initializers: onnx.ITensorProto[] = [];
  let count = 0;
  graph.node = graph.node.map((node) => {
    const found = attention(g, node);
    if (!found) return node;
    const name = found.fused.name!;
    initializers.push(
      makeTensor(`${name}/qkv_weight`, 'float', found.weight, [found.width, 3 * found.width]),
      makeTensor(`${name}/qkv_bias`, 'float', found.bias, [3 * found.width]),
    );
    found.fused.input![1] = `${name}/qkv_weight`;
    found.fused.input![2] = `${name}/qkv_bias`;
    for (const n of found.replaced) if (n !== node) dropped.add(n);
    count++;
    return found.fused;
  });
  if (count === 0) return 0;
  graph.node = graph.node.filter((n) => !dropped.has(n));
  const int32 = maskInput.type?.tensorType?.elemType === onnx.TensorProto.DataType.INT32;
  graph.node.unshift(
    int32
      ? { name: MASK_INT32, opType: 'Identity', input: [MASK_INPUT], output: [MASK_INT32] }
      : { name: MASK_INT32, opType: 'Cast', input: [MASK_INPUT], output: [MASK_INT32], attribute: [{ name: 'to', type: onnx.AttributeProto.AttributeType.INT, i: onnx.TensorProto.DataType.INT32 }] },
  );
  (graph.initializer ??= []).push(...initializers);
  dropUnused(graph);
  importMsOpset(model);
  return count;
}

/**
 * Removes nodes whose outputs nothing uses (the extended mask, once every layer is fused), then the
 * initializers no node reads (the separate Q, K and V weights and biases, the scale): onnxruntime
 * would drop them at load, with a warning for each, after holding them in the bytes it was handed.
 */
function dropUnused(graph: onnx.IGraphProto): void {
  // A subgraph (If, Loop, Scan) may read the outer graph's values without naming them as inputs.
  if ((graph.node ?? []).some((n) => (n.attribute ?? []).some((a) => a.g || (a.graphs?.length ?? 0) > 0))) return;
  const outputs = new Set((graph.output ?? []).map((o) => o.name ?? ''));
  const read = () => {
    const used = new Set<string>(outputs);
    for (const n of graph.node ?? []) for (const i of n.input ?? []) used.add(i);
    return used;
  };
  for (let removed = true; removed; ) {
    const used = read();
    const before = graph.node!.length;
    graph.node = graph.node!.filter((n) => (n.output ?? []).some((o) => used.has(o)));
    removed = graph.node.length < before;
  }
  const used = read();
  const inputs = new Set((graph.input ?? []).map((i) => i.name ?? '')); // an initializer declared as an input is the caller's to feed
  graph.initializer = (graph.initializer ?? []).filter((t) => used.has(t.name ?? '') || inputs.has(t.name ?? ''));
}
