/**
 * slabserve.v1.Outputs (proto/slabserve.proto): /embed with `outputs` over
 * gRPC, for what TEI's messages cannot carry: a BGE-M3 model's dense row,
 * sparse weights and colbert vectors of one input from one batch run.
 * `outputs` empty means every one of dense, sparse and colbert the model gives.
 */
import { sparseEntries } from '../../core/sparse.js';
import { EMBED_OUTPUTS, type EmbedOutput } from '../schemas.js';
import { embedEndpoint, outputItems } from '../tei/endpoints.js';
import { streamInference, unaryInference, type GrpcDeps, type InferenceMethod } from './calls.js';
import { common, directionField, timings } from '../tei/grpc.js';

interface EmbedOutputsMessage {
  inputs: string;
  outputs?: string[];
  truncate?: boolean;
  truncation_direction?: unknown;
  normalize?: boolean;
  prompt_name?: string;
}

type State = { normalize: boolean | undefined; outputs: readonly EmbedOutput[]; chars: number; started: number };

const embedOutputs: InferenceMethod<EmbedOutputsMessage, State> = {
  endpoint: {
    route: '/slabserve.v1.Outputs/Embed',
    task: 'embed',
    parse(raw, ec) {
      const body = raw as EmbedOutputsMessage & { model?: string };
      // None named: every one of dense, sparse and colbert the model gives.
      const gives = body.outputs?.length ? null : ec.infer.models.resolve('embed', body.model).plan.spec.outputs;
      const outputs = gives ? EMBED_OUTPUTS.filter((o) => gives.includes(o)) : body.outputs!;
      const { call, state } = embedEndpoint.parse({ ...body, outputs }, ec);
      return { call, state: { normalize: state.normalize, outputs: state.outputs!, chars: body.inputs.length, started: performance.now() } };
    },
    answer(r, call, s) {
      const [x] = outputItems(r, call.model, s.outputs, s.normalize);
      return {
        ...(x?.dense ? { dense: Array.from(x.dense) } : {}),
        ...(x?.sparse ? { sparse: sparseEntries(x.sparse) } : {}),
        ...(x?.colbert ? { colbert: x.colbert.map((v) => ({ embeddings: Array.from(v) })) } : {}),
        metadata: timings(r, s.chars, s.started),
      };
    },
  },
  body: (req, scope) => ({
    inputs: req.inputs,
    ...common(req, scope),
    ...directionField(req),
    ...(req.outputs?.length ? { outputs: req.outputs } : {}),
    ...(req.normalize !== undefined ? { normalize: req.normalize } : {}),
    ...(req.prompt_name !== undefined ? { prompt_name: req.prompt_name } : {}),
  }),
};

/** The service by name, each a handler per method. */
export function outputsServices(deps: GrpcDeps) {
  return {
    Outputs: {
      Embed: unaryInference(deps, '/slabserve.v1.Outputs/Embed', embedOutputs),
      EmbedStream: streamInference(deps, '/slabserve.v1.Outputs/EmbedStream', embedOutputs),
    },
  };
}
