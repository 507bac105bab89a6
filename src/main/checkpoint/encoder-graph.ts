/**
 * A BERT-family encoder as an ONNX graph with the inputs and outputs of a
 * Hugging Face export (optimum / torch.onnx), so everything downstream treats
 * it as one. Two forms (GraphForm): `export`, op by op as an export is (the
 * model generator's stand-ins for exports, which the load-time rewriter then
 * fuses), and `fused`, written directly in onnxruntime's fused ops, one
 * Attention and two SkipLayerNormalizations per layer (the rewriter's form),
 * computing in float32 or float16 (checkpoints). Where its weights come from
 * is the caller's: a checkpoint (checkpoint-params.ts) or the model
 * generator's random ones (models/generator/bert-graph.ts).
 *
 * Graph (opset 17):
 *   inputs  input_ids, attention_mask [, token_type_ids] [, position_ids]: int64 [batch_size, sequence_length]
 *   embeddings = LayerNorm(word[input_ids] + type[token_type_ids] + position[ids])  (then a projection where E != H)
 *   mask bias  = (1 - Cast<float>(Unsqueeze(attention_mask, [1, 2]))) * float32_min   [B, 1, 1, T]
 *   N x layer (post-LN):
 *     probs = Softmax(q·kᵀ / sqrt(head_dim) + mask bias)
 *     x     = LayerNorm(x + (probs·v merged)·Wo + bo)
 *     x     = LayerNorm(x + act(x·Wi + bi)·Wo2 + bo2)
 *   head 'hidden':   last_hidden_state [B, T, H]
 *   head 'classify': logits [B, L] = out(act(dense(x[:, 0])))   (BERT's pooler + classifier, RoBERTa's and ELECTRA's
 *                    classification head, DistilBERT's pre_classifier: one shape, their own activations)
 *   head 'mlm':      logits [B, T, V] = LayerNorm(act(dense(x)))·decoder + bias
 *
 * The additive mask uses the most negative float32 as transformers does: a padded
 * key scores about -3.4e38, which Softmax turns into exactly 0, so real positions'
 * outputs do not depend on what the padding holds.
 *
 * The fused form, per layer: Attention(x, [Wq Wk Wv], [bq bk bv], mask as int32
 * [, MPNet's bias]); SkipLayerNormalization(ctx·Wo, x, bo); the feed-forward's
 * GELU as BiasGelu (erf) or FastGelu (tanh) with its bias inside;
 * SkipLayerNormalization(h·Wo2, x, bo2). The embeddings' sum is a
 * SkipLayerNormalization of words (+ types) and positions. In float16, every
 * weight is stored and computed in float16 and the outputs are cast to float32.
 */
import { GraphBuilder, concatColumns, encodeModel, makeModel, onnx } from '../../shared/model-format/onnx-graph.js';

/** The activations transformers' configs name, by the formula each computes. */
export type Activation = 'gelu' | 'gelu_tanh' | 'relu' | 'silu' | 'tanh';

export type EncoderHead = 'hidden' | 'classify' | 'mlm';

/** How the graph computes: op by op as an export (float32), or in onnxruntime's fused ops, in float32 or float16. */
export interface GraphForm {
  fused: boolean;
  dtype: 'fp32' | 'fp16';
}

export const EXPORT_FORM: GraphForm = { fused: false, dtype: 'fp32' };

/** The mask fill of the fused form's Attention in float16: onnxruntime's default, which float16 holds (float32's min is -inf there). */
const FLOAT16_MASK_FILL = -10000;

/** The structure of one encoder: sizes, and what differs between the families. */
export interface EncoderShape {
  layers: number;
  hidden: number;
  heads: number;
  intermediate: number;
  vocabSize: number;
  maxPositions: number;
  /** Token types the embedding table has; 0: none (DistilBERT). */
  typeVocabSize: number;
  /** false: no token_type_ids input, every token gets type 0's row (the RoBERTa family, whose table has one row). */
  tokenTypeIds: boolean;
  /** The width of the embeddings where it is not the hidden size (ELECTRA): a projection follows their LayerNorm. */
  embeddingSize?: number;
  layerNormEps: number;
  /** The feed-forward block's activation (hidden_act). */
  activation: Activation;
  /** The RoBERTa family's positions: cumsum(ids != pad) * (ids != pad) + pad. Absent: 0..T-1. */
  positionPaddingIdx?: number;
  /** A position_ids input instead of positions computed in the graph (decoder exports). */
  positionIdsInput?: boolean;
  /** Causal attention (each token attends to itself and those before it). */
  causal?: boolean;
  /**
   * MPNet's relative position bias: a table of `buckets` rows (a value per head), indexed by the
   * bucket of each key's distance from the query, added to every layer's scores.
   */
  relativeBuckets?: number;
  head: EncoderHead;
  /** head 'classify': logits; and the activation between its two dense layers. */
  numLabels?: number;
  classifierActivation?: Activation;
  /** head 'mlm': the activation of its transform. */
  mlmActivation?: Activation;
}

/** What a weight is for: generated weights pick their random scale by it; a checkpoint's ignore it. */
export type LinearRole = 'query' | 'key' | 'value' | 'attention-output' | 'intermediate' | 'output' | 'pooler' | 'classifier' | 'projection' | 'mlm-transform';
export type EmbeddingRole = 'word' | 'position' | 'token-type' | 'relative-bias';

/**
 * The weights by the names of transformers' BertModel (embeddings.word_embeddings,
 * encoder.layer.0.attention.self.query, ...; the heads as pooler.dense and classifier,
 * cls.predictions.*). Each returns float32 data for the shapes asked.
 */
export interface EncoderParams {
  /** A Linear layer: weight laid out [fanIn, fanOut] (ready for MatMul), bias [fanOut]. */
  linear(name: string, fanIn: number, fanOut: number, role: LinearRole): { weight: Float32Array; bias: Float32Array };
  /** An embedding table [rows, width]. */
  embedding(name: string, rows: number, width: number, role: EmbeddingRole): Float32Array;
  layerNorm(name: string, width: number): { weight: Float32Array; bias: Float32Array };
  /** The masked-LM decoder over the vocabulary: weight [hidden, vocab] (the word embeddings' transpose where tied), bias [vocab]. */
  decoder(hidden: number, vocab: number): { weight: Float32Array; bias: Float32Array };
}

/** The model's input names, in the order an export declares them. */
export const ENCODER_INPUT_NAMES = ['input_ids', 'attention_mask', 'token_type_ids'] as const;
export const BATCH_DIM = 'batch_size';
export const SEQUENCE_DIM = 'sequence_length';

/** Most negative finite float32 (torch.finfo(torch.float32).min). */
const FLOAT32_MIN = -3.4028234663852886e38;

/** Layer `layer`'s attention probabilities ([B, heads, T, T], after Softmax): not an output; tests expose it. */
export function attentionProbsName(layer: number): string {
  return `/encoder/layer.${layer}/attention/self/Softmax_output_0`;
}

/** The graph under construction, its weights and the constants its parts share. */
class Parts {
  readonly c: { zero: string; one64: string };
  private readonly exportConstants: ReturnType<typeof sharedConstants>['exportForm'];
  /** The element type of weights and activations. */
  readonly float: 'float' | 'float16';

  constructor(
    readonly b: GraphBuilder,
    readonly shape: EncoderShape,
    readonly params: EncoderParams,
    readonly form: GraphForm,
  ) {
    this.float = form.dtype === 'fp16' ? 'float16' : 'float';
    const { exportForm, ...ints } = sharedConstants(b, shape, form.fused);
    this.c = ints;
    this.exportConstants = exportForm;
  }

  /** The export form's float and shape constants (the fused form has none). */
  get e(): NonNullable<ReturnType<typeof sharedConstants>['exportForm']> {
    if (!this.exportConstants) throw new Error('the fused form has no export-form constants');
    return this.exportConstants;
  }

  weight(name: string, data: Float32Array, dims: number[]): string {
    return this.b.addInitializer(name, this.float, data, dims);
  }

  /** The weight and bias initializers of a Linear layer. */
  linear(name: string, fanIn: number, fanOut: number, role: LinearRole): { w: string; bias: string } {
    const { weight, bias } = this.params.linear(name, fanIn, fanOut, role);
    return { w: this.weight(`${name}.weight`, weight, [fanIn, fanOut]), bias: this.weight(`${name}.bias`, bias, [fanOut]) };
  }

  /** x @ W + bias. */
  dense(x: string, name: string, fanIn: number, fanOut: number, role: LinearRole): string {
    const { w, bias } = this.linear(name, fanIn, fanOut, role);
    return this.b.op('Add', [this.b.op('MatMul', [x, w]), bias]);
  }

  /** act(x @ W + bias); fused, GELU's two forms are BiasGelu and FastGelu, the bias inside. */
  denseAct(x: string, name: string, fanIn: number, fanOut: number, role: LinearRole, act: Activation): string {
    if (!this.form.fused || (act !== 'gelu' && act !== 'gelu_tanh')) return this.activation(this.dense(x, name, fanIn, fanOut, role), act);
    const { w, bias } = this.linear(name, fanIn, fanOut, role);
    return this.b.msOp(act === 'gelu' ? 'BiasGelu' : 'FastGelu', [this.b.op('MatMul', [x, w]), bias]);
  }

  layerNorm(x: string, name: string, width = this.shape.hidden): string {
    const { weight, bias } = this.params.layerNorm(name, width);
    const gamma = this.weight(`${name}.weight`, weight, [width]);
    const beta = this.weight(`${name}.bias`, bias, [width]);
    return this.b.op('LayerNormalization', [x, gamma, beta], { axis: -1, epsilon: { f: this.shape.layerNormEps } });
  }

  /** LayerNorm(x + skip [+ bias]) as one SkipLayerNormalization. */
  skipLayerNorm(x: string, skip: string, name: string, bias?: string, width = this.shape.hidden): string {
    const { weight, bias: beta } = this.params.layerNorm(name, width);
    const inputs = [x, skip, this.weight(`${name}.weight`, weight, [width]), this.weight(`${name}.bias`, beta, [width]), ...(bias ? [bias] : [])];
    return this.b.msOp('SkipLayerNormalization', inputs, { epsilon: { f: this.shape.layerNormEps } });
  }

  /** LayerNorm(x @ W + bias + residual): an encoder layer's two residual blocks. */
  projectedNorm(x: string, residual: string, dense: string, fanIn: number, role: LinearRole, norm: string): string {
    if (!this.form.fused) return this.layerNorm(this.b.op('Add', [this.dense(x, dense, fanIn, this.shape.hidden, role), residual]), norm);
    const { w, bias } = this.linear(dense, fanIn, this.shape.hidden, role);
    return this.skipLayerNorm(this.b.op('MatMul', [x, w]), residual, norm, bias);
  }

  activation(x: string, kind: Activation): string {
    return activationOp(this.b, x, kind);
  }
}

/** Scalar float constants by name, one initializer each per graph (the parts that use one share it). */
const scalars = new WeakMap<GraphBuilder, Map<string, string>>();

export function floatConstant(b: GraphBuilder, name: string, value: number): string {
  let named = scalars.get(b);
  if (!named) scalars.set(b, (named = new Map()));
  return named.get(name) ?? named.set(name, b.addInitializer(name, 'float', [value], [])).get(name)!;
}

/** `kind` applied to x. */
export function activationOp(b: GraphBuilder, x: string, kind: Activation): string {
  const c = (name: string, v: number) => floatConstant(b, name, v);
  switch (kind) {
    case 'gelu': // x * 0.5 * (1 + erf(x / sqrt(2)))
      return b.op('Mul', [b.op('Mul', [x, b.op('Add', [b.op('Erf', [b.op('Div', [x, c('/Constant_sqrt2', Math.SQRT2)])]), c('/Constant_one_float', 1)])]), c('/Constant_half', 0.5)]);
    case 'gelu_tanh': { // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
      const cube = b.op('Mul', [b.op('Mul', [x, x]), x]);
      const inner = b.op('Mul', [b.op('Add', [x, b.op('Mul', [cube, c('/Constant_gelu_cubic', 0.044715)])]), c('/Constant_sqrt_2_over_pi', Math.sqrt(2 / Math.PI))]);
      return b.op('Mul', [b.op('Mul', [x, c('/Constant_half', 0.5)]), b.op('Add', [c('/Constant_one_float', 1), b.op('Tanh', [inner])])]);
    }
    case 'relu':
      return b.op('Relu', [x]);
    case 'silu':
      return b.op('Mul', [x, b.op('Sigmoid', [x])]);
    case 'tanh':
      return b.op('Tanh', [x]);
  }
}

/**
 * The scalar and shape constants the graph's parts share, listed first so a graph's bytes depend
 * only on its inputs. The fused form needs only the integers (its ops take the mask and heads as they are).
 */
function sharedConstants(b: GraphBuilder, shape: EncoderShape, fused: boolean) {
  const headDim = shape.hidden / shape.heads;
  const cI64 = (name: string, v: number[] | number): string => b.addInitializer(name, 'int64', Array.isArray(v) ? v : [v], Array.isArray(v) ? [v.length] : []);
  const cF32 = (name: string, v: number): string => floatConstant(b, name, v);
  const ints = { zero: cI64('/Constant_zero', 0), one64: cI64('/Constant_one', 1) };
  const unfused = () => ({
    oneF: cF32('/Constant_one_float', 1),
    minF: cF32('/Constant_float32_min', FLOAT32_MIN),
    sqrtHeadDim: cF32('/Constant_sqrt_head_dim', Math.sqrt(headDim)),
    sqrt2: cF32('/Constant_sqrt2', Math.SQRT2),
    half: cF32('/Constant_half', 0.5),
    splitShape: cI64('/Constant_split_heads_shape', [0, 0, shape.heads, headDim]),
    mergeShape: cI64('/Constant_merge_heads_shape', [0, 0, shape.hidden]),
    maskAxes: cI64('/Constant_mask_axes', [1, 2]),
  });
  return { ...ints, exportForm: fused ? undefined : unfused() };
}

interface Inputs {
  inputIds: string;
  attentionMask: string;
  tokenTypeIds: string | null;
  positionIds: string | null;
}

function addInputs(b: GraphBuilder, shape: EncoderShape): Inputs {
  const dims = [BATCH_DIM, SEQUENCE_DIM];
  return {
    inputIds: b.addInput('input_ids', 'int64', dims),
    attentionMask: b.addInput('attention_mask', 'int64', dims),
    tokenTypeIds: shape.tokenTypeIds ? b.addInput('token_type_ids', 'int64', dims) : null,
    positionIds: shape.positionIdsInput ? b.addInput('position_ids', 'int64', dims) : null,
  };
}

/** Word + token type + position embeddings, layer-normed (and projected to the hidden size where narrower): [B, T, H]. */
function embeddings(g: Parts, inputs: Inputs): string {
  const { b, shape, params, c } = g;
  const E = shape.embeddingSize ?? shape.hidden;
  return b.scoped('embeddings', () => {
    const table = (name: string, rows: number, role: EmbeddingRole) => g.weight(`${name}.weight`, params.embedding(name, rows, E, role), [rows, E]);
    const wordEmb = table('embeddings.word_embeddings', shape.vocabSize, 'word');
    const posEmb = table('embeddings.position_embeddings', shape.maxPositions, 'position');
    const typeEmb = shape.typeVocabSize > 0 ? table('embeddings.token_type_embeddings', shape.typeVocabSize, 'token-type') : null;
    const words = b.op('Gather', [wordEmb, inputs.inputIds], { axis: 0 }); // [B, T, E]
    // No token_type_ids input: type 0's row, broadcast over every token.
    const types = typeEmb && b.op('Gather', [typeEmb, inputs.tokenTypeIds ?? c.zero], { axis: 0 });
    const positionIds = inputs.positionIds ?? positionIdsOf(b, inputs.inputIds, shape.positionPaddingIdx, c.zero, c.one64);
    const positions = b.op('Gather', [posEmb, positionIds], { axis: 0 });
    const lookedUp = types ? b.op('Add', [words, types]) : words;
    const normed = g.form.fused ? g.skipLayerNorm(lookedUp, positions, 'embeddings.LayerNorm', undefined, E) : g.layerNorm(b.op('Add', [lookedUp, positions]), 'embeddings.LayerNorm', E);
    return shape.embeddingSize === undefined ? normed : g.dense(normed, 'embeddings_project', E, shape.hidden, 'projection');
  });
}

/**
 * BERT: arange(T) (Shape -> Gather(index 1) -> Range(0, T, 1)). The RoBERTa
 * family: cumsum(ids != pad) * (ids != pad) + pad, per row.
 */
function positionIdsOf(b: GraphBuilder, inputIds: string, paddingIdx: number | undefined, zero: string, one64: string): string {
  if (paddingIdx === undefined) {
    const seqLen = b.op('Gather', [b.op('Shape', [inputIds]), one64], { axis: 0 });
    return b.op('Range', [zero, seqLen, one64]);
  }
  const pad = b.addInitializer('/Constant_padding_idx', 'int64', [paddingIdx], []);
  const real = b.op('Cast', [b.op('Not', [b.op('Equal', [inputIds, pad])])], { to: onnx.TensorProto.DataType.INT64 });
  return b.op('Add', [b.op('Mul', [b.op('CumSum', [real, one64]), real]), pad]);
}

/**
 * MPNet's relative position bias, [1, heads, T, T]: the bucket of each (query i, key j) read from a
 * table by i - j (precomputed: `relativeBucket`), then the bias table's row for it. transformers
 * computes it once for every layer, as the graph does.
 */
function relativePositionBias(g: Parts, inputs: Inputs): string {
  const { b, shape, params, c } = g;
  const P = shape.maxPositions;
  const buckets = Array.from({ length: 2 * P - 1 }, (_, k) => relativeBucket(k - (P - 1)));
  const table = b.addInitializer('/Constant_relative_buckets', 'int64', buckets, [2 * P - 1]);
  const bias = g.weight('encoder.relative_attention_bias.weight', params.embedding('encoder.relative_attention_bias', shape.relativeBuckets!, shape.heads, 'relative-bias'), [shape.relativeBuckets!, shape.heads]);
  const seqLen = b.op('Gather', [b.op('Shape', [inputs.inputIds]), c.one64], { axis: 0 });
  const t = b.op('Range', [c.zero, seqLen, c.one64]);
  const [axis0, axis1] = [0, 1].map((k) => b.addInitializer(`/Constant_axes_${k}`, 'int64', [k], [1]));
  const offset = b.addInitializer('/Constant_relative_offset', 'int64', [P - 1], []);
  const distance = b.op('Add', [b.op('Sub', [b.op('Unsqueeze', [t, axis1!]), b.op('Unsqueeze', [t, axis0!])]), offset]); // [T, T]: i - j + P - 1
  const values = b.op('Gather', [bias, b.op('Gather', [table, distance], { axis: 0 })], { axis: 0 }); // [T, T, heads]
  return b.op('Unsqueeze', [b.op('Transpose', [values], { perm: [2, 0, 1] }), axis0!]);
}

/**
 * transformers' MPNet relative_position_bucket for a query at i and a key at j, given i - j: 32
 * buckets and a max distance of 128 whatever the config says; keys to the right take the upper
 * half; distances under 8 exact, then logarithmic up to 128 (computed in doubles: the same buckets
 * as transformers' float32 computation, test/checkpoints.test.ts holds it).
 */
export function relativeBucket(iMinusJ: number): number {
  const half = 16;
  const maxExact = 8;
  let bucket = iMinusJ < 0 ? half : 0;
  const n = Math.abs(iMinusJ);
  if (n < maxExact) return bucket + n;
  const large = maxExact + Math.floor((Math.log(n / maxExact) / Math.log(128 / maxExact)) * (half - maxExact) + 1e-9);
  bucket += Math.min(large, half - 1);
  return bucket;
}

/**
 * What each layer's attention masks with. Export form: the extended attention mask,
 * (1 - mask[:, None, None, :]) * float32_min, plus the causal mask for decoders or MPNet's
 * relative bias. Fused form: the mask as int32 (Attention's mask_index), and MPNet's bias apart.
 */
interface AttentionMask {
  additive?: string;
  index?: string;
  bias?: string;
}

function attentionMask(g: Parts, inputs: Inputs): AttentionMask {
  const { b, shape } = g;
  if (!g.form.fused) return { additive: additiveMask(g, inputs) };
  const index = b.scoped('attention_mask', () => b.op('Cast', [inputs.attentionMask], { to: onnx.TensorProto.DataType.INT32 }));
  return shape.relativeBuckets !== undefined ? { index, bias: relativePositionBias(g, inputs) } : { index };
}

function additiveMask(g: Parts, inputs: Inputs): string {
  const { b, shape } = g;
  const c = { ...g.c, ...g.e };
  return b.scoped('extended_attention_mask', () => {
    const m = b.op('Cast', [b.op('Unsqueeze', [inputs.attentionMask, c.maskAxes])], { to: onnx.TensorProto.DataType.FLOAT });
    const padding = b.op('Mul', [b.op('Sub', [c.oneF, m]), c.minF]); // [B, 1, 1, T]
    if (shape.relativeBuckets !== undefined) return b.op('Add', [relativePositionBias(g, inputs), padding]); // [B, heads, T, T]
    if (!shape.causal) return padding;
    // Key j after query i: float32 min too ([T, T], broadcast to [B, 1, T, T]). Both at once
    // sum to -inf, which Softmax turns into the same exact 0.
    const seqLen = b.op('Gather', [b.op('Shape', [inputs.inputIds]), c.one64], { axis: 0 });
    const t = b.op('Range', [c.zero, seqLen, c.one64]);
    const axis = (k: number) => b.addInitializer(`/Constant_axes_${k}`, 'int64', [k], [1]);
    const later = b.op('Greater', [b.op('Unsqueeze', [t, axis(0)]), b.op('Unsqueeze', [t, axis(1)])]); // [T, T]: j > i
    return b.op('Add', [padding, b.op('Mul', [b.op('Cast', [later], { to: onnx.TensorProto.DataType.FLOAT }), c.minF])]);
  });
}

/** Multi-head self-attention of layer `p` over x: [B, T, H]. */
function selfAttention(g: Parts, p: string, x: string, mask: AttentionMask): string {
  if (g.form.fused) return fusedSelfAttention(g, p, x, mask);
  const { b } = g;
  const c = g.e;
  const bias = mask.additive!;
  const H = g.shape.hidden;
  return b.scoped('self', () => {
    const heads = (t: string, perm: number[]) => b.op('Transpose', [b.op('Reshape', [t, c.splitShape])], { perm });
    const q = heads(g.dense(x, `${p}.attention.self.query`, H, H, 'query'), [0, 2, 1, 3]); // [B, NH, T, D]
    const kT = heads(g.dense(x, `${p}.attention.self.key`, H, H, 'key'), [0, 2, 3, 1]); // [B, NH, D, T]
    const v = heads(g.dense(x, `${p}.attention.self.value`, H, H, 'value'), [0, 2, 1, 3]); // [B, NH, T, D]
    const scores = b.op('Add', [b.op('Div', [b.op('MatMul', [q, kT]), c.sqrtHeadDim]), bias]);
    const probs = b.op('Softmax', [scores], { axis: -1 });
    const merged = b.op('Transpose', [b.op('MatMul', [probs, v])], { perm: [0, 2, 1, 3] }); // [B, T, NH, D]
    return b.op('Reshape', [merged, c.mergeShape]); // [B, T, H]
  });
}

/** One com.microsoft Attention: Q, K and V as one [H, 3H] projection, the mask as int32, MPNet's bias as attention_bias. */
function fusedSelfAttention(g: Parts, p: string, x: string, mask: AttentionMask): string {
  const H = g.shape.hidden;
  const qkv = (['query', 'key', 'value'] as const).map((k) => g.params.linear(`${p}.attention.self.${k}`, H, H, k));
  const w = g.weight(`${p}.attention.self.qkv.weight`, concatColumns(qkv.map((t) => t.weight), H), [H, 3 * H]);
  const bias = g.weight(`${p}.attention.self.qkv.bias`, Float32Array.from(qkv.flatMap((t) => [...t.bias])), [3 * H]);
  const fill = g.form.dtype === 'fp16' ? FLOAT16_MASK_FILL : FLOAT32_MIN;
  return g.b.scoped('self', () => g.b.msOp('Attention', [x, w, bias, mask.index!, ...(mask.bias ? ['', mask.bias] : [])], { num_heads: g.shape.heads, mask_filter_value: { f: fill } }));
}

/** Encoder layer `l`: attention, then the feed-forward block, each with its residual and LayerNorm. */
function encoderLayer(g: Parts, l: number, x: string, mask: AttentionMask): string {
  const { b } = g;
  const { hidden: H, intermediate: I } = g.shape;
  const p = `encoder.layer.${l}`;
  return b.scoped(`encoder/layer.${l}`, () => {
    const attnOut = b.scoped('attention', () => {
      const ctx = selfAttention(g, p, x, mask);
      return b.scoped('output', () => g.projectedNorm(ctx, x, `${p}.attention.output.dense`, H, 'attention-output', `${p}.attention.output.LayerNorm`));
    });
    const inter = b.scoped('intermediate', () => g.denseAct(attnOut, `${p}.intermediate.dense`, H, I, 'intermediate', g.shape.activation));
    return b.scoped('output', () => g.projectedNorm(inter, attnOut, `${p}.output.dense`, I, 'output', `${p}.output.LayerNorm`));
  });
}

/** `x` as float32 graph output `name` (cast where the graph computes in float16). */
export function floatOutput(b: GraphBuilder, x: string, name: string, dims: (number | string)[], float16 = false): void {
  b.node(float16 ? 'Cast' : 'Identity', [x], float16 ? { to: onnx.TensorProto.DataType.FLOAT } : undefined, [name]);
  b.addOutput(name, 'float', dims);
}

/** x as the graph's output last_hidden_state [B, T, hidden], as a bare model's export names it. */
export function hiddenStatesOutput(b: GraphBuilder, x: string, hidden: number, float16 = false): void {
  floatOutput(b, x, 'last_hidden_state', [BATCH_DIM, SEQUENCE_DIM, hidden], float16);
}

/** The outputs: last_hidden_state, the classification head's logits, or the masked-LM logits. */
function addHead(g: Parts, x: string): void {
  const { b, shape, params } = g;
  const H = shape.hidden;
  const float16 = g.form.dtype === 'fp16';
  if (shape.head === 'hidden') return hiddenStatesOutput(b, x, H, float16);
  if (shape.head === 'mlm') {
    b.scoped('cls', () => {
      const h = g.denseAct(x, 'cls.predictions.transform.dense', H, H, 'mlm-transform', shape.mlmActivation ?? shape.activation);
      const t = g.layerNorm(h, 'cls.predictions.transform.LayerNorm');
      const { weight, bias } = params.decoder(H, shape.vocabSize);
      const w = g.weight('cls.predictions.decoder.weight', weight, [H, shape.vocabSize]);
      const bi = g.weight('cls.predictions.bias', bias, [shape.vocabSize]);
      const sum = [b.op('MatMul', [t, w]), bi];
      if (float16) b.node('Cast', [b.op('Add', sum)], { to: onnx.TensorProto.DataType.FLOAT }, ['logits']);
      else b.node('Add', sum, undefined, ['logits']);
    });
    b.addOutput('logits', 'float', [BATCH_DIM, SEQUENCE_DIM, shape.vocabSize]);
    return;
  }
  const pooled = b.scoped('pooler', () => {
    const first = b.op('Gather', [x, g.c.zero], { axis: 1 }); // [B, H]: the first token ([CLS], <s>)
    return g.denseAct(first, 'pooler.dense', H, H, 'pooler', shape.classifierActivation ?? 'tanh');
  });
  b.scoped('classifier', () => floatOutput(b, g.dense(pooled, 'classifier', H, shape.numLabels!, 'classifier'), 'logits', [BATCH_DIM, shape.numLabels!], float16));
}

/** Checks the sizes; throws a RangeError naming the first that cannot make a graph. */
export function checkEncoderShape(shape: EncoderShape): void {
  const ints: (keyof EncoderShape)[] = ['layers', 'hidden', 'heads', 'intermediate', 'vocabSize', 'maxPositions'];
  for (const k of ints) {
    const v = shape[k];
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 1) throw new RangeError(`${k} must be a positive integer, got ${String(v)}`);
  }
  if (!Number.isSafeInteger(shape.typeVocabSize) || shape.typeVocabSize < 0) throw new RangeError(`typeVocabSize must be an integer >= 0, got ${String(shape.typeVocabSize)}`);
  if (shape.hidden % shape.heads !== 0) throw new RangeError(`hidden (${shape.hidden}) must be a multiple of heads (${shape.heads})`);
  if (shape.head === 'classify' && !(Number.isSafeInteger(shape.numLabels) && shape.numLabels! >= 1)) throw new RangeError('a classification head needs numLabels >= 1');
}

function checkForm(shape: EncoderShape, form: GraphForm): void {
  if (form.dtype === 'fp16' && !form.fused) throw new RangeError('a float16 graph is built in the fused form');
  if (form.fused && shape.causal) throw new RangeError('the fused form is for encoders (no causal attention)');
}

/** The encoder's graph (not yet wrapped in a model). */
export function buildEncoderGraph(name: string, shape: EncoderShape, params: EncoderParams, form: GraphForm = EXPORT_FORM): onnx.IGraphProto {
  checkEncoderShape(shape);
  checkForm(shape, form);
  const g = new Parts(new GraphBuilder(name), shape, params, form);
  const inputs = addInputs(g.b, shape);
  let x = embeddings(g, inputs);
  const mask = attentionMask(g, inputs);
  for (let l = 0; l < shape.layers; l++) x = encoderLayer(g, l, x, mask);
  addHead(g, x);
  return g.b.graph();
}

/** The model around `graph`: opset 17, IR 8, with `metadata` in its properties. */
export function encoderModel(graph: onnx.IGraphProto, docString: string, metadata: Record<string, string>): onnx.IModelProto {
  return makeModel(graph, { opset: 17, irVersion: 8, docString, metadata });
}

/** The serialised model (encoderModel). */
export function encodeEncoderModel(graph: onnx.IGraphProto, docString: string, metadata: Record<string, string>): Uint8Array {
  return encodeModel(encoderModel(graph, docString, metadata));
}
