/**
 * KServe v2's GRPCInferenceService (proto/inference.proto) over the HTTP
 * KServe route's endpoint (../routes-kserve.ts), with Triton's repository
 * RPCs over the model repository (src/main/repository/repository.ts):
 *
 *   ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata
 *   ModelInfer        the same tensors as POST /v2/models/{name}/infer: INT64/INT32 input_ids
 *                     (optional attention_mask, token_type_ids) or BYTES text (a reranker: query
 *                     and text), typed `contents` or `raw_input_contents`; FP32 outputs, answered
 *                     in `raw_output_contents` when the request sent raw inputs, else typed
 *   RepositoryIndex, RepositoryModelLoad, RepositoryModelUnload   admin keys, as the HTTP routes
 *
 * A [B]-shaped tensor is one request of B inputs, batched with every other
 * transport's requests.
 */
import { SlabserveError, ValidationError } from '../../shared/errors.js';
import type { RepositoryAnswer, RepositoryOp } from '../../shared/repository-protocol.js';
import { checkVersion, inferEndpoint, inferHead, inferOutputs, modelMetadata, type InferState } from './http.js';
import { serveSettings } from '../repository/http.js';
import type { Endpoint } from '../serving.js';
import { unaryInference, unaryLocal, type GrpcDeps, type InferenceMethod } from '../grpc/calls.js';

type Param = { bool_param?: boolean; int64_param?: number; string_param?: string; double_param?: number; uint64_param?: number; bytes_param?: Buffer };

interface Tensor {
  name: string;
  datatype: string;
  shape: number[];
  contents?: {
    int_contents?: number[];
    int64_contents?: number[];
    fp32_contents?: number[];
    bool_contents?: boolean[];
    bytes_contents?: Buffer[];
    uint_contents?: number[];
  };
}

interface InferMessage {
  model_name: string;
  model_version?: string;
  id?: string;
  parameters?: Record<string, Param>;
  inputs?: Tensor[];
  outputs?: { name: string }[];
  raw_input_contents?: Buffer[];
}

const invalid = (message: string) => new ValidationError(message);

/** A parameter's value, whichever of its oneof it holds. */
function paramValue(p: Param): unknown {
  return p.bool_param ?? p.int64_param ?? p.string_param ?? p.double_param ?? p.uint64_param ?? p.bytes_param?.toString('utf8');
}

function paramsOf(map: Record<string, Param> | undefined): Record<string, unknown> | undefined {
  if (!map || Object.keys(map).length === 0) return undefined;
  return Object.fromEntries(Object.entries(map).map(([k, v]) => [k, paramValue(v)]));
}

/** A raw tensor's elements: little-endian integers, or length-prefixed BYTES. */
function rawElements(t: Tensor, raw: Buffer): unknown[] {
  const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  const fixed = (size: number, read: (at: number) => number) => {
    if (raw.byteLength % size !== 0) throw invalid(`raw input ${t.name}: ${raw.byteLength} bytes is not a whole number of ${t.datatype} elements (${size} bytes each)`);
    return Array.from({ length: raw.byteLength / size }, (_, i) => read(i * size));
  };
  switch (t.datatype) {
    case 'INT64':
      return fixed(8, (at) => Number(view.getBigInt64(at, true)));
    case 'INT32':
      return fixed(4, (at) => view.getInt32(at, true));
    case 'BYTES': {
      const out: string[] = [];
      for (let at = 0; at < raw.byteLength; ) {
        if (at + 4 > raw.byteLength) throw invalid(`raw input ${t.name}: a BYTES element's 4-byte length is cut off at byte ${at}`);
        const n = view.getUint32(at, true);
        if (at + 4 + n > raw.byteLength) throw invalid(`raw input ${t.name}: a BYTES element of ${n} bytes runs past the end`);
        out.push(raw.toString('utf8', at + 4, at + 4 + n));
        at += 4 + n;
      }
      return out;
    }
    default:
      throw invalid(`input ${t.name}: datatype ${t.datatype}; inputs are INT64 or INT32 token tensors, or BYTES texts`);
  }
}

/** A typed tensor's elements, from the contents field of its datatype. */
function typedElements(t: Tensor): unknown[] {
  const c = t.contents ?? {};
  switch (t.datatype) {
    case 'INT64':
      return c.int64_contents ?? [];
    case 'INT32':
      return c.int_contents ?? [];
    case 'BYTES':
      return (c.bytes_contents ?? []).map((b) => b.toString('utf8'));
    default:
      return c.fp32_contents ?? c.int_contents ?? c.bool_contents ?? c.uint_contents ?? [];
  }
}

/** The message as the HTTP route's JSON body (its tensors' data flat, as a client may send it). */
function inferBody(req: InferMessage): unknown {
  const inputs = req.inputs ?? [];
  const raw = req.raw_input_contents ?? [];
  if (raw.length > 0 && raw.length !== inputs.length) throw invalid(`raw_input_contents holds ${raw.length} entries for ${inputs.length} inputs: one per input, in order`);
  if (raw.length > 0 && inputs.some((t) => t.contents && Object.values(t.contents).some((v) => Array.isArray(v) && v.length > 0))) {
    throw invalid('an input has typed contents beside raw_input_contents: send one or the other');
  }
  const parameters = paramsOf(req.parameters);
  return {
    ...(req.id ? { id: req.id } : {}),
    ...(parameters ? { parameters } : {}),
    inputs: inputs.map((t, i) => ({ name: t.name, datatype: t.datatype, shape: t.shape, data: raw.length > 0 ? rawElements(t, raw[i]!) : typedElements(t) })),
    ...(req.outputs?.length ? { outputs: req.outputs.map((o) => ({ name: o.name })) } : {}),
  };
}

type GrpcInferState = InferState & { raw: boolean };

/** ModelInfer: the HTTP route's parse with the message's model and version, the outputs typed or raw. */
const modelInfer: InferenceMethod<InferMessage, GrpcInferState> = {
  pathModel: (req) => req.model_name,
  endpoint: {
    route: '/inference.GRPCInferenceService/ModelInfer',
    task: null,
    parse(raw, ec) {
      const { model_name, model_version, raw_inputs, ...body } = raw as { model_name: string; model_version: string | undefined; raw_inputs: boolean };
      if (!model_name) throw invalid('model_name is empty: name the model to run');
      const { call, state } = inferEndpoint.parse(body, { ...ec, pathModel: model_name, params: model_version ? [model_name, model_version] : [model_name] });
      return { call, state: { ...state, raw: raw_inputs } };
    },
    truncateAdvice: inferEndpoint.truncateAdvice as Endpoint<GrpcInferState>['truncateAdvice'],
    answer(r, call, state) {
      const outputs = inferOutputs(r, call, state);
      const head = inferHead(call, state);
      if (state.raw) {
        return {
          ...head,
          outputs: outputs.map((o) => ({ name: o.name, datatype: 'FP32', shape: o.shape })),
          raw_output_contents: outputs.map((o) => Buffer.from(o.data.buffer, o.data.byteOffset, o.data.byteLength)),
        };
      }
      return { ...head, outputs: outputs.map((o) => ({ name: o.name, datatype: 'FP32', shape: o.shape, contents: { fp32_contents: Array.from(o.data) } })) };
    },
  },
  body: (req) => ({ ...(inferBody(req) as object), model_name: req.model_name, model_version: req.model_version, raw_inputs: (req.raw_input_contents?.length ?? 0) > 0 }),
};

/** A repository operation, its failure as the error it carries. */
async function ask(deps: KServeDeps, op: RepositoryOp): Promise<RepositoryAnswer & { ok: true }> {
  const a = await deps.repository(op);
  if (!a.ok) throw new SlabserveError(a.message, a.code, a.type);
  return a;
}

export interface KServeDeps extends GrpcDeps {
  version: string;
  repository(op: RepositoryOp): Promise<RepositoryAnswer>;
}

function modelOf(deps: GrpcDeps, req: { name: string; version?: string }) {
  const model = deps.infer.models.byName(req.name);
  checkVersion(req.version || undefined);
  return model;
}

const SERVICE = '/inference.GRPCInferenceService/';

/** The GRPCInferenceService handlers, by method. */
export function kserveService(deps: KServeDeps) {
  const local = <Req>(method: string, answer: (req: Req) => unknown, access: 'open' | 'key' | 'admin' = 'key') => unaryLocal<Req>(deps, SERVICE + method, answer, access);
  return {
    ServerLive: local('ServerLive', () => ({ live: true }), 'open'),
    ServerReady: local('ServerReady', () => ({ ready: deps.ready() }), 'open'),
    ModelReady: local<{ name: string; version?: string }>('ModelReady', (req) => (modelOf(deps, req), { ready: deps.ready() })),
    ServerMetadata: local('ServerMetadata', () => ({ name: 'slabserve', version: deps.version, extensions: [] })),
    ModelMetadata: local<{ name: string; version?: string }>('ModelMetadata', (req) => modelMetadata(modelOf(deps, req))),
    ModelInfer: unaryInference(deps, SERVICE + 'ModelInfer', modelInfer),
    RepositoryIndex: local<{ ready?: boolean }>(
      'RepositoryIndex',
      async (req) => ({ models: ((await ask(deps, { op: 'index', ...(req.ready ? { ready: true } : {}) })).index ?? []).map((m) => ({ ...m, version: m.version ?? '', reason: m.reason ?? '' })) }),
      'admin',
    ),
    RepositoryModelLoad: local<{ model_name: string; parameters?: Record<string, Param> }>(
      'RepositoryModelLoad',
      async (req) => {
        const value = req.parameters?.config ? paramValue(req.parameters.config) : undefined;
        const config = serveSettings(typeof value === 'string' ? value : undefined);
        await ask(deps, { op: 'load', name: req.model_name, ...(config ? { config } : {}) });
        return {};
      },
      'admin',
    ),
    RepositoryModelUnload: local<{ model_name: string }>(
      'RepositoryModelUnload',
      async (req) => {
        await ask(deps, { op: 'unload', name: req.model_name });
        return {};
      },
      'admin',
    ),
  };
}
