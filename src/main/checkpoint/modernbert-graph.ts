/**
 * A ModernBERT encoder as an ONNX graph, as transformers' modeling_modernbert.py
 * computes it on its eager path: no position embeddings; pre-LayerNorm blocks
 * (none before layer 0's attention) and a final norm; one Wqkv projection
 * (split here into q, k and v); rotary embeddings (half rotation) with the
 * global theta on global layers and the local theta on the others, whose
 * attention sees only keys within local_attention / 2; a GeGLU feed-forward
 * block (the activation on the first half of Wi's output, times the second);
 * biases only where the config says so.
 *
 * Written in onnxruntime's fused ops: each residual sum and the LayerNorm
 * after it as one SkipLayerNormalization (which also gives the sum, the next
 * block's residual); q and k rotated by RotaryEmbedding, the attention one
 * MultiHeadAttention (the padding as its key_padding_mask, a local layer's
 * window as its attention_bias); GELU as Gelu or FastGelu. In float32 or
 * float16 (weights, activations and the masks; the rotary angles computed in
 * float32 and cast, as transformers does), float32 out.
 *
 * Masked keys take -10000 (onnxruntime's mask fill) where transformers takes
 * float32's min: either is exactly 0 after Softmax for a real query, and a
 * padded query whose every key is masked stays finite (the padding and the
 * window both at float32's min would sum to -inf, and its NaN would reach the
 * real rows through the next layer's values).
 *
 *   inputs  input_ids, attention_mask: int64 [batch_size, sequence_length]
 *   head 'hidden':   last_hidden_state [B, T, H]
 *   head 'classify': logits [B, L] = classifier(norm(act(dense(pool(x)))))  (pool: cls or the masked mean)
 *   head 'mlm':      logits [B, T, V] = decoder(norm(act(dense(x))))        (the decoder tied to the embeddings)
 */
import { GraphBuilder, MS_DOMAIN, onnx } from '../../shared/model-format/onnx-graph.js';
import type { BuiltDtype } from '../../shared/model-format/model-config.js';
import type { Activation, EncoderHead } from './encoder-graph.js';
import { BATCH_DIM, SEQUENCE_DIM, activationOp, floatOutput, hiddenStatesOutput } from './encoder-graph.js';

export interface ModernBertShape {
  layers: number;
  hidden: number;
  heads: number;
  intermediate: number;
  vocabSize: number;
  normEps: number;
  /** Which layers attend only within the local window (the others globally). */
  localLayers: boolean[];
  /** Keys a local layer's query sees: |i - j| <= localWindow / 2. */
  localWindow: number;
  globalTheta: number;
  localTheta: number;
  activation: Activation;
  head: EncoderHead;
  numLabels?: number;
  classifierActivation: Activation;
  classifierPooling: 'cls' | 'mean';
}

/** The weights by transformers' ModernBERT names (without the `model.` prefix); `undefined` for a bias the config leaves out. */
export interface ModernBertParams {
  /** A Linear layer's weight as [fanIn, fanOut] and its bias (undefined where the layer has none); `rows`: [start, end, total] of its output rows. */
  linear(name: string, fanIn: number, fanOut: number, rows?: [number, number, number]): { weight: Float32Array; bias: Float32Array | undefined };
  embedding(name: string, rows: number, width: number): Float32Array;
  norm(name: string, width: number): { weight: Float32Array; bias: Float32Array | undefined };
  /** The tied decoder: weight [hidden, vocab], its bias where the config has one. */
  decoder(hidden: number, vocab: number): { weight: Float32Array; bias: Float32Array | undefined };
}

/** What a masked key scores (header). */
const MASK_FILL = -10000;

class Parts {
  /** 0..T-1 (int64): made once, shared by every layer. */
  readonly positions: string;
  /** The element type of weights and activations, and its ONNX code (for Casts). */
  readonly float: 'float' | 'float16';
  readonly floatCode: number;

  constructor(
    readonly b: GraphBuilder,
    readonly shape: ModernBertShape,
    readonly params: ModernBertParams,
    ids: string,
    dtype: BuiltDtype,
  ) {
    this.float = dtype === 'fp16' ? 'float16' : 'float';
    this.floatCode = dtype === 'fp16' ? onnx.TensorProto.DataType.FLOAT16 : onnx.TensorProto.DataType.FLOAT;
    const zero = b.addInitializer('/Constant_zero', 'int64', [0], []);
    const one = b.addInitializer('/Constant_one', 'int64', [1], []);
    this.positions = b.op('Range', [zero, b.op('Gather', [b.op('Shape', [ids]), one], { axis: 0 }), one]);
  }

  scalar(name: string, v: number): string {
    return this.b.has(name) ? name : this.b.addInitializer(name, this.float, [v], []);
  }

  weight(name: string, data: Float32Array, dims: number[]): string {
    return this.b.addInitializer(name, this.float, data, dims);
  }

  /** `kind` applied to x: GELU's two forms as onnxruntime's Gelu and FastGelu. */
  activation(x: string, kind: Activation): string {
    if (kind === 'gelu' || kind === 'gelu_tanh') return this.b.msOp(kind === 'gelu' ? 'Gelu' : 'FastGelu', [x]);
    return activationOp(this.b, x, kind); // relu, silu, tanh: no constants
  }

  ints(name: string, v: number[]): string {
    return this.b.addInitializer(name, 'int64', v, [v.length]);
  }

  /** x @ W (+ bias); `rows` picks a slice of the layer's output rows (Wi's two halves). */
  dense(x: string, name: string, fanIn: number, fanOut: number, rows?: [number, number, number], suffix = ''): string {
    const { weight, bias } = this.params.linear(name, fanIn, fanOut, rows);
    const out = this.b.op('MatMul', [x, this.weight(`${name}${suffix}.weight`, weight, [fanIn, fanOut])]);
    return bias ? this.b.op('Add', [out, this.weight(`${name}${suffix}.bias`, bias, [fanOut])]) : out;
  }

  /** gamma and beta (where the config has biases) of norm `name`. */
  private normWeights(name: string): string[] {
    const { weight, bias } = this.params.norm(name, this.shape.hidden);
    return [this.weight(`${name}.weight`, weight, [this.shape.hidden]), ...(bias ? [this.weight(`${name}.bias`, bias, [this.shape.hidden])] : [])];
  }

  norm(x: string, name: string): string {
    return this.b.op('LayerNormalization', [x, ...this.normWeights(name)], { axis: -1, epsilon: { f: this.shape.normEps } });
  }

  /** norm(x + residual) and the sum x + residual, from one SkipLayerNormalization. */
  skipNorm(x: string, residual: string, name: string): { normed: string; sum: string } {
    const [normed, sum] = [`/${name}/normed`, `/${name}/residual_sum`];
    this.b.node('SkipLayerNormalization', [x, residual, ...this.normWeights(name)], { epsilon: { f: this.shape.normEps } }, [normed, '', '', sum], MS_DOMAIN);
    return { normed, sum };
  }
}

/** The encoder's graph. */
export function buildModernBertGraph(name: string, shape: ModernBertShape, params: ModernBertParams, dtype: BuiltDtype = 'fp32'): onnx.IGraphProto {
  const b = new GraphBuilder(name);
  const dims = [BATCH_DIM, SEQUENCE_DIM];
  const ids = b.addInput('input_ids', 'int64', dims);
  const mask = b.addInput('attention_mask', 'int64', dims);
  const g = new Parts(b, shape, params, ids, dtype);
  const tok = g.weight('embeddings.tok_embeddings.weight', params.embedding('embeddings.tok_embeddings', shape.vocabSize, shape.hidden), [shape.vocabSize, shape.hidden]);
  const embedded = g.norm(b.op('Gather', [tok, ids], { axis: 0 }), 'embeddings.norm');
  const masks = attentionMasks(g, mask);
  const rotary = new Map<number, { cos: string; sin: string }>();
  const rotaryOf = (theta: number) => rotary.get(theta) ?? rotary.set(theta, rotaryTables(g, theta, rotary.size)).get(theta)!;
  // The residual stream, and what the next attention reads: layer 0's attention has no norm before it.
  let stream = { normed: embedded, sum: embedded };
  for (let l = 0; l < shape.layers; l++) {
    const local = shape.localLayers[l]!;
    const next = l + 1 < shape.layers ? `layers.${l + 1}.attn_norm` : 'final_norm';
    const layerMasks = local ? masks : { padding: masks.padding };
    stream = b.scoped(`layers.${l}`, () => encoderLayer(g, l, stream, next, layerMasks, rotaryOf(local ? shape.localTheta : shape.globalTheta)));
  }
  addHead(g, stream.normed, mask);
  return b.graph();
}

/** The padding, as MultiHeadAttention's key_padding_mask (int32 [B, T]), and a local layer's window as its attention_bias ([1, 1, T, T]). */
function attentionMasks(g: Parts, mask: string): { padding: string; window: string } {
  const { b } = g;
  const padding = b.op('Cast', [mask], { to: onnx.TensorProto.DataType.INT32 });
  const t = g.positions;
  const distance = b.op('Abs', [b.op('Sub', [b.op('Unsqueeze', [t, g.ints('/Constant_axes_1', [1])]), b.op('Unsqueeze', [t, g.ints('/Constant_axes_0', [0])])])]);
  const outside = b.op('Greater', [distance, b.addInitializer('/Constant_half_window', 'int64', [Math.floor(g.shape.localWindow / 2)], [])]);
  const window = b.op('Where', [outside, g.scalar('/Constant_mask_fill', MASK_FILL), g.scalar('/Constant_zero_float', 0)]); // [T, T]
  return { padding, window: b.op('Unsqueeze', [window, g.ints('/Constant_bias_axes', [0, 1])]) };
}

/**
 * RotaryEmbedding's caches, [T, d / 2]: cos and sin of position * inv_freq, inv_freq = 1 / theta^(2i/d),
 * as ModernBertRotaryEmbedding makes them in float32 (the op rotates each half by the same angles).
 */
function rotaryTables(g: Parts, theta: number, index: number): { cos: string; sin: string } {
  const { b } = g;
  const d = g.shape.hidden / g.shape.heads;
  const inv = Float32Array.from({ length: d / 2 }, (_, i) => 1 / Math.fround(theta ** Math.fround((2 * i) / d)));
  const invFreq = b.addInitializer(`/Constant_inv_freq_${index}`, 'float', inv, [1, d / 2]);
  const pos = b.op('Cast', [b.op('Unsqueeze', [g.positions, g.ints(`/Constant_rotary_axis_${index}`, [1])])], { to: onnx.TensorProto.DataType.FLOAT }); // [T, 1]
  const freqs = b.op('Mul', [pos, invFreq]); // [T, d/2]
  const cast = (t: string) => (g.float === 'float' ? t : b.op('Cast', [t], { to: g.floatCode }));
  return { cos: cast(b.op('Cos', [freqs])), sin: cast(b.op('Sin', [freqs])) };
}

/** q or k [B, T, H] rotated by half (rotate_half's form, not interleaved), positions from 0. */
function rotate(g: Parts, x: string, cs: { cos: string; sin: string }): string {
  const start = g.b.has('/Constant_rotary_start') ? '/Constant_rotary_start' : g.b.addInitializer('/Constant_rotary_start', 'int64', [0], [1]);
  return g.b.msOp('RotaryEmbedding', [x, start, cs.cos, cs.sin], { interleaved: 0, num_heads: g.shape.heads });
}

/**
 * Layer `l` over the stream (`sum`, the residual; `normed`, its attn_norm): returns the next
 * stream, normed by `nextNorm` (the next layer's attn_norm, or the final norm).
 */
function encoderLayer(g: Parts, l: number, stream: { normed: string; sum: string }, nextNorm: string, masks: { padding: string; window?: string }, cs: { cos: string; sin: string }): { normed: string; sum: string } {
  const { b, shape } = g;
  const { hidden: H, heads, intermediate: I } = shape;
  const p = `layers.${l}`;
  const [q, k, v] = b.node('Split', [g.dense(stream.normed, `${p}.attn.Wqkv`, H, 3 * H), g.ints(`/${p}/Constant_qkv_split`, [H, H, H])], { axis: -1 }, 3) as [string, string, string];
  const inputs = [rotate(g, q, cs), rotate(g, k, cs), v, '', masks.padding, ...(masks.window ? [masks.window] : [])];
  const ctx = b.msOp('MultiHeadAttention', inputs, { num_heads: heads, mask_filter_value: { f: MASK_FILL } }); // [B, T, H]
  const h = g.skipNorm(g.dense(ctx, `${p}.attn.Wo`, H, H), stream.sum, `${p}.mlp_norm`);
  const input = g.dense(h.normed, `${p}.mlp.Wi`, H, I, [0, I, 2 * I], '_input');
  const gate = g.dense(h.normed, `${p}.mlp.Wi`, H, I, [I, 2 * I, 2 * I], '_gate');
  return g.skipNorm(g.dense(b.op('Mul', [g.activation(input, shape.activation), gate]), `${p}.mlp.Wo`, I, H), h.sum, nextNorm);
}

function addHead(g: Parts, x: string, mask: string): void {
  const { b, shape, params } = g;
  const H = shape.hidden;
  const float16 = g.float === 'float16';
  if (shape.head === 'hidden') return hiddenStatesOutput(b, x, H, float16);
  const headOf = (t: string) => g.norm(g.activation(g.dense(t, 'head.dense', H, H), shape.classifierActivation), 'head.norm');
  if (shape.head === 'mlm') {
    const { weight, bias } = params.decoder(H, shape.vocabSize);
    let logits = b.op('MatMul', [headOf(x), g.weight('decoder.weight', weight, [H, shape.vocabSize])]);
    if (bias) logits = b.op('Add', [logits, g.weight('decoder.bias', bias, [shape.vocabSize])]);
    return floatOutput(b, logits, 'logits', [BATCH_DIM, SEQUENCE_DIM, shape.vocabSize], float16);
  }
  let pooled: string;
  if (shape.classifierPooling === 'cls') {
    pooled = b.op('Gather', [x, b.addInitializer('/Constant_first', 'int64', [0], [])], { axis: 1 });
  } else {
    // (x * mask).sum(1) / mask.sum(1), summed in float32 (a long input's sum would overflow float16)
    const FLOAT = onnx.TensorProto.DataType.FLOAT;
    const m = b.op('Cast', [b.op('Unsqueeze', [mask, g.ints('/Constant_pool_axis', [-1])])], { to: FLOAT });
    const axis = g.ints('/Constant_sum_axis', [1]);
    const x32 = float16 ? b.op('Cast', [x], { to: FLOAT }) : x;
    pooled = b.op('Div', [b.op('ReduceSum', [b.op('Mul', [x32, m]), axis], { keepdims: 0 }), b.op('ReduceSum', [m, axis], { keepdims: 0 })]);
    if (float16) pooled = b.op('Cast', [pooled], { to: g.floatCode });
  }
  floatOutput(b, g.dense(headOf(pooled), 'classifier', H, shape.numLabels!), 'logits', [BATCH_DIM, shape.numLabels!], float16);
}
