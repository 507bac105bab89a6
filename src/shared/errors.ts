/**
 * Typed errors shared by every thread. Each carries a stable `code` (what a
 * client or a test matches on) and a `type` (the error family an HTTP layer
 * maps to a status). Modelled on undici's errors: one class per failure mode.
 */

export type ErrorType =
  | 'validation' // bad input from the caller: 4xx
  | 'too_long' // input longer than the model accepts without truncation: 413
  | 'not_found' // unknown model: 404
  | 'overloaded' // no free slot / queue full: 429
  | 'timeout' // deadline passed before the answer: 504
  | 'cancelled' // the caller went away
  | 'backend' // the inference run failed: 500
  | 'unavailable' // engine closed or not ready: 503
  | 'payload_too_large' // HTTP body (413), URL (414) or request head (431) over its limit
  | 'unsupported_media_type' // HTTP body neither JSON nor msgpack: 415
  | 'method_not_allowed' // HTTP method not served on that path: 405
  | 'unauthorized' // no API key, or not a valid one: 401
  | 'unsupported_output'; // an output the model does not give (sparse of a dense model, per-token of SPLADE): 424, as TEI

export class SlabserveError extends Error {
  readonly code: string;
  readonly type: ErrorType;
  constructor(message: string, code: string, type: ErrorType, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
    this.type = type;
  }
}

export class ValidationError extends SlabserveError {
  constructor(message: string) {
    super(message, 'SLABSERVE_INVALID_INPUT', 'validation');
  }
}

/** Throws a ValidationError unless `value` is an integer from 0 (`from` says it, e.g. "0 (auto)") to `max`. */
export function checkIntegerIn(name: string, value: number, from: string, max: number): void {
  if (!Number.isInteger(value) || value < 0 || value > max) throw new ValidationError(`${name} must be an integer from ${from} to ${max}, got ${value}`);
}

/**
 * A model named for a task it does not do (a classifier asked to embed): 422 with the code every
 * invalid input has (clients match on it), but gRPC's FAILED_PRECONDITION, as TEI answers it.
 */
export class WrongTaskError extends ValidationError {}

/**
 * An output the model cannot give: sparse weights of a model without a sparse
 * head, token vectors of a SPLADE model, `normalize` of SPLADE weights. 424 as
 * text-embeddings-inference answers it; gRPC FAILED_PRECONDITION.
 */
export class OutputUnavailableError extends SlabserveError {
  constructor(message: string) {
    super(message, 'SLABSERVE_OUTPUT_UNAVAILABLE', 'unsupported_output');
  }
}

/** A ValidationError that names the (first) offending top-level field: OpenAI's `param`. */
export class FieldValidationError extends ValidationError {
  readonly param: string | null;
  constructor(message: string, param: string | null) {
    super(message);
    this.param = param;
  }
}

/** A body field the request does not take (a misspelling, or another API's field), with the nearest one it does. */
export class UnknownFieldError extends FieldValidationError {
  /** The field's path, dotted ("parameters.top_kk"). */
  readonly field: string;
  readonly suggestion: string | null;
  constructor(message: string, field: string, suggestion: string | null) {
    super(message, field.split('.')[0]!);
    this.field = field;
    this.suggestion = suggestion;
  }
}

/** An error raised by the HTTP layer itself (bad body, wrong method, ...). */
export class HttpError extends SlabserveError {
  readonly status: number;
  readonly headers: Record<string, string>;
  constructor(status: number, kind: ErrorType, code: string, message: string, headers: Record<string, string> = {}) {
    super(message, code, kind);
    this.status = status;
    this.headers = headers;
  }
}

export class InputTooLongError extends SlabserveError {
  readonly length: number;
  readonly maxLength: number;
  /** What sets the bound: the model's length, or --max-input-tokens (a chunked input's whole length). */
  readonly bound: string;
  constructor(length: number, maxLength: number, advice = 'send "truncate": true to cut it', bound = 'the model accepts') {
    super(`input is ${length} tokens long, ${bound} at most ${maxLength}; ${advice}`, 'SLABSERVE_INPUT_TOO_LONG', 'too_long');
    this.length = length;
    this.maxLength = maxLength;
    this.bound = bound;
  }
}

export class ModelNotFoundError extends SlabserveError {
  /** The name asked for. */
  readonly model: string;
  /** `hint`: how to get it, when the repository has it (appended to the message). */
  constructor(name: string, known: readonly string[], hint = '') {
    super(`unknown model "${name}"; loaded: ${known.join(', ') || '(none)'}${hint}`, 'SLABSERVE_MODEL_NOT_FOUND', 'not_found');
    this.model = name;
  }
}

/** The model a request had found was unloaded (or replaced by a reload) before the request took its slots. */
export class ModelUnloadedError extends SlabserveError {
  constructor() {
    super('the model was unloaded while this request was being prepared; retry (a reloaded model takes it)', 'SLABSERVE_MODEL_UNLOADED', 'unavailable');
  }
}

export class NotReadyError extends SlabserveError {
  constructor(message = 'the server is not ready (warming up or draining)') {
    super(message, 'SLABSERVE_NOT_READY', 'unavailable');
  }
}

export class OverloadedError extends SlabserveError {
  /** Seconds a client should wait before retrying (Retry-After). */
  readonly retryAfterSeconds: number;
  constructor(message: string, retryAfterSeconds = 1) {
    super(message, 'SLABSERVE_OVERLOADED', 'overloaded');
    this.retryAfterSeconds = retryAfterSeconds;
  }
}

export class DeadlineExceededError extends SlabserveError {
  constructor(message = 'request deadline passed before it could be answered') {
    super(message, 'SLABSERVE_DEADLINE_EXCEEDED', 'timeout');
  }
}

export class CancelledError extends SlabserveError {
  constructor(message = 'request was cancelled') {
    super(message, 'SLABSERVE_CANCELLED', 'cancelled');
  }
}

export class InferenceError extends SlabserveError {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, 'SLABSERVE_INFERENCE_FAILED', 'backend', options);
  }
}

export class EngineClosedError extends SlabserveError {
  constructor(message = 'engine is closed') {
    super(message, 'SLABSERVE_ENGINE_CLOSED', 'unavailable');
  }
}

/** The inference thread died or hung with this request queued or running; a new one is starting. Retry. (503) */
export class InferenceRestartedError extends SlabserveError {
  constructor(message = 'the inference thread was restarted while this request was queued or running; retry it') {
    super(message, 'SLABSERVE_INFERENCE_RESTARTED', 'unavailable');
  }
}

/**
 * The model cannot run this input: its batch failed, and once split, this
 * input alone still failed while the others of its batch ran. (422)
 */
export class InputFailedError extends SlabserveError {
  constructor(message = 'the model failed on this input (the other inputs batched with it ran); it will fail again if sent again') {
    super(message, 'SLABSERVE_INPUT_FAILED', 'validation');
  }
}

/** A model name no loaded model can have: refused before any lookup (404, as an unknown model is). */
export class InvalidModelNameError extends SlabserveError {
  constructor(name: string) {
    const shown = JSON.stringify(name.length > 64 ? `${name.slice(0, 64)}...` : name);
    super(`invalid model name ${shown}: a name is 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit, without '..'`, 'SLABSERVE_INVALID_MODEL_NAME', 'not_found');
  }
}
