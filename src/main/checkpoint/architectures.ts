/**
 * Which encoder a checkpoint's config.json describes, as transformers reads
 * it: its sizes (each family's own keys), its activations, and where each
 * weight of encoder-graph.ts's BertModel naming sits in the family's state
 * dict. Pure: no file is read here.
 */
import type { Activation, EncoderHead, EncoderShape } from './encoder-graph.js';
import type { ModernBertShape } from './modernbert-graph.js';

/** config.json's fields the builders read (each family names some differently). */
export interface CheckpointConfig {
  architectures?: string[];
  model_type?: string;
  hidden_size?: number;
  num_hidden_layers?: number;
  num_attention_heads?: number;
  intermediate_size?: number;
  vocab_size?: number;
  max_position_embeddings?: number;
  type_vocab_size?: number;
  layer_norm_eps?: number;
  hidden_act?: string;
  position_embedding_type?: string;
  pad_token_id?: number;
  embedding_size?: number;
  relative_attention_num_buckets?: number;
  num_labels?: number;
  id2label?: Record<string, string>;
  // ModernBERT's (transformers v4's keys, and v5's layer_types / rope_parameters)
  hidden_activation?: string;
  norm_eps?: number;
  norm_bias?: boolean;
  attention_bias?: boolean;
  mlp_bias?: boolean;
  classifier_bias?: boolean;
  decoder_bias?: boolean;
  classifier_activation?: string;
  classifier_pooling?: string;
  global_rope_theta?: number;
  local_rope_theta?: number | null;
  global_attn_every_n_layers?: number;
  local_attention?: number;
  layer_types?: string[];
  rope_parameters?: Record<string, { rope_theta?: number; rope_type?: string } | null>;
  // DistilBERT's
  dim?: number;
  n_layers?: number;
  n_heads?: number;
  hidden_dim?: number;
  activation?: string;
}

type Family = 'bert' | 'roberta' | 'distilbert' | 'electra' | 'mpnet' | 'modernbert';

/** The architectures served from a checkpoint, by family and the head their weights carry. */
const ARCHITECTURES: Record<string, { family: Family; head: 'base' | 'classify' | 'mlm' }> = {
  BertModel: { family: 'bert', head: 'base' },
  BertForSequenceClassification: { family: 'bert', head: 'classify' },
  BertForMaskedLM: { family: 'bert', head: 'mlm' },
  RobertaModel: { family: 'roberta', head: 'base' },
  RobertaForSequenceClassification: { family: 'roberta', head: 'classify' },
  RobertaForMaskedLM: { family: 'roberta', head: 'mlm' },
  XLMRobertaModel: { family: 'roberta', head: 'base' },
  XLMRobertaForSequenceClassification: { family: 'roberta', head: 'classify' },
  XLMRobertaForMaskedLM: { family: 'roberta', head: 'mlm' },
  CamembertModel: { family: 'roberta', head: 'base' },
  CamembertForSequenceClassification: { family: 'roberta', head: 'classify' },
  CamembertForMaskedLM: { family: 'roberta', head: 'mlm' },
  DistilBertModel: { family: 'distilbert', head: 'base' },
  DistilBertForSequenceClassification: { family: 'distilbert', head: 'classify' },
  DistilBertForMaskedLM: { family: 'distilbert', head: 'mlm' },
  ElectraModel: { family: 'electra', head: 'base' },
  MPNetModel: { family: 'mpnet', head: 'base' },
  ModernBertModel: { family: 'modernbert', head: 'base' },
  ModernBertForSequenceClassification: { family: 'modernbert', head: 'classify' },
  ModernBertForMaskedLM: { family: 'modernbert', head: 'mlm' },
  ElectraForSequenceClassification: { family: 'electra', head: 'classify' },
};

export const SUPPORTED_ARCHITECTURES: readonly string[] = Object.keys(ARCHITECTURES);

/** transformers' base_model_prefix of each family: a task model's body lives under it. */
const BODY_PREFIX: Record<Family, string> = { bert: 'bert.', roberta: 'roberta.', distilbert: 'distilbert.', electra: 'electra.', mpnet: 'mpnet.', modernbert: 'model.' };

/** What the builder needs of one checkpoint: the graph's shape and how its weight names read in the state dict. */
export type CheckpointPlan = EncoderPlan | ModernBertPlan;

/** ModernBERT: transformers' own names (under `model.`), its biases where the config has them. */
export interface ModernBertPlan {
  kind: 'modernbert';
  architecture: string;
  shape: ModernBertShape;
  bias: { attention: boolean; mlp: boolean; norm: boolean; classifier: boolean; decoder: boolean };
  bodyPrefix: string;
}

/** The BERT-shaped families (encoder-graph.ts). */
export interface EncoderPlan {
  kind: 'encoder';
  architecture: string;
  shape: EncoderShape;
  /** The state-dict name of a weight named as BertModel's (without the body prefix, which the reader finds). */
  nameOf(canonical: string): { name: string; part: 'body' | 'head' };
  /** The decoder's own weight, where the checkpoint has one (else it is tied to the word embeddings). */
  decoderNames: { weight: string; bias: string[] };
  bodyPrefix: string;
}

/** transformers' ACT2FN names, by the formula each computes. */
function activationOf(name: string | undefined, key: string): Activation {
  switch (name ?? 'gelu') {
    case 'gelu':
    case 'gelu_python':
      return 'gelu';
    case 'gelu_new':
    case 'gelu_fast':
    case 'gelu_pytorch_tanh':
      return 'gelu_tanh';
    case 'relu':
      return 'relu';
    case 'silu':
    case 'swish':
      return 'silu';
    case 'tanh':
      return 'tanh';
    default:
      throw new Error(`config.json: ${key} "${name}" is not an activation slabserve builds (gelu, gelu_new, gelu_fast, gelu_pytorch_tanh, relu, silu, tanh)`);
  }
}

/**
 * The plan for `config`, serving `served` ('hidden': the token states; 'classify';
 * 'mlm': SPLADE's logits). Throws naming what does not fit: an architecture not
 * built here, a missing size, a head the checkpoint's architecture lacks.
 */
export function planCheckpoint(config: CheckpointConfig, served: EncoderHead): CheckpointPlan {
  const architecture = config.architectures?.[0];
  const arch = architecture === undefined ? undefined : ARCHITECTURES[architecture];
  if (!arch) {
    throw new Error(`config.json: architecture ${architecture ?? '(none: "architectures" is missing)'} is not one slabserve builds from a checkpoint; it builds ${SUPPORTED_ARCHITECTURES.join(', ')} (or serve an ONNX export of it)`);
  }
  if (served === 'classify' && arch.head !== 'classify') throw new Error(`config.json: ${architecture} has no classification head`);
  if (served === 'mlm' && arch.head !== 'mlm') throw new Error(`config.json: SPLADE pooling needs a masked-LM head, and ${architecture} has none`);
  if (arch.family === 'modernbert') return modernBertPlan(architecture!, config, served);
  const shape = shapeOf(arch.family, config, served);
  const names = NAMES[arch.family];
  return {
    kind: 'encoder',
    architecture: architecture!,
    shape,
    nameOf: (canonical) => names(canonical),
    decoderNames: DECODER[arch.family],
    bodyPrefix: BODY_PREFIX[arch.family],
  };
}

/** A positive integer field of config.json, or the reason it is not one. */
function size(config: CheckpointConfig, key: keyof CheckpointConfig): number {
  const v = config[key];
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 1) throw new Error(`config.json: ${String(key)} ${v === undefined ? 'is missing' : `is ${JSON.stringify(v)}, not a positive integer`}`);
  return v;
}

function labelsOf(config: CheckpointConfig): number {
  return config.id2label ? Object.keys(config.id2label).length : (config.num_labels ?? 2);
}

function shapeOf(family: Exclude<Family, 'modernbert'>, config: CheckpointConfig, head: EncoderHead): EncoderShape {
  if (family === 'distilbert') {
    // DistilBERT's own keys; its LayerNorms' eps is fixed at 1e-12 in modeling_distilbert.py.
    const activation = activationOf(config.activation, 'activation');
    return {
      layers: size(config, 'n_layers'), hidden: size(config, 'dim'), heads: size(config, 'n_heads'), intermediate: size(config, 'hidden_dim'),
      vocabSize: size(config, 'vocab_size'), maxPositions: size(config, 'max_position_embeddings'), typeVocabSize: 0, tokenTypeIds: false,
      layerNormEps: 1e-12, activation, head, numLabels: labelsOf(config), classifierActivation: 'relu', mlmActivation: activation,
    };
  }
  if (config.position_embedding_type !== undefined && config.position_embedding_type !== 'absolute') {
    throw new Error(`config.json: position_embedding_type "${config.position_embedding_type}" is not built (absolute only)`);
  }
  const activation = activationOf(config.hidden_act, 'hidden_act');
  const roberta = family === 'roberta';
  const typeVocabSize = config.type_vocab_size ?? 2;
  const shape: EncoderShape = {
    layers: size(config, 'num_hidden_layers'), hidden: size(config, 'hidden_size'), heads: size(config, 'num_attention_heads'), intermediate: size(config, 'intermediate_size'),
    vocabSize: size(config, 'vocab_size'), maxPositions: size(config, 'max_position_embeddings'), typeVocabSize,
    // A one-row table (the RoBERTa family's) needs no input: every token adds row 0, as transformers' zeros do.
    tokenTypeIds: typeVocabSize > 1,
    layerNormEps: config.layer_norm_eps ?? 1e-12, activation, head, numLabels: labelsOf(config),
    // ELECTRA's classification head uses exact GELU whatever hidden_act says; BERT's pooler and RoBERTa's head tanh.
    classifierActivation: family === 'electra' ? 'gelu' : 'tanh',
    // RoBERTa's lm_head applies exact GELU; BERT's transform applies hidden_act.
    mlmActivation: roberta ? 'gelu' : activation,
  };
  if (roberta) shape.positionPaddingIdx = config.pad_token_id ?? 1;
  if (family === 'mpnet') {
    // MPNet: positions from its padding_idx, fixed at 1 whatever pad_token_id says; no token types; a relative position bias.
    Object.assign(shape, { positionPaddingIdx: 1, typeVocabSize: 0, tokenTypeIds: false, relativeBuckets: config.relative_attention_num_buckets ?? 32 });
  }
  if (family === 'electra' && config.embedding_size !== undefined && config.embedding_size !== shape.hidden) shape.embeddingSize = size(config, 'embedding_size');
  return shape;
}

/**
 * ModernBERT's plan: v4 configs say global_attn_every_n_layers, global_rope_theta and local_rope_theta
 * (none: the global one); v5 configs say layer_types ("full_attention", "sliding_attention") and
 * rope_parameters per type. Both are read.
 */
function modernBertPlan(architecture: string, config: CheckpointConfig, head: EncoderHead): ModernBertPlan {
  const layers = size(config, 'num_hidden_layers');
  const every = config.global_attn_every_n_layers ?? 3;
  const localLayers = config.layer_types
    ? config.layer_types.map((t) => t === 'sliding_attention')
    : Array.from({ length: layers }, (_, l) => l % every !== 0);
  if (localLayers.length !== layers) throw new Error(`config.json: layer_types names ${localLayers.length} layers, num_hidden_layers ${layers}`);
  const globalTheta = config.rope_parameters?.full_attention?.rope_theta ?? config.global_rope_theta ?? 160_000;
  const localTheta = config.rope_parameters?.sliding_attention?.rope_theta ?? config.local_rope_theta ?? globalTheta;
  const pooling = config.classifier_pooling ?? 'cls';
  if (pooling !== 'cls' && pooling !== 'mean') throw new Error(`config.json: classifier_pooling "${pooling}" is not cls or mean`);
  return {
    kind: 'modernbert',
    architecture,
    shape: {
      layers, hidden: size(config, 'hidden_size'), heads: size(config, 'num_attention_heads'), intermediate: size(config, 'intermediate_size'),
      vocabSize: size(config, 'vocab_size'), normEps: config.norm_eps ?? 1e-5, localLayers, localWindow: config.local_attention ?? 128,
      globalTheta, localTheta, activation: activationOf(config.hidden_activation, 'hidden_activation'), head, numLabels: labelsOf(config),
      classifierActivation: activationOf(config.classifier_activation, 'classifier_activation'), classifierPooling: pooling,
    },
    bias: { attention: config.attention_bias ?? false, mlp: config.mlp_bias ?? false, norm: config.norm_bias ?? false, classifier: config.classifier_bias ?? false, decoder: config.decoder_bias ?? true },
    bodyPrefix: BODY_PREFIX.modernbert,
  };
}

type Namer = (canonical: string) => { name: string; part: 'body' | 'head' };

const body = (name: string) => ({ name, part: 'body' as const });
const head = (name: string) => ({ name, part: 'head' as const });

/** Where each family keeps the weights BertModel names. */
const NAMES: Record<Exclude<Family, 'modernbert'>, Namer> = {
  bert: (c) => (c.startsWith('pooler.') ? body(c) : c === 'classifier' || c.startsWith('cls.') ? head(c) : body(c)),
  roberta: (c) => {
    if (c === 'pooler.dense') return head('classifier.dense');
    if (c === 'classifier') return head('classifier.out_proj');
    if (c === 'cls.predictions.transform.dense') return head('lm_head.dense');
    if (c === 'cls.predictions.transform.LayerNorm') return head('lm_head.layer_norm');
    return body(c);
  },
  mpnet: (c) => {
    const layer = /^encoder\.layer\.(\d+)\.attention\.(self\.query|self\.key|self\.value|output\.dense|output\.LayerNorm)$/.exec(c);
    if (!layer) return body(c); // the embeddings, the feed-forward block and encoder.relative_attention_bias: BERT's names
    const parts: Record<string, string> = { 'self.query': 'attn.q', 'self.key': 'attn.k', 'self.value': 'attn.v', 'output.dense': 'attn.o', 'output.LayerNorm': 'LayerNorm' };
    return body(`encoder.layer.${layer[1]}.attention.${parts[layer[2]!]}`);
  },
  electra: (c) => {
    if (c === 'pooler.dense') return head('classifier.dense');
    if (c === 'classifier') return head('classifier.out_proj');
    return body(c);
  },
  distilbert: (c) => {
    if (c === 'pooler.dense') return head('pre_classifier');
    if (c === 'classifier') return head('classifier');
    if (c === 'cls.predictions.transform.dense') return head('vocab_transform');
    if (c === 'cls.predictions.transform.LayerNorm') return head('vocab_layer_norm');
    const layer = /^encoder\.layer\.(\d+)\.(.*)$/.exec(c);
    if (!layer) return body(c); // embeddings.{word_embeddings,position_embeddings,LayerNorm}: the same names
    const parts: Record<string, string> = {
      'attention.self.query': 'attention.q_lin', 'attention.self.key': 'attention.k_lin', 'attention.self.value': 'attention.v_lin',
      'attention.output.dense': 'attention.out_lin', 'attention.output.LayerNorm': 'sa_layer_norm',
      'intermediate.dense': 'ffn.lin1', 'output.dense': 'ffn.lin2', 'output.LayerNorm': 'output_layer_norm',
    };
    return body(`transformer.layer.${layer[1]}.${parts[layer[2]!] ?? layer[2]}`);
  },
};

/** The masked-LM decoder's own weight and bias names (the weight is usually absent: tied to the word embeddings). */
const DECODER: Record<Exclude<Family, 'modernbert'>, { weight: string; bias: string[] }> = {
  bert: { weight: 'cls.predictions.decoder.weight', bias: ['cls.predictions.bias', 'cls.predictions.decoder.bias'] },
  roberta: { weight: 'lm_head.decoder.weight', bias: ['lm_head.bias', 'lm_head.decoder.bias'] },
  distilbert: { weight: 'vocab_projector.weight', bias: ['vocab_projector.bias'] },
  electra: { weight: 'generator_lm_head.weight', bias: ['generator_lm_head.bias'] },
  mpnet: { weight: 'lm_head.decoder.weight', bias: ['lm_head.bias', 'lm_head.decoder.bias'] },
};
