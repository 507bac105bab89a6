/**
 * The KServe v2 / Triton HTTP inference protocol (the JSON form), so Triton
 * and KServe clients and gateways can call slabserve:
 *
 *   GET  /v2/health/live               200 {live: true} while this gateway thread runs
 *   GET  /v2/health/ready              200 {ready: true}; 503 {ready: false} while warming up or draining
 *   GET  /v2                           server metadata {name, version, extensions}
 *   GET  /v2/models/{name}             model metadata {name, versions, platform, inputs, outputs}
 *   GET  /v2/models/{name}/ready       200 {name, ready: true}; 503 when not
 *   POST /v2/models/{name}/infer       {id?, parameters?, inputs: [tensor], outputs?: [{name}]}
 *                                      -> {model_name, model_version, id?, outputs: [tensor]}
 *   (each /v2/models/{name}/... also as /v2/models/{name}/versions/1/...)
 *
 * Inputs are either token tensors, `input_ids` with optional `attention_mask`
 * and `token_type_ids` (INT64 or INT32, shape [B, T], data flat in row-major
 * order; nested lists are flattened): a row's real tokens are where its mask
 * is 1, padding on the right; no mask means no padding. Or texts: one BYTES
 * tensor (named `text`, shape [B] or [B, 1]); a reranker takes BYTES `query`
 * (one, or one per text) and `text`. Request parameters: `normalize`
 * (embedding models), `truncate` (texts).
 *
 * Outputs, FP32: `embedding` [B, dim] (embedding models); `probabilities` and
 * `logits` [B, labels] (classifiers); `score` (sigmoid of the logit) and
 * `logits` [B, 1] (rerankers). The request's `outputs` picks some, in its order.
 *
 * Errors are `{error: message}` as KServe answers them, with our statuses (an
 * invalid request is 422, an unknown model 404, overload 429, ...). Not
 * supported: Triton's binary tensor extension (application/octet-stream
 * bodies are refused with 415), model repository and statistics extensions.
 */
import { cutOf } from '../long-inputs.js';
import type { ChunkPolicy } from '../../core/inputs.js';
import { LONG_INPUTS, type LongInputs } from '../../shared/options.js';
import { HttpError, ValidationError } from '../../shared/errors.js';
import { servedSources } from '../../shared/model-format/model-config.js';
import { type InferCall, type InferResult } from '../../core/infer.js';
import { type CallInputs } from '../../core/inputs.js';
import { classifications, embeddings, rowOf } from '../../core/rows.js';
import { type ServedModel } from '../../core/served-model.js';
import { floatAnswer } from '../http/answers.js';
import { float32RowsInJson } from '../http/float-json.js';
import type { Answer, RequestContext } from '../http/request-context.js';
import type { Route, RouteDeps } from '../http/route-types.js';
import { KServeInferRequest, parseBody, type KServeTensor } from '../schemas.js';
import { serveInference, type Endpoint, type EndpointContext } from '../serving.js';

export const MODEL_VERSION = '1';
const ROUTE = '/v2/infer';
const PLATFORM = 'onnxruntime_onnx';

/** Fails with KServe's `{error: message}` and our status. */
function failKServe(ctx: RequestContext, err: unknown): number {
  return ctx.fail(err, (info) => ({ error: info.message }));
}

/** Runs a handler, answering any error in KServe's shape. */
function kserve(handle: (ctx: RequestContext, deps: RouteDeps, params: string[]) => void | Promise<void>): Route['handle'] {
  return async (ctx, deps, params) => {
    try {
      await handle(ctx, deps, params);
    } catch (err) {
      failKServe(ctx, err);
    }
  };
}

export function checkVersion(version: string | undefined): void {
  if (version !== undefined && version !== MODEL_VERSION) {
    throw new HttpError(404, 'not_found', 'SLABSERVE_MODEL_VERSION_NOT_FOUND', `unknown model version "${version}"; the only version is "${MODEL_VERSION}"`);
  }
}

const metadataHandler = kserve((ctx, deps, [name, version]) => {
  const model = deps.infer.models.byName(name!);
  checkVersion(version);
  ctx.send(200, modelMetadata(model));
});

const modelReadyHandler = kserve((ctx, deps, [name, version]) => {
  const model = deps.infer.models.byName(name!);
  checkVersion(version);
  const ready = deps.ready();
  ctx.send(ready ? 200 : 503, { name: model.plan.spec.name, ready });
});

const inferHandler: Route['handle'] = (ctx, deps, params) => serveInference(ctx, deps, inferEndpoint, failKServe, params);

const fail = failKServe;

export const kserveRoutes: Route[] = [
  { method: 'get', path: '/v2/health/live', access: 'open', probe: true, fail, handle: (ctx) => ctx.send(200, { live: true }) },
  { method: 'get', path: '/v2/health/ready', access: 'open', probe: true, fail, handle: (ctx, deps) => ctx.send(deps.ready() ? 200 : 503, { ready: deps.ready() }) },
  { method: 'get', path: '/v2', fail, handle: (ctx, deps) => ctx.send(200, { name: 'slabserve', version: serverVersion(deps), extensions: [] }) },
  { method: 'get', path: '/v2/models/:name', fail, handle: metadataHandler },
  { method: 'get', path: '/v2/models/:name/versions/:version', fail, handle: metadataHandler },
  { method: 'get', path: '/v2/models/:name/ready', fail, handle: modelReadyHandler },
  { method: 'get', path: '/v2/models/:name/versions/:version/ready', fail, handle: modelReadyHandler },
  { method: 'post', path: '/v2/models/:name/infer', fail, handle: inferHandler },
  { method: 'post', path: '/v2/models/:name/versions/:version/infer', fail, handle: inferHandler },
];

function serverVersion(deps: RouteDeps): string {
  const v = deps.version ?? (deps.info() as { version?: unknown } | null)?.version;
  return typeof v === 'string' ? v : 'unknown';
}

interface TensorMeta {
  name: string;
  datatype: string;
  shape: number[];
}

/** Output tensors of a model, by task. */
function outputsOf(model: ServedModel): TensorMeta[] {
  const spec = model.plan.spec;
  switch (spec.task) {
    case 'embed':
      return [{ name: 'embedding', datatype: 'FP32', shape: [-1, spec.dimension] }];
    case 'classify':
      return [
        { name: 'probabilities', datatype: 'FP32', shape: [-1, spec.labels.length] },
        { name: 'logits', datatype: 'FP32', shape: [-1, spec.labels.length] },
      ];
    case 'rerank':
      return [
        { name: 'score', datatype: 'FP32', shape: [-1, 1] },
        { name: 'logits', datatype: 'FP32', shape: [-1, 1] },
      ];
  }
}

/** The token tensors a request may send: the graph's own (position_ids are the server's to compute). */
const TOKEN_INPUTS = ['input_ids', 'attention_mask', 'token_type_ids'];

export function modelMetadata(model: ServedModel) {
  const spec = model.plan.spec;
  const inputs: TensorMeta[] = TOKEN_INPUTS.filter((name) => spec.graphInputs.includes(name)).map((name) => ({ name, datatype: 'INT64', shape: [-1, -1] }));
  if (spec.task === 'rerank') inputs.push({ name: 'query', datatype: 'BYTES', shape: [-1] }, { name: 'text', datatype: 'BYTES', shape: [-1] });
  else inputs.push({ name: 'text', datatype: 'BYTES', shape: [-1] });
  return { name: spec.name, versions: [MODEL_VERSION], platform: PLATFORM, inputs, outputs: outputsOf(model), parameters: settingsOf(model) };
}

/**
 * How the model is served, and where each setting came from (KServe v2 allows
 * `parameters` as an extension): what /info says of it too.
 */
function settingsOf(model: ServedModel): Record<string, unknown> {
  const { spec, maxLength } = model.plan;
  return {
    task: spec.task,
    dtype: spec.dtype,
    max_input_length: maxLength,
    ...(spec.task === 'embed' ? { pooling: spec.pooling, normalize: spec.normalize, include_prompt: spec.includePrompt, prompts: spec.prompts } : {}),
    ...(spec.defaultPrompt ? { default_prompt: spec.defaultPrompt } : {}),
    graph_inputs: spec.graphInputs,
    sources: servedSources(spec, maxLength),
  };
}

// ------------------------------------------------------------ infer

const invalid = (message: string) => new ValidationError(message);

/** The tensor's elements, flat, checked against its shape. */
function flatData(t: KServeTensor): unknown[] {
  let data: unknown[] = t.data;
  for (let depth = 1; depth < t.shape.length && data.some(Array.isArray); depth++) data = data.flat();
  if (data.some(Array.isArray)) throw invalid(`input ${t.name}: data is nested deeper than its shape [${t.shape.join(', ')}]`);
  const n = t.shape.reduce((a, b) => a * b, 1);
  if (data.length !== n) throw invalid(`input ${t.name}: ${data.length} elements, but shape [${t.shape.join(', ')}] holds ${n}`);
  return data;
}

/** An INT64/INT32 [B, T] tensor as Int32 values. */
function intMatrix(t: KServeTensor, like?: readonly number[]): Int32Array {
  if (t.datatype !== 'INT64' && t.datatype !== 'INT32') throw invalid(`input ${t.name} must be INT64 or INT32, not ${t.datatype}`);
  if (t.shape.length !== 2) throw invalid(`input ${t.name} must have shape [batch, sequence], got [${t.shape.join(', ')}]`);
  if (like && (t.shape[0] !== like[0] || t.shape[1] !== like[1])) {
    throw invalid(`input ${t.name} has shape [${t.shape.join(', ')}], input_ids [${like.join(', ')}]: they must match`);
  }
  const data = flatData(t);
  const out = new Int32Array(data.length);
  for (let i = 0; i < data.length; i++) {
    const v = data[i];
    if (typeof v !== 'number' || !Number.isInteger(v) || v < -(2 ** 31) || v >= 2 ** 31) throw invalid(`input ${t.name}: element ${i} (${typeof v === 'number' ? String(v) : typeof v}) is not an integer token value`);
    out[i] = v;
  }
  return out;
}

/** A BYTES [B] (or [B, 1]) tensor of texts. */
function texts(t: KServeTensor): string[] {
  if (t.datatype !== 'BYTES') throw invalid(`input ${t.name} must be BYTES, not ${t.datatype}`);
  if (t.shape.length === 0 || t.shape.length > 2 || (t.shape.length === 2 && t.shape[1] !== 1)) {
    throw invalid(`input ${t.name} must have shape [batch] or [batch, 1], got [${t.shape.join(', ')}]`);
  }
  const data = flatData(t);
  if (data.length === 0) throw invalid(`input ${t.name} must hold at least one text`);
  return data.map((v, i) => {
    if (typeof v !== 'string') throw invalid(`input ${t.name}: element ${i} is not a string`);
    return v;
  });
}

function booleanParam(params: Record<string, unknown> | undefined, name: string): boolean | undefined {
  const v = params?.[name];
  if (v === undefined) return undefined;
  if (typeof v !== 'boolean') throw invalid(`parameter ${name} must be a boolean`);
  return v;
}

/** The parameter long_inputs (docs/long-inputs.md): one of the modes, or absent. */
function longParam(params: Record<string, unknown> | undefined): LongInputs | undefined {
  const v = params?.long_inputs;
  if (v === undefined) return undefined;
  if (!LONG_INPUTS.includes(v as LongInputs)) throw invalid(`parameter long_inputs must be one of ${LONG_INPUTS.join(', ')}`);
  return v as LongInputs;
}

type Encoded = { ids: Int32Array; typeIds: Int32Array }[];

/** Token tensors -> one encoding per row (its real tokens: where the mask is 1, right padding). */
function fromTokens(tensors: Map<string, KServeTensor>): Encoded {
  const idsT = tensors.get('input_ids')!;
  const ids = intMatrix(idsT);
  const [B, T] = idsT.shape as [number, number];
  if (B < 1 || T < 1) throw invalid(`input input_ids must have at least one row and one column, got [${B}, ${T}]`);
  const maskT = tensors.get('attention_mask');
  const typesT = tensors.get('token_type_ids');
  const mask = maskT ? intMatrix(maskT, idsT.shape) : null;
  const types = typesT ? intMatrix(typesT, idsT.shape) : null;
  const out: Encoded = [];
  for (let b = 0; b < B; b++) {
    const row = b * T;
    let len = T;
    if (mask) {
      len = 0;
      while (len < T && mask[row + len] === 1) len++;
      for (let j = len; j < T; j++) {
        const m = mask[row + j];
        if (m === 1) throw invalid(`attention_mask row ${b} is not right-padded: a 1 at position ${j} follows a 0 (left padding is not supported)`);
        if (m !== 0) throw invalid(`attention_mask row ${b}: ${m} at position ${j}; a mask holds 0 and 1`);
      }
      if (len === 0) throw invalid(`attention_mask row ${b} has no real token`);
    }
    out.push({ ids: ids.slice(row, row + len), typeIds: types ? types.slice(row, row + len) : new Int32Array(len) });
  }
  return out;
}

/** The inputs of an infer request: token tensors, or BYTES texts (a reranker: query and text). */
function callInputs(model: ServedModel, tensors: Map<string, KServeTensor>, cut: { truncate: boolean; chunk?: ChunkPolicy }, ec: EndpointContext): CallInputs {
  const spec = model.plan.spec;
  const max = ec.limits.maxClientBatchSize;
  const tooMany = (n: number) => invalid(`${n} inputs exceed the limit of ${max} per request (--max-client-batch-size)`);
  if (tensors.has('input_ids')) {
    const extra = [...tensors.keys()].filter((k) => !TOKEN_INPUTS.includes(k));
    if (extra.length) throw invalid(`unexpected input ${extra.join(', ')} beside input_ids; token inputs are ${TOKEN_INPUTS.join(', ')}`);
    const tokens = fromTokens(tensors);
    if (tokens.length > max) throw tooMany(tokens.length);
    ec.infer.encoder.checkTokens(model, tokens); // before any slot is taken
    return { kind: 'tokens', tokens };
  }
  if (spec.task === 'rerank') {
    const q = tensors.get('query');
    const t = tensors.get('text');
    if (!q || !t || tensors.size !== 2) throw invalid(`model ${spec.name} takes BYTES inputs query and text (or input_ids); got ${[...tensors.keys()].join(', ')}`);
    const queries = texts(q);
    const docs = texts(t);
    if (queries.length !== 1 && queries.length !== docs.length) throw invalid(`query holds ${queries.length} texts: give one, or one per text (${docs.length})`);
    if (docs.length > max) throw tooMany(docs.length);
    return { kind: 'pairs', queries, texts: docs, ...cut };
  }
  const only = [...tensors.values()];
  if (only.length !== 1) throw invalid(`model ${spec.name} takes one BYTES input (text) or input_ids; got ${[...tensors.keys()].join(', ')}`);
  const list = texts(only[0]!);
  if (list.length > max) throw tooMany(list.length);
  return { kind: 'inputs', inputs: list, ...cut };
}

/** What an infer request's answer needs: the outputs it asked for, its id, `normalize`. */
export type InferState = { wanted: string[]; id: string | undefined; normalize: boolean | undefined };

/** POST /v2/models/{name}[/versions/{v}]/infer (and gRPC's ModelInfer, grpc/kserve.ts, with the path's model and version from the message). */
export const inferEndpoint: Endpoint<InferState> = {
  route: ROUTE,
  task: null,
  parse(raw, ec) {
    const model = ec.infer.models.byName(ec.pathModel!);
    ec.label.model = model.plan.spec.name; // not the path's name: a metrics label must not take any value a client sends
    checkVersion(ec.params?.[1]);
    const body = parseBody(KServeInferRequest, raw);
    const tensors = new Map<string, KServeTensor>();
    for (const t of body.inputs) {
      if (tensors.has(t.name)) throw invalid(`input ${t.name} is given twice`);
      tensors.set(t.name, t);
    }
    const available = outputsOf(model);
    const wanted = body.outputs?.map((o) => o.name) ?? available.map((o) => o.name);
    for (const w of wanted) {
      if (!available.some((o) => o.name === w)) throw invalid(`unknown output ${w}; model ${model.plan.spec.name} gives ${available.map((o) => o.name).join(', ')}`);
    }
    const cut = cutOf(ec, model, { long: longParam(body.parameters), truncate: booleanParam(body.parameters, 'truncate') });
    const normalize = booleanParam(body.parameters, 'normalize');
    const call = {
      model,
      inputs: callInputs(model, tensors, cut, ec),
      timeoutMs: ec.timeoutMs,
      priority: ec.priority === undefined ? undefined : ec.infer.priorityIndex(ec.priority),
      cancel: ec.cancel,
    };
    return { call, state: { wanted, id: body.id, normalize } };
  },
  truncateAdvice: () => 'send "parameters": {"truncate": true} to cut a text, or send shorter token tensors',
  answer(r, call, state) {
    // parameters.windows: where an input was chunked, the windows the request ran (docs/long-inputs.md)
    const head = { ...inferHead(call, state), ...(r.windows !== undefined ? { parameters: { windows: r.windows } } : {}) };
    return inferAnswer(head, inferOutputs(r, call, state));
  },
};

/** An infer answer's fields beside its outputs: the model, its version, the request's id. */
export function inferHead(call: InferCall, state: InferState): { model_name: string; model_version: string; id?: string } {
  return { model_name: call.model.plan.spec.name, model_version: MODEL_VERSION, ...(state.id !== undefined ? { id: state.id } : {}) };
}

/** The FP32 output tensors an infer request asked for, in its order, each flat in row-major order. */
export function inferOutputs(r: InferResult, call: InferCall, state: InferState): { name: string; shape: number[]; data: Float32Array }[] {
  const spec = call.model.plan.spec;
  const B = r.rows.rows.length / r.rows.width;
  const produced = new Map<string, { shape: number[]; data: Float32Array[] }>();
  if (spec.task === 'embed') {
    produced.set('embedding', { shape: [B, spec.dimension], data: embeddings(call.model, r.rows, state.normalize) });
  } else if (spec.task === 'classify') {
    const classes = classifications(call.model, r.rows);
    produced.set('probabilities', { shape: [B, spec.labels.length], data: classes.map((c) => c.probabilities) });
    produced.set('logits', { shape: [B, spec.labels.length], data: classes.map((c) => c.logits) });
  } else {
    const rows = Array.from({ length: B }, (_, i) => rowOf(r.rows, i));
    produced.set('score', { shape: [B, 1], data: rows.map((row) => row.subarray(0, 1)) });
    produced.set('logits', { shape: [B, 1], data: rows.map((row) => row.subarray(1, 2)) });
  }
  return state.wanted.map((w) => {
    const p = produced.get(w)!;
    const data = new Float32Array(p.data.reduce((n, row) => n + row.length, 0));
    let at = 0;
    for (const row of p.data) (data.set(row, at), (at += row.length));
    return { name: w, shape: p.shape, data };
  });
}

/**
 * An infer answer whose FP32 tensors are written from their float32 values,
 * each the shortest decimal that reads back to it (as /embed and OpenAI's
 * route write them), not the 17-digit double it widens to.
 */
function inferAnswer(head: Record<string, unknown>, outputs: { name: string; shape: number[]; data: Float32Array }[]): Answer & { value(): unknown } {
  const value = () => ({ ...head, outputs: outputs.map((o) => ({ name: o.name, datatype: 'FP32', shape: o.shape, data: Array.from(o.data) })) });
  return floatAnswer(value, () => {
    const pieces = [`${JSON.stringify(head).slice(0, -1)},"outputs":[`];
    outputs.forEach((o, i) => {
      pieces[i] += `${i > 0 ? ',' : ''}{"name":${JSON.stringify(o.name)},"datatype":"FP32","shape":${JSON.stringify(o.shape)},"data":`;
      pieces.push('}');
    });
    pieces[outputs.length] += ']}';
    return float32RowsInJson(pieces, outputs.map((o) => o.data));
  });
}
