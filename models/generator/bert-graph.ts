/**
 * A BERT encoder as an ONNX graph with deterministic random weights: the
 * graph is src/main/checkpoint/encoder-graph.ts's (the one a checkpoint's
 * weights are built into), the weights drawn here, each seeded by its name.
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
import { buildEncoderGraph, checkEncoderShape, encodeEncoderModel, type EncoderParams, type EncoderShape, type LinearRole } from '../../src/main/checkpoint/encoder-graph.js';
import type { onnx } from '../../src/shared/model-format/onnx-graph.js';
import { Rng } from './rng.js';

/**
 * embed: last_hidden_state (BertModel); classify: pooler + classifier logits
 * (ForSequenceClassification); mlm: a masked-LM head's logits over the
 * vocabulary per token (ForMaskedLM, what SPLADE models are).
 */
export type BertTask = 'embed' | 'classify' | 'mlm';

/** The sizes are the encoder's (src/main/checkpoint/encoder-graph.ts); the rest says what to generate. */
export interface BertSpec extends Pick<EncoderShape, 'layers' | 'hidden' | 'heads' | 'intermediate' | 'vocabSize' | 'maxPositions' | 'typeVocabSize'> {
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

export { attentionProbsName, ENCODER_INPUT_NAMES as BERT_INPUT_NAMES, BATCH_DIM, SEQUENCE_DIM } from '../../src/main/checkpoint/encoder-graph.js';

/** Checks a spec; throws a RangeError naming the first field that cannot make a model. */
export function validateBertSpec(spec: BertSpec): void {
  if (spec.task !== 'embed' && spec.task !== 'classify' && spec.task !== 'mlm') throw new RangeError(`unknown task "${String(spec.task)}"`);
  if (!(spec.typeVocabSize >= 1)) throw new RangeError(`typeVocabSize must be a positive integer, got ${String(spec.typeVocabSize)}`);
  checkEncoderShape(shapeOf(spec));
  if (!Number.isSafeInteger(spec.seed)) throw new RangeError('seed must be an integer');
}

/**
 * Mean of the masked-LM head's decoder bias: a logit is about N(this, 1), so
 * log(1 + relu(logit)) is non-zero for about 1 in 2000 vocabulary entries per
 * token, and a SPLADE row of a short text has tens of non-zeros, as a trained
 * SPLADE model's does, not half the vocabulary.
 */
const MLM_BIAS_MEAN = -3.3;

/** The gain of each kind of dense layer (std = gain / sqrt(fan_in)). */
function gainOf(role: LinearRole, init: InitScales): number {
  switch (role) {
    case 'query':
    case 'key':
      return init.qkGain;
    case 'attention-output':
    case 'output':
      return init.residualGain;
    case 'pooler':
      return init.poolerGain;
    case 'classifier':
      return init.classifierGain;
    default:
      return init.denseGain;
  }
}

/** Random weights with the scales above, each seeded by its name, so a model's bytes depend only on its spec. */
function randomParams(spec: BertSpec): EncoderParams {
  const init = { ...DEFAULT_INIT, ...spec.init };
  const root = new Rng(spec.seed);
  const normal = (name: string, n: number, std: number, mean = 0) => root.fork(name).normalArray(n, std, mean);
  const embeddingStd = { word: init.wordEmbedding, position: init.positionEmbedding, 'token-type': init.tokenTypeEmbedding, 'relative-bias': 1 };
  return {
    linear: (name, fanIn, fanOut, role) => ({
      weight: normal(`${name}.weight`, fanIn * fanOut, gainOf(role, init) / Math.sqrt(fanIn)),
      bias: normal(`${name}.bias`, fanOut, init.bias),
    }),
    embedding: (name, rows, width, role) => normal(`${name}.weight`, rows * width, embeddingStd[role]),
    layerNorm: (name, width) => ({ weight: normal(`${name}.weight`, width, init.layerNormGammaNoise, 1), bias: normal(`${name}.bias`, width, init.layerNormBeta) }),
    decoder: (hidden, vocab) => ({
      weight: normal('cls.predictions.decoder.weight', hidden * vocab, 1 / Math.sqrt(hidden)),
      bias: normal('cls.predictions.bias', vocab, 0.3, MLM_BIAS_MEAN),
    }),
  };
}

/** The encoder's shape for a spec. */
function shapeOf(spec: BertSpec): EncoderShape {
  return {
    layers: spec.layers, hidden: spec.hidden, heads: spec.heads, intermediate: spec.intermediate,
    vocabSize: spec.vocabSize, maxPositions: spec.maxPositions, typeVocabSize: spec.typeVocabSize,
    tokenTypeIds: spec.tokenTypeIds !== false, layerNormEps: spec.layerNormEps ?? 1e-12, activation: 'gelu',
    ...(spec.positionPaddingIdx !== undefined ? { positionPaddingIdx: spec.positionPaddingIdx } : {}),
    ...(spec.positionIdsInput ? { positionIdsInput: true } : {}),
    ...(spec.causal ? { causal: true } : {}),
    head: spec.task === 'embed' ? 'hidden' : spec.task,
    ...(spec.numLabels !== undefined ? { numLabels: spec.numLabels } : {}),
  };
}

/** Builds the graph (not yet wrapped in a model). */
export function buildBertGraph(spec: BertSpec): onnx.IGraphProto {
  validateBertSpec(spec);
  const name = spec.task === 'classify' ? 'bert_for_sequence_classification' : spec.task === 'mlm' ? 'bert_for_masked_lm' : 'bert_model';
  return buildEncoderGraph(name, shapeOf(spec), randomParams(spec));
}

/** Builds the model and returns the serialised ONNX bytes. */
export function buildBertModel(spec: BertSpec): Uint8Array {
  return encodeEncoderModel(buildBertGraph(spec), 'BERT with random weights generated by slabserve (meaningless outputs; for tests and benchmarks)', {
    slabserve_generated: 'true',
    seed: String(spec.seed),
    task: spec.task,
  });
}
