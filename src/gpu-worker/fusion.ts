/**
 * A graph rewrite onnxruntime's own optimizer misses on Hugging Face BERT
 * exports: each post-attention and post-FFN
 *
 *   LayerNormalization(Add(Add(MatMul(x, W), bias), residual), gamma, beta)
 *
 * becomes one com.microsoft SkipLayerNormalization(MatMul(x, W), residual,
 * gamma, beta, bias), and the embeddings'
 *
 *   LayerNormalization(Add(Add(Gather(words), Gather(types)), positions), gamma, beta)
 *
 * one SkipLayerNormalization(words + types, positions, gamma, beta): the op
 * onnxruntime's SkipLayerNormFusion would make if
 * it knew the sum's rank. It does not: its shape inference loses the rank at
 * the attention's Reshape to a shape computed at run time, so the fusion never
 * fires on these graphs, and LayerNormalization's CPU kernel runs a scalar loop
 * with a double accumulator. The fused op takes fewer µs of onnxruntime per
 * row, most on narrow models, and its token states match the unmodified
 * graph's to float rounding (docs/tuning.md, "Graph fusion", has the figures;
 * bench/micro/fusion.ts measures them).
 *
 * Only what is plainly one of those is rewritten: float32 initializers for
 * gamma, beta and the bias, all 1-D and as wide as the MatMul's 2-D weight's
 * output (or the embedding tables'); LayerNormalization over the last axis
 * (axis -1, float32 stash); the sums it replaces used by nothing else. The
 * ranks (SkipLayerNorm wants an input of rank 2 or 3 and a skip it can
 * broadcast) cannot be read from the graph: the runner opens the fused
 * graph, runs it once, and opens the unmodified one if that fails
 * (runner.ts, ModelRunner.create).
 */
import { importMsOpset, MS_DOMAIN, onnx } from '../shared/model-format/onnx-graph.js';

type Node = onnx.INodeProto;

/** onnx's LayerNormalization epsilon when the attribute is absent (SkipLayerNormalization's own default differs: it is always written). */
const LAYER_NORM_EPSILON = 1e-5;

/** The graph's facts the rewrite checks against: producers, use counts, initializers, graph outputs. */
export class GraphIndex {
  readonly producer = new Map<string, Node>();
  readonly uses = new Map<string, number>();
  readonly initializers = new Map<string, onnx.ITensorProto>();
  readonly outputs: Set<string>;

  constructor(graph: onnx.IGraphProto) {
    for (const node of graph.node ?? []) {
      for (const out of node.output ?? []) this.producer.set(out, node);
      for (const input of node.input ?? []) this.uses.set(input, (this.uses.get(input) ?? 0) + 1);
    }
    for (const t of graph.initializer ?? []) this.initializers.set(t.name ?? '', t);
    this.outputs = new Set((graph.output ?? []).map((o) => o.name ?? ''));
  }

  /** The node making `name`, if `name` feeds only one node and is not a graph output. */
  soleProducer(name: string, opType: string): Node | undefined {
    const node = this.producer.get(name);
    if (!node || node.opType !== opType || (node.domain ?? '') !== '') return undefined;
    return this.uses.get(name) === 1 && !this.outputs.has(name) ? node : undefined;
  }

  /** The width of a 1-D float32 initializer, or undefined. */
  vectorWidth(name: string | undefined): number | undefined {
    const t = name === undefined ? undefined : this.initializers.get(name);
    if (!t || t.dataType !== onnx.TensorProto.DataType.FLOAT || t.dims?.length !== 1) return undefined;
    return Number(t.dims[0]);
  }

  /** The second dimension of a 2-D float32 initializer (a weight [K, N], a table [V, H]), or undefined. */
  tableWidth(name: string | undefined): number | undefined {
    const t = name === undefined ? undefined : this.initializers.get(name);
    if (!t || t.dataType !== onnx.TensorProto.DataType.FLOAT || t.dims?.length !== 2) return undefined;
    return Number(t.dims[1]);
  }

  /** The output width of MatMul `node` whose weight is a 2-D float32 initializer, or undefined. */
  matMulWidth(node: Node | undefined): number | undefined {
    if (!node || node.opType !== 'MatMul' || (node.domain ?? '') !== '') return undefined;
    return this.tableWidth(node.input?.[1]);
  }
}

export function attr(node: Node, name: string): onnx.IAttributeProto | undefined {
  return node.attribute?.find((a) => a.name === name);
}

/** Whether `ln` normalises the last axis in float32 (the only LayerNormalization SkipLayerNormalization computes). */
function lastAxisFloat(ln: Node): boolean {
  const axis = attr(ln, 'axis');
  const stash = attr(ln, 'stash_type');
  return (axis === undefined || Number(axis.i) === -1) && (stash === undefined || Number(stash.i) === 1) && (ln.input?.length ?? 0) === 3;
}

/** The SkipLayerNormalization's operands: `input` [B, S, H], `skip` added to it, `bias` [H] if any; the Adds they replace. */
interface SkipOperands {
  input: string;
  skip: string;
  bias?: string;
  replaced: Node[];
}

/** After attention or the FFN: Add(Add(MatMul(x, W), bias), residual), either way round. */
function projectedSum(g: GraphIndex, outer: Node, width: number): SkipOperands | null {
  for (const side of [0, 1]) {
    const inner = g.soleProducer(outer.input![side]!, 'Add');
    if (!inner || inner.input?.length !== 2) continue;
    const biasAt = inner.input.findIndex((x) => g.vectorWidth(x) === width);
    if (biasAt < 0) continue;
    const projected = inner.input[1 - biasAt]!;
    if (g.matMulWidth(g.producer.get(projected)) !== width) continue;
    return { input: projected, skip: outer.input![1 - side]!, bias: inner.input[biasAt]!, replaced: [inner, outer] };
  }
  return null;
}

/** The embeddings: Add(word [+ token type], position), the first a Gather (or a sum of two) of [V, H] tables. */
function embeddingSum(g: GraphIndex, outer: Node, width: number): SkipOperands | null {
  const lookup = (name: string) => {
    const gather = g.producer.get(name);
    return gather?.opType === 'Gather' && (gather.domain ?? '') === '' && g.tableWidth(gather.input?.[0]) === width;
  };
  for (const side of [0, 1]) {
    const first = outer.input![side]!;
    const sum = g.producer.get(first);
    const summed = sum?.opType === 'Add' && (sum.domain ?? '') === '' && sum.input?.length === 2 && sum.input.every(lookup);
    if (lookup(first) || summed) return { input: first, skip: outer.input![1 - side]!, replaced: [outer] };
  }
  return null;
}

/** The SkipLayerNormalization for `ln` and the Adds it replaces, or null where `ln` is not plainly one of the two patterns. */
function skipLayerNorm(g: GraphIndex, ln: Node): { fused: Node; replaced: Node[] } | null {
  if (ln.opType !== 'LayerNormalization' || (ln.domain ?? '') !== '' || !lastAxisFloat(ln)) return null;
  const [sum, gamma, beta] = ln.input as string[];
  const width = g.vectorWidth(gamma);
  if (width === undefined || g.vectorWidth(beta) !== width) return null;
  const outer = g.soleProducer(sum!, 'Add');
  if (!outer || outer.input?.length !== 2) return null;
  const found = projectedSum(g, outer, width) ?? embeddingSum(g, outer, width);
  if (!found) return null;
  const epsilon = attr(ln, 'epsilon');
  const fused: Node = {
    name: `${ln.name ?? 'LayerNorm'}/slabserve_skip`,
    opType: 'SkipLayerNormalization',
    domain: MS_DOMAIN,
    input: [found.input, found.skip, gamma!, beta!, ...(found.bias ? [found.bias] : [])],
    output: [ln.output![0]!],
    attribute: [{ name: 'epsilon', type: onnx.AttributeProto.AttributeType.FLOAT, f: epsilon?.f ?? LAYER_NORM_EPSILON }],
  };
  return { fused, replaced: found.replaced };
}

/**
 * Rewrites every LayerNormalization of the pattern in the header into a
 * SkipLayerNormalization, in place (the node keeps its position: its inputs
 * are all made before it). Returns how many it rewrote.
 */
export function fuseSkipLayerNorm(model: onnx.IModelProto): number {
  const graph = model.graph;
  if (!graph?.node) return 0;
  const g = new GraphIndex(graph);
  const dropped = new Set<Node>();
  let count = 0;
  graph.node = graph.node.map((node) => {
    const found = skipLayerNorm(g, node);
    if (!found) return node;
    for (const n of found.replaced) dropped.add(n);
    count++;
    return found.fused;
  });
  if (count === 0) return 0;
  graph.node = graph.node.filter((n) => !dropped.has(n));
  importMsOpset(model);
  return count;
}
