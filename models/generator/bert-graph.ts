/**
 * Builds a BERT encoder as an ONNX graph, shaped like a Hugging Face export
 * (optimum / torch.onnx of BertModel or BertForSequenceClassification), with
 * deterministic random weights.
 *
 * Graph (opset 17):
 *   inputs  input_ids, attention_mask, token_type_ids: int64 [batch_size, sequence_length]
 *   embeddings = LayerNorm(word[input_ids] + type[token_type_ids] + position[Range(0, T)])
 *   mask bias  = (1 - Cast<float>(Unsqueeze(attention_mask, [1, 2]))) * float32_min   [B, 1, 1, T]
 *   N x layer:
 *     q, k, v  = x·W + b, split into heads              [B, heads, T, head_dim]
 *     probs    = Softmax(q·kᵀ / sqrt(head_dim) + mask bias)
 *     x        = LayerNorm(x + (probs·v merged)·Wo + bo)
 *     x        = LayerNorm(x + GELU_erf(x·Wi + bi)·Wo2 + bo2)
 *   task 'embed':    last_hidden_state float [batch_size, sequence_length, hidden]
 *   task 'classify': logits float [batch_size, num_labels] from
 *                    Tanh(x[:, 0]·Wp + bp)·Wc + bc  (pooler + classifier)
 *
 * The additive mask uses the most negative float32 like HF does: a padded key
 * scores about -3.4e38, which after Softmax's max-subtraction underflows exp()
 * to exactly 0, so padded positions get exactly zero attention weight and
 * real positions' outputs do not depend on what the padding contains.
 *
 * Initializer names follow the HF parameter names (embeddings.word_embeddings.weight,
 * encoder.layer.0.attention.self.query.weight, ...), but dense weights are
 * stored [in, out] (ready for MatMul), as a torch.onnx export does.
 */
import { GraphBuilder, encodeModel, makeModel, onnx } from '../../src/shared/model-format/onnx-graph.js';
import { Rng } from './rng.js';

/**
 * embed: last_hidden_state (BertModel); classify: pooler + classifier logits
 * (ForSequenceClassification); mlm: a masked-LM head's logits over the
 * vocabulary per token (ForMaskedLM, what SPLADE models are).
 */
export type BertTask = 'embed' | 'classify' | 'mlm';

export interface BertSpec {
  layers: number;
  hidden: number;
  heads: number;
  intermediate: number;
  vocabSize: number;
  maxPositions: number;
  typeVocabSize: number;
  task: BertTask;
  /** Number of classes for task 'classify' (required there). */
  numLabels?: number;
  seed: number;
  /** LayerNorm epsilon; default 1e-12 as in BertConfig. */
  layerNormEps?: number;
  /**
   * The RoBERTa family's positions: numbered from padding_idx + 1 along the
   * tokens that are not padding_idx (transformers' create_position_ids_from_input_ids),
   * so 514 position embeddings serve 512 tokens. Absent: BERT's 0..T-1.
   */
  positionPaddingIdx?: number;
  /** false: no token_type_ids input; every token gets type 0's embedding (XLM-RoBERTa, DistilBERT exports). Default true. */
  tokenTypeIds?: boolean;
  /** A position_ids input (as decoder exports take it) instead of positions computed in the graph. */
  positionIdsInput?: boolean;
  /** Causal attention (a decoder: each token attends to itself and the tokens before it). */
  causal?: boolean;
  /** Overrides of the init scales (see {@link DEFAULT_INIT}); for experiments. */
  init?: Partial<InitScales>;
}

/**
 * Standard deviations of the random weights.
 *
 * HF initialises BERT with N(0, 0.02) everywhere. That is fine for training
 * but useless for an untrained test model: with hidden 128, query/key
 * projections of std 0.02 give attention logits of std ~0.05, so attention
 * is uniform, every sublayer's contribution is tiny next to the residual, and
 * the output is roughly LayerNorm(embedding) — mean-pooled embeddings of
 * different texts then share the token-type/position/bias components and are
 * far too alike. So we use a fan-in ("LeCun") scale instead, which keeps every
 * sublayer's output at about unit variance so each layer really mixes tokens:
 *
 * - dense weights: std = gain / sqrt(fan_in) (fan_in = hidden, or
 *   intermediate for the FFN output);
 * - value and FFN-intermediate: gain 1;
 * - query and key: gain 1.5. A LayerNorm'd input has unit-variance features,
 *   so q and k features have variance gain², and the scaled dot product
 *   q·k/sqrt(head_dim) has std ≈ gain² ≈ 2.25: peaked, clearly non-uniform
 *   attention (mean max weight ≈ 0.44 over 5–40 tokens), not one-hot;
 * - the two residual-branch projections (attention output, FFN output):
 *   gain 0.5. At gain 1 a 12-layer model suffers rank collapse: attention
 *   keeps averaging tokens until all tokens of a text have cosine ≈ 0.995 and
 *   the last layer's attention is uniform. At 0.5 the residual stream
 *   dominates and per-token outputs stay distinct (token cosine ≈ 0.07 at 2
 *   layers, ≈ 0.55 at 12; last-layer attention still peaked);
 * - embeddings (before the embedding LayerNorm, so only ratios matter): word
 *   1.0, position 0.5, token type 0.1. Position and type components are the
 *   same for every text and survive mean pooling undiminished, so they are
 *   kept smaller than the word component;
 * - biases N(0, 0.02), LayerNorm gamma 1 + N(0, 0.05), beta N(0, 0.02): small,
 *   since any constant vector is shared by all outputs and raises their
 *   cosine similarity;
 * - pooler gain 1 (tanh stays unsaturated), classifier gain 2 on the pooled
 *   (|x| < 1) features so logits vary by a few units between inputs.
 *
 * Measured with random 5–40 token texts (mean-pooled, L2-normalised): mean
 * pairwise cosine ≈ 0.54 (tiny, 2 layers), ≈ 0.59 (6 layers / 384),
 * ≈ 0.63 (12 layers / 768), max ≈ 0.77; no NaN/Inf; |activations| < 6.
 * test/modelgen.test.ts asserts loose bounds on these.
 */
export interface InitScales {
  wordEmbedding: number;
  positionEmbedding: number;
  tokenTypeEmbedding: number;
  /** Gain for query and key weights (std = gain / sqrt(hidden)). */
  qkGain: number;
  /** Gain for value and FFN-intermediate weights. */
  denseGain: number;
  /** Gain for the two residual-branch projections (attention output, FFN output). */
  residualGain: number;
  bias: number;
  layerNormGammaNoise: number;
  layerNormBeta: number;
  poolerGain: number;
  classifierGain: number;
}

export const DEFAULT_INIT: Readonly<InitScales> = {
  wordEmbedding: 1.0,
  positionEmbedding: 0.5,
  tokenTypeEmbedding: 0.1,
  qkGain: 1.5,
  denseGain: 1.0,
  residualGain: 0.5,
  bias: 0.02,
  layerNormGammaNoise: 0.05,
  layerNormBeta: 0.02,
  poolerGain: 1.0,
  classifierGain: 2.0,
};

/** The model's input names, in the order an HF export declares them. */
export const BERT_INPUT_NAMES = ['input_ids', 'attention_mask', 'token_type_ids'] as const;
/** Symbolic dimension names of the inputs. */
export const BATCH_DIM = 'batch_size';
export const SEQUENCE_DIM = 'sequence_length';

/**
 * Name of layer `layer`'s attention-probabilities tensor ([B, heads, T, T],
 * after Softmax). Not a graph output; tests expose it with
 * `GraphBuilder.wrap(graph).addOutput(...)` to inspect attention.
 */
export function attentionProbsName(layer: number): string {
  return `/encoder/layer.${layer}/attention/self/Softmax_output_0`;
}

export function validateBertSpec(spec: BertSpec): void {
  const ints: (keyof BertSpec)[] = ['layers', 'hidden', 'heads', 'intermediate', 'vocabSize', 'maxPositions', 'typeVocabSize'];
  for (const k of ints) {
    const v = spec[k];
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 1) throw new RangeError(`BertSpec.${k} must be a positive integer, got ${String(v)}`);
  }
  if (spec.hidden % spec.heads !== 0) throw new RangeError(`hidden (${spec.hidden}) must be a multiple of heads (${spec.heads})`);
  if (spec.task === 'classify') {
    if (!spec.numLabels || !Number.isSafeInteger(spec.numLabels) || spec.numLabels < 1) {
      throw new RangeError('task "classify" needs numLabels >= 1');
    }
  } else if (spec.task !== 'embed' && spec.task !== 'mlm') {
    throw new RangeError(`unknown task "${String(spec.task)}"`);
  }
  if (!Number.isSafeInteger(spec.seed)) throw new RangeError('seed must be an integer');
}

/** Most negative finite float32 (torch.finfo(torch.float32).min). */
const FLOAT32_MIN = -3.4028234663852886e38;

/**
 * The parts of one BERT graph under construction: its builder, its seeded
 * parameters and the constants every part shares. Created in the order the
 * graph's initializers are listed (constants first), so the bytes of a
 * generated model depend only on its spec.
 */
class BertParts {
  readonly b: GraphBuilder;
  readonly init: InitScales;
  private readonly root: Rng;
  private readonly eps: number;
  readonly c: ReturnType<typeof sharedConstants>;

  constructor(readonly spec: BertSpec) {
    this.init = { ...DEFAULT_INIT, ...spec.init };
    this.eps = spec.layerNormEps ?? 1e-12;
    this.root = new Rng(spec.seed);
    this.b = new GraphBuilder(spec.task === 'classify' ? 'bert_for_sequence_classification' : spec.task === 'mlm' ? 'bert_for_masked_lm' : 'bert_model');
    this.c = sharedConstants(this.b, spec);
  }

  /** A parameter of normal random values, seeded by its name. */
  normal(name: string, dims: number[], std: number, mean = 0): string {
    const n = dims.reduce((x, y) => x * y, 1);
    return this.b.addInitializer(name, 'float', this.root.fork(name).normalArray(n, std, mean), dims);
  }

  /** x @ W + bias, W [fanIn, fanOut] scaled by gain / sqrt(fanIn). */
  dense(x: string, prefix: string, fanIn: number, fanOut: number, gain: number): string {
    const w = this.normal(`${prefix}.weight`, [fanIn, fanOut], gain / Math.sqrt(fanIn));
    const bias = this.normal(`${prefix}.bias`, [fanOut], this.init.bias);
    return this.b.op('Add', [this.b.op('MatMul', [x, w]), bias]);
  }

  layerNorm(x: string, prefix: string): string {
    const gamma = this.normal(`${prefix}.weight`, [this.spec.hidden], this.init.layerNormGammaNoise, 1);
    const beta = this.normal(`${prefix}.bias`, [this.spec.hidden], this.init.layerNormBeta);
    return this.b.op('LayerNormalization', [x, gamma, beta], { axis: -1, epsilon: { f: this.eps } });
  }
}

/** The scalar and shape constants the graph's parts share. */
function sharedConstants(b: GraphBuilder, spec: BertSpec) {
  const headDim = spec.hidden / spec.heads;
  const cI64 = (name: string, v: number[] | number): string =>
    b.addInitializer(name, 'int64', Array.isArray(v) ? v : [v], Array.isArray(v) ? [v.length] : []);
  const cF32 = (name: string, v: number): string => b.addInitializer(name, 'float', [v], []);
  return {
    zero: cI64('/Constant_zero', 0),
    one64: cI64('/Constant_one', 1),
    oneF: cF32('/Constant_one_float', 1),
    minF: cF32('/Constant_float32_min', FLOAT32_MIN),
    sqrtHeadDim: cF32('/Constant_sqrt_head_dim', Math.sqrt(headDim)),
    sqrt2: cF32('/Constant_sqrt2', Math.SQRT2),
    half: cF32('/Constant_half', 0.5),
    splitShape: cI64('/Constant_split_heads_shape', [0, 0, spec.heads, headDim]),
    mergeShape: cI64('/Constant_merge_heads_shape', [0, 0, spec.hidden]),
    maskAxes: cI64('/Constant_mask_axes', [1, 2]),
  };
}

interface BertInputs {
  inputIds: string;
  attentionMask: string;
  tokenTypeIds: string | null;
  positionIds: string | null;
}

function addInputs(b: GraphBuilder, spec: BertSpec): BertInputs {
  const dims = [BATCH_DIM, SEQUENCE_DIM];
  return {
    inputIds: b.addInput('input_ids', 'int64', dims),
    attentionMask: b.addInput('attention_mask', 'int64', dims),
    tokenTypeIds: spec.tokenTypeIds === false ? null : b.addInput('token_type_ids', 'int64', dims),
    positionIds: spec.positionIdsInput ? b.addInput('position_ids', 'int64', dims) : null,
  };
}

/** Word + token type + position embeddings, layer-normed: [B, T, H]. */
function embeddings(g: BertParts, inputs: BertInputs): string {
  const { b, spec, init, c } = g;
  const H = spec.hidden;
  return b.scoped('embeddings', () => {
    const wordEmb = g.normal('embeddings.word_embeddings.weight', [spec.vocabSize, H], init.wordEmbedding);
    const posEmb = g.normal('embeddings.position_embeddings.weight', [spec.maxPositions, H], init.positionEmbedding);
    const typeEmb = g.normal('embeddings.token_type_embeddings.weight', [spec.typeVocabSize, H], init.tokenTypeEmbedding);
    const words = b.op('Gather', [wordEmb, inputs.inputIds], { axis: 0 }); // [B, T, H]
    // No token_type_ids: type 0's row, broadcast over every token.
    const types = b.op('Gather', [typeEmb, inputs.tokenTypeIds ?? c.zero], { axis: 0 }); // [B, T, H] or [H]
    const positionIds = inputs.positionIds ?? positionIdsOf(b, inputs.inputIds, spec.positionPaddingIdx, c.zero, c.one64);
    const positions = b.op('Gather', [posEmb, positionIds], { axis: 0 }); // [T, H] or [B, T, H]
    const sum = b.op('Add', [b.op('Add', [words, types]), positions]);
    return g.layerNorm(sum, 'embeddings.LayerNorm');
  });
}

/** The extended attention mask, (1 - mask[:, None, None, :]) * float32_min, plus the causal mask for decoders. */
function attentionBias(g: BertParts, inputs: BertInputs): string {
  const { b, spec, c } = g;
  return b.scoped('extended_attention_mask', () => {
    const m = b.op('Cast', [b.op('Unsqueeze', [inputs.attentionMask, c.maskAxes])], { to: onnx.TensorProto.DataType.FLOAT });
    const padding = b.op('Mul', [b.op('Sub', [c.oneF, m]), c.minF]); // [B, 1, 1, T]
    if (!spec.causal) return padding;
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
function selfAttention(g: BertParts, p: string, x: string, bias: string): string {
  const { b, init, c } = g;
  const H = g.spec.hidden;
  return b.scoped('self', () => {
    const heads = (t: string, perm: number[]) => b.op('Transpose', [b.op('Reshape', [t, c.splitShape])], { perm });
    const q = heads(g.dense(x, `${p}.attention.self.query`, H, H, init.qkGain), [0, 2, 1, 3]); // [B, NH, T, D]
    const kT = heads(g.dense(x, `${p}.attention.self.key`, H, H, init.qkGain), [0, 2, 3, 1]); // [B, NH, D, T]
    const v = heads(g.dense(x, `${p}.attention.self.value`, H, H, init.denseGain), [0, 2, 1, 3]); // [B, NH, T, D]
    const scores = b.op('Add', [b.op('Div', [b.op('MatMul', [q, kT]), c.sqrtHeadDim]), bias]);
    const probs = b.op('Softmax', [scores], { axis: -1 });
    const merged = b.op('Transpose', [b.op('MatMul', [probs, v])], { perm: [0, 2, 1, 3] }); // [B, T, NH, D]
    return b.op('Reshape', [merged, c.mergeShape]); // [B, T, H]
  });
}

/** Encoder layer `l`: attention, then the feed-forward block, each with its residual and LayerNorm. */
function encoderLayer(g: BertParts, l: number, x: string, bias: string): string {
  const { b, init, c } = g;
  const { hidden: H, intermediate: I } = g.spec;
  const p = `encoder.layer.${l}`;
  return b.scoped(`encoder/layer.${l}`, () => {
    const attnOut = b.scoped('attention', () => {
      const ctx = selfAttention(g, p, x, bias);
      return b.scoped('output', () => {
        const o = g.dense(ctx, `${p}.attention.output.dense`, H, H, init.residualGain);
        return g.layerNorm(b.op('Add', [o, x]), `${p}.attention.output.LayerNorm`);
      });
    });
    const inter = b.scoped('intermediate', () => {
      const h = g.dense(attnOut, `${p}.intermediate.dense`, H, I, init.denseGain);
      // exact GELU, as HF's "gelu": x * 0.5 * (1 + erf(x / sqrt(2)))
      const erf = b.op('Erf', [b.op('Div', [h, c.sqrt2])]);
      return b.op('Mul', [b.op('Mul', [h, b.op('Add', [erf, c.oneF])]), c.half]);
    });
    return b.scoped('output', () => {
      const o = g.dense(inter, `${p}.output.dense`, I, H, init.residualGain);
      return g.layerNorm(b.op('Add', [o, attnOut]), `${p}.output.LayerNorm`);
    });
  });
}

/**
 * Mean of the masked-LM head's decoder bias: a logit is about N(this, 1), so
 * log(1 + relu(logit)) is non-zero for about 1 in 2000 vocabulary entries per
 * token, and a SPLADE row of a short text has tens of non-zeros, as a trained
 * SPLADE model's does, not half the vocabulary.
 */
const MLM_BIAS_MEAN = -3.3;

/** The outputs: last_hidden_state (embed), pooler + classifier logits (classify), or the masked-LM logits (mlm). */
function addHead(g: BertParts, x: string): void {
  const { b, spec, init, c } = g;
  const H = spec.hidden;
  if (spec.task === 'embed') {
    b.node('Identity', [x], undefined, ['last_hidden_state']);
    b.addOutput('last_hidden_state', 'float', [BATCH_DIM, SEQUENCE_DIM, H]);
    return;
  }
  if (spec.task === 'mlm') {
    // BertOnlyMLMHead: transform (dense, GELU, LayerNorm), then the decoder over the vocabulary.
    b.scoped('cls', () => {
      const h = g.dense(x, 'cls.predictions.transform.dense', H, H, init.denseGain);
      const gelu = b.op('Mul', [b.op('Mul', [h, c.half]), b.op('Add', [c.oneF, b.op('Erf', [b.op('Div', [h, c.sqrt2])])])]);
      const t = g.layerNorm(gelu, 'cls.predictions.transform.LayerNorm');
      const w = g.normal('cls.predictions.decoder.weight', [H, spec.vocabSize], 1 / Math.sqrt(H));
      const bias = g.normal('cls.predictions.bias', [spec.vocabSize], 0.3, MLM_BIAS_MEAN);
      b.node('Add', [b.op('MatMul', [t, w]), bias], undefined, ['logits']);
    });
    b.addOutput('logits', 'float', [BATCH_DIM, SEQUENCE_DIM, spec.vocabSize]);
    return;
  }
  const pooled = b.scoped('pooler', () => {
    const first = b.op('Gather', [x, c.zero], { axis: 1 }); // [B, H]: the [CLS] token
    return b.op('Tanh', [g.dense(first, 'pooler.dense', H, H, init.poolerGain)]);
  });
  b.scoped('classifier', () => {
    const logits = g.dense(pooled, 'classifier', H, spec.numLabels!, init.classifierGain);
    b.node('Identity', [logits], undefined, ['logits']);
  });
  b.addOutput('logits', 'float', [BATCH_DIM, spec.numLabels!]);
}

/** Builds the graph (not yet wrapped in a model). */
export function buildBertGraph(spec: BertSpec): onnx.IGraphProto {
  validateBertSpec(spec);
  const g = new BertParts(spec);
  const inputs = addInputs(g.b, spec);
  let x = embeddings(g, inputs);
  const bias = attentionBias(g, inputs);
  for (let l = 0; l < spec.layers; l++) x = encoderLayer(g, l, x, bias);
  addHead(g, x);
  return g.b.graph();
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

/** Builds the model and returns the serialised ONNX bytes. */
export function buildBertModel(spec: BertSpec): Uint8Array {
  const model = makeModel(buildBertGraph(spec), {
    opset: 17,
    irVersion: 8,
    docString: 'BERT with random weights generated by slabserve (meaningless outputs; for tests and benchmarks)',
    metadata: { slabserve_generated: 'true', seed: String(spec.seed), task: spec.task },
  });
  return encodeModel(model);
}
