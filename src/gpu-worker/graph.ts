/**
 * Appends the post-processing a serving model needs to the loaded ONNX graph,
 * so that only [batch, width] floats leave the device (never the
 * [batch, sequence, hidden] token states):
 *
 *   embed:    last_hidden_state -> pooling (the model's mode: cls, mean, max,
 *             mean_sqrt_len, weightedmean, lasttoken) -> L2 norm
 *             outputs `slabserve_embedding` [B, H] (normalised) and
 *             `slabserve_norm` [B, 1]; SPLADE: logits [B,T,V] ->
 *             log(1 + relu) -> max or sum over the real tokens, [B, V], then
 *             the same norm (so `normalize: false` rows are the weights); a model that pools without its
 *             prompt (include_prompt false) takes one more input,
 *             `slabserve_pooling_mask` [B, T]: the attention mask with the
 *             prompt's tokens off
 *   classify: logits -> softmax
 *             outputs `slabserve_probabilities` [B, L] and the model's logits
 *   rerank:   the single logit -> sigmoid (a cross-encoder's relevance score)
 *             outputs `slabserve_score` [B, 1] and the model's logits [B, 1]
 *
 * It works on any Hugging Face BERT-style export (optimum or torch.onnx) whose
 * outputs are `last_hidden_state` or `logits`, and on ours from `npm run models`.
 */
import type { ColbertSpec, M3Spec, ModelSpec, Pooling, SpladeSettings } from '../shared/model-format/model-config.js';
import { readSafetensors, type F32Tensor } from '../shared/model-format/safetensors.js';
import { decodeModel, encodeModel, GraphBuilder, MS_DOMAIN, onnx } from '../shared/model-format/onnx-graph.js';
import { fuseSkipLayerNorm } from './fusion.js';
import { fuseAttention } from './attention-fusion.js';

export interface PreparedModel {
  /** Serialized model with the post-processing appended. */
  bytes: Uint8Array;
  /** Graph outputs to fetch, in slot-row order, with their widths. */
  outputs: { name: string; width: number }[];
  /** Element type of the model's integer inputs. */
  inputType: 'int64' | 'int32';
  /** Whether the graph takes token_type_ids (some exports drop it). */
  hasTokenTypeIds: boolean;
  /** Whether the graph takes position_ids (decoders, some exports): fed 0..T-1 per right-padded row. */
  hasPositionIds: boolean;
  /** Whether the pooling takes its own mask ({@link POOLING_MASK}: include_prompt false). */
  hasPoolingMask: boolean;
  /** The per-token output, [B, T, width] (a model with token vectors: spec.tokenWidth > 0), fetched only for runs that ask. */
  tokenOutput?: { name: string; width: number };
  /** What the graph runs fused: built so (a checkpoint's graph), or rewritten at load (fusion.ts, attention-fusion.ts). */
  fusions: GraphFusions;
  /** Whether the load-time rewrite changed the graph (none with `fuse: false`). */
  rewritten: boolean;
}

/** Parts of a graph that run as onnxruntime's fused ops (docs/tuning.md, Graph fusion). */
export interface GraphFusions {
  /** LayerNormalizations run as SkipLayerNormalization. */
  layerNorms: number;
  /** Self-attentions run as one Attention (or MultiHeadAttention) node. */
  attentions: number;
}

/** The fused ops in `graph`, however they came there. */
function fusedOps(graph: onnx.IGraphProto): GraphFusions {
  const count = (...opTypes: string[]) => (graph.node ?? []).filter((n) => opTypes.includes(n.opType ?? '') && n.domain === MS_DOMAIN).length;
  return { layerNorms: count('SkipLayerNormalization'), attentions: count('Attention', 'MultiHeadAttention') };
}

/** The per-token output's name: the token states as they are (TEI's /embed_all). */
export const TOKEN_OUTPUT = 'slabserve_tokens';

/** The input that tells the pooling which tokens count, where it is not the attention mask. */
export const POOLING_MASK = 'slabserve_pooling_mask';

const MIN_OPSET = 13; // ReduceSum/Unsqueeze with axes as inputs

/** `fuse` (default true; never for SPLADE): rewrite the graph's Add-Add-LayerNormalization runs as SkipLayerNormalization (fusion.ts) and its self-attentions as Attention (attention-fusion.ts). */
export function prepareModel(onnxBytes: Uint8Array, spec: ModelSpec, options: { fuse?: boolean } = {}): PreparedModel {
  const model = decodeModel(onnxBytes);
  const graph = model.graph;
  if (!graph) throw new Error(`model ${spec.name}: the ONNX file has no graph`);
  const opset = Number((model.opsetImport ?? []).find((o) => !o.domain || o.domain === 'ai.onnx')?.version ?? 0);
  if (opset < MIN_OPSET) throw new Error(`model ${spec.name}: opset ${opset} is too old; export with opset >= ${MIN_OPSET}`);

  const inputNames = (graph.input ?? []).map((i) => i.name ?? '');
  for (const need of ['input_ids', 'attention_mask']) {
    if (!inputNames.includes(need)) throw new Error(`model ${spec.name}: graph has no input "${need}" (inputs: ${inputNames.join(', ')})`);
  }
  const idsInput = (graph.input ?? []).find((i) => i.name === 'input_ids')!;
  const inputType = idsInput.type?.tensorType?.elemType === onnx.TensorProto.DataType.INT32 ? 'int32' : 'int64';

  // A SPLADE row is log1p(relu(logits)): which of its entries are 0 turns on each logit's sign, and a
  // fused graph's logits differ from the exported graph's by about 1e-6, enough to flip a logit that
  // close to 0 (seen: an entry 1.2e-6 where the exported graph gives 0). Its sparse ids must be the
  // exported graph's, so it runs unfused; its cost is mostly the vocabulary-wide head anyway.
  const fuse = options.fuse !== false && spec.pooling !== 'splade';
  const rewritten = fuse && fuseSkipLayerNorm(model) + fuseAttention(model) > 0;
  const fusions = fusedOps(graph);
  const b = GraphBuilder.wrap(graph);
  const outputNames = b.outputNames();
  let outputs: PreparedModel['outputs'];
  let tokenOutput: PreparedModel['tokenOutput'];
  // [CLS] pooling takes the first token's state whatever the mask says, as sentence-transformers does.
  const hasPoolingMask = spec.task === 'embed' && !spec.includePrompt && spec.pooling !== 'cls';

  if (spec.task === 'embed') {
    const poolingMask = hasPoolingMask ? b.addInput(POOLING_MASK, inputType, ['batch_size', 'sequence_length']) : 'attention_mask';
    let pooled: string;
    if (spec.pooling === 'splade') {
      pooled = spladePool(b, asFloat(b, graph, findOutput(outputNames, ['logits'], spec)), spec.splade!, opset, poolingMask);
    } else {
      const hidden = asFloat(b, graph, findOutput(outputNames, ['last_hidden_state', 'token_embeddings'], spec));
      pooled = pool(b, hidden, spec.pooling, opset, poolingMask);
      if (spec.tokenWidth > 0) {
        tokenOutput = { name: TOKEN_OUTPUT, width: spec.tokenWidth };
        const vectors = spec.colbert ? colbertVectors(b, hidden, spec.colbert.dense) : spec.m3 ? m3Heads(b, hidden, spec.m3) : hidden;
        b.node('Identity', [vectors], undefined, [TOKEN_OUTPUT]);
      }
    }
    // L2 normalisation, with the norm kept so the caller can undo it.
    const norm = b.op('Sqrt', [b.op('ReduceSum', [b.op('Mul', [pooled, pooled]), axes(b, 1)], { keepdims: 1 })]);
    const safeNorm = b.op('Max', [norm, scalar(b, 'slabserve_eps_norm', 1e-12)]);
    b.node('Div', [pooled, safeNorm], undefined, ['slabserve_embedding']);
    b.node('Identity', [norm], undefined, ['slabserve_norm']);
    for (const name of outputNames) b.removeOutput(name);
    b.addOutput('slabserve_embedding', 'float', ['batch_size', spec.dimension]);
    b.addOutput('slabserve_norm', 'float', ['batch_size', 1]);
    if (tokenOutput) b.addOutput(TOKEN_OUTPUT, 'float', ['batch_size', 'sequence_length', tokenOutput.width]);
    outputs = [
      { name: 'slabserve_embedding', width: spec.dimension },
      { name: 'slabserve_norm', width: 1 },
    ];
  } else if (spec.task === 'rerank') {
    const raw = findOutput(outputNames, ['logits'], spec);
    checkLogitsWidth(graph, raw, 1, spec);
    const logits = floatLogits(b, graph, raw, outputNames, 1);
    b.node('Sigmoid', [logits], undefined, ['slabserve_score']);
    b.addOutput('slabserve_score', 'float', ['batch_size', 1]);
    outputs = [
      { name: 'slabserve_score', width: 1 },
      { name: logits, width: 1 },
    ];
  } else {
    const logits = floatLogits(b, graph, findOutput(outputNames, ['logits'], spec), outputNames, spec.labels.length);
    b.node('Softmax', [logits], { axis: -1 }, ['slabserve_probabilities']);
    b.addOutput('slabserve_probabilities', 'float', ['batch_size', spec.labels.length]);
    outputs = [
      { name: 'slabserve_probabilities', width: spec.labels.length },
      { name: logits, width: spec.labels.length },
    ];
  }
  const width = outputs.reduce((s, o) => s + o.width, 0);
  if (width !== spec.outputWidth) throw new Error(`model ${spec.name}: output width ${width} != expected ${spec.outputWidth}`);
  return {
    bytes: encodeModel(model),
    outputs,
    inputType,
    hasTokenTypeIds: inputNames.includes('token_type_ids'),
    hasPositionIds: inputNames.includes('position_ids'),
    hasPoolingMask,
    ...(tokenOutput ? { tokenOutput } : {}),
    fusions,
    rewritten,
  };
}

/** `name` as float32: an fp16 graph's output (model_fp16.onnx) is cast, so rows are float32 whatever the graph computes in. */
function asFloat(b: GraphBuilder, graph: onnx.IGraphProto, name: string): string {
  const elem = (graph.output ?? []).find((o) => o.name === name)?.type?.tensorType?.elemType;
  return elem === onnx.TensorProto.DataType.FLOAT16 ? b.op('Cast', [name], { to: onnx.TensorProto.DataType.FLOAT }) : name;
}

/**
 * The graph's logits as a float32 output, the others removed: the graph's own
 * output, or (an fp16 graph) `slabserve_logits`, its float32 cast.
 */
function floatLogits(b: GraphBuilder, graph: onnx.IGraphProto, raw: string, outputNames: string[], width: number): string {
  const logits = asFloat(b, graph, raw);
  for (const name of outputNames) if (name !== raw || logits !== raw) b.removeOutput(name);
  if (logits === raw) return raw;
  b.node('Identity', [logits], undefined, ['slabserve_logits']);
  b.addOutput('slabserve_logits', 'float', ['batch_size', width]);
  return 'slabserve_logits';
}

function findOutput(names: string[], wanted: string[], spec: ModelSpec): string {
  const hit = wanted.find((w) => names.includes(w));
  if (!hit) throw new Error(`model ${spec.name} (${spec.task}): expected an output named ${wanted.join(' or ')}, found ${names.join(', ')}`);
  return hit;
}

/** A logits output whose declared width is fixed must have `width` columns (a reranker: exactly one). */
function checkLogitsWidth(graph: onnx.IGraphProto, name: string, width: number, spec: ModelSpec): void {
  const out = (graph.output ?? []).find((o) => o.name === name);
  const dims = out?.type?.tensorType?.shape?.dim ?? [];
  const last = dims[dims.length - 1];
  const raw: unknown = last?.dimValue;
  // protobufjs gives int64 as a number, or as a Long ({low, high}) when long.js is around
  const long = raw as { low?: number; high?: number } | null | undefined;
  const value = typeof raw === 'number' ? raw : typeof long?.low === 'number' ? (long.low >>> 0) + (long.high ?? 0) * 2 ** 32 : 0;
  if (value > 0 && value !== width) {
    throw new Error(`model ${spec.name} (${spec.task}): output ${name} has ${value} columns, expected ${width}`);
  }
}

function axes(b: GraphBuilder, axis: number): string {
  const name = `slabserve_axes_${axis}`;
  return b.has(name) ? name : b.addInitializer(name, 'int64', [axis], [1]);
}

function scalar(b: GraphBuilder, name: string, value: number): string {
  return b.has(name) ? name : b.addInitializer(name, 'float', [value], []);
}

/**
 * One vector per row from the token states [B,T,H], as sentence-transformers'
 * Pooling module computes it over the tokens `maskInput` keeps (the attention
 * mask, or the pooling mask that also leaves a prompt out); padding never counts.
 */
function pool(b: GraphBuilder, hidden: string, mode: Pooling, opset: number, maskInput: string): string {
  if (mode === 'cls') {
    const zero = b.addInitializer('slabserve_index_0', 'int64', [0], []);
    return b.op('Gather', [hidden, zero], { axis: 1 }); // the first token's state ([CLS])
  }
  const asMask = (input: string) => b.op('Unsqueeze', [b.op('Cast', [input], { to: onnx.TensorProto.DataType.FLOAT }), axes(b, 2)]); // [B,T,1]
  const mask = asMask(maskInput);
  const sumOver = (x: string) => b.op('ReduceSum', [x, axes(b, 1)], { keepdims: 0 }); // over T
  const atLeast = (x: string, eps: number, name: string) => b.op('Max', [x, scalar(b, name, eps)]);
  switch (mode) {
    case 'mean':
      return b.op('Div', [sumOver(b.op('Mul', [hidden, mask])), atLeast(sumOver(mask), 1e-9, 'slabserve_eps_count')]);
    case 'mean_sqrt_len':
      return b.op('Div', [sumOver(b.op('Mul', [hidden, mask])), b.op('Sqrt', [atLeast(sumOver(mask), 1e-9, 'slabserve_eps_count')])]);
    case 'max': {
      // Padding set to -1e9 first, as sentence-transformers does: h*m + (m-1)*1e9.
      const masked = b.op('Add', [b.op('Mul', [hidden, mask]), b.op('Mul', [b.op('Sub', [mask, scalar(b, 'slabserve_one', 1)]), scalar(b, 'slabserve_big', 1e9)])]);
      // ReduceMax takes its axes as an input from opset 18, as an attribute before.
      return opset >= 18 ? b.op('ReduceMax', [masked, axes(b, 1)], { keepdims: 0 }) : b.op('ReduceMax', [masked], { axes: [1], keepdims: 0 });
    }
    case 'weightedmean': {
      // Weights 1..n along the row (sentence-transformers: arange(1, T+1), masked); with right padding
      // that is the running count of the attention mask (positions, whether or not a prompt is left out).
      const positions = maskInput === 'attention_mask' ? mask : asMask('attention_mask');
      const weights = b.op('Mul', [positionsCounted(b, positions), mask]);
      return b.op('Div', [sumOver(b.op('Mul', [hidden, weights])), atLeast(sumOver(weights), 1e-9, 'slabserve_eps_count')]);
    }
    case 'lasttoken': {
      // The last token the mask keeps: where the running count of the mask reaches its total.
      const total = b.op('ReduceSum', [mask, axes(b, 1)], { keepdims: 1 }); // [B,1,1]
      const isLast = b.op('Mul', [b.op('Cast', [b.op('Equal', [positionsCounted(b, mask), total])], { to: onnx.TensorProto.DataType.FLOAT }), mask]);
      return sumOver(b.op('Mul', [hidden, isLast]));
    }
  }
}

/**
 * A PyLate model's token vectors from the token states [B,T,H]: its Dense
 * module (activation(x W^T + b), weights from its model.safetensors), then
 * L2-normalised per token as PyLate's normalize (x / max(|x|, 1e-12)).
 */
function colbertVectors(b: GraphBuilder, hidden: string, dense: ColbertSpec['dense']): string {
  const tensors = readSafetensors(dense.weightsPath);
  const weight = tensors.get('linear.weight');
  if (!weight || weight.shape.join() !== `${dense.outFeatures},${dense.inFeatures}`) {
    throw new Error(`${dense.weightsPath}: expected linear.weight [${dense.outFeatures}, ${dense.inFeatures}], found ${weight ? `[${weight.shape.join(', ')}]` : 'none'}`);
  }
  const bias = dense.bias ? tensors.get('linear.bias') : undefined;
  if (dense.bias && bias?.data.length !== dense.outFeatures) throw new Error(`${dense.weightsPath}: expected linear.bias [${dense.outFeatures}] (the Dense config says bias: true)`);
  const x = linear(b, hidden, weight, bias, 'slabserve_colbert');
  return normalizeLast(b, dense.activation === 'tanh' ? b.op('Tanh', [x]) : x);
}

/**
 * BGE-M3's per-token heads from the token states [B,T,H], as FlagEmbedding
 * computes them: each token's colbert vector, colbert_linear(h) L2-normalised,
 * and its sparse weight, relu(sparse_linear(h)), side by side: [B,T,dim+1].
 * Which tokens count ([CLS] never for colbert; the specials never for sparse)
 * is the gateway's (core/m3.ts): it has the ids.
 */
function m3Heads(b: GraphBuilder, hidden: string, m3: M3Spec): string {
  const head = (path: string, name: string) => {
    const t = readSafetensors(path); // shapes checked at load (model-config.ts)
    return linear(b, hidden, t.get('weight')!, t.get('bias'), name);
  };
  const colbert = normalizeLast(b, head(m3.colbert.weightsPath, 'slabserve_m3_colbert'));
  const sparse = b.op('Relu', [head(m3.sparse.weightsPath, 'slabserve_m3_sparse')]);
  return b.op('Concat', [colbert, sparse], { axis: 2 });
}

/** x W^T (+ bias) over the last axis of [B,T,in], for a torch Linear's weight [out, in]. */
function linear(b: GraphBuilder, x: string, weight: F32Tensor, bias: F32Tensor | undefined, name: string): string {
  const [out, inp] = weight.shape as [number, number];
  const wt = new Float32Array(inp * out); // MatMul takes [in, out]: the weight transposed
  for (let o = 0; o < out; o++) for (let i = 0; i < inp; i++) wt[i * out + o] = weight.data[o * inp + i]!;
  const y = b.op('MatMul', [x, b.addInitializer(`${name}_weight`, 'float', wt, [inp, out])]);
  return bias ? b.op('Add', [y, b.addInitializer(`${name}_bias`, 'float', bias.data, [out])]) : y;
}

/** Each vector of [B,T,D] over its L2 norm (at least 1e-12), as torch's F.normalize. */
function normalizeLast(b: GraphBuilder, x: string): string {
  const norm = b.op('Sqrt', [b.op('ReduceSum', [b.op('Mul', [x, x]), axes(b, 2)], { keepdims: 1 })]);
  return b.op('Div', [x, b.op('Max', [norm, scalar(b, 'slabserve_eps_norm', 1e-12)])]);
}

/**
 * SPLADE's row per input from the masked-LM logits [B,T,V], as
 * sentence-transformers' SpladePooling computes it: the logits times the mask,
 * relu, log1p (twice for log1p_relu), then max or sum over T. Padding gives
 * log1p(relu(0)) = 0, which neither a max of values >= 0 nor a sum changes.
 *
 * With max, the max is taken first: relu and log1p rise with their input, so
 * f(max x) is max f(x), the same float (f of the same element). The [B,T,V]
 * tensor, the largest any model here makes, is then read twice (mask, max)
 * instead of written four times more; on CPU those writes would be most of
 * the run (docs/tuning.md, Memory).
 */
function spladePool(b: GraphBuilder, logits: string, s: SpladeSettings, opset: number, maskInput: string): string {
  const mask = b.op('Unsqueeze', [b.op('Cast', [maskInput], { to: onnx.TensorProto.DataType.FLOAT }), axes(b, 2)]); // [B,T,1]
  const log1p = (x: string) => b.op('Log', [b.op('Add', [x, scalar(b, 'slabserve_one', 1)])]);
  const activate = (x: string) => (s.activation === 'log1p_relu' ? log1p(log1p(b.op('Relu', [x]))) : log1p(b.op('Relu', [x])));
  const masked = b.op('Mul', [logits, mask]);
  if (s.strategy === 'sum') return b.op('ReduceSum', [activate(masked), axes(b, 1)], { keepdims: 0 });
  const max = opset >= 18 ? b.op('ReduceMax', [masked, axes(b, 1)], { keepdims: 0 }) : b.op('ReduceMax', [masked], { axes: [1], keepdims: 0 });
  return activate(max);
}

/** The running count of the mask along each row, [B,T,1]: 1, 2, ... n over the real tokens. */
function positionsCounted(b: GraphBuilder, mask: string): string {
  const axis = b.has('slabserve_axis_1') ? 'slabserve_axis_1' : b.addInitializer('slabserve_axis_1', 'int64', [1], []);
  return b.op('CumSum', [mask, axis]);
}
