/**
 * The gRPC status of each of the server's errors (shared/errors.ts), so one
 * failure reads the same over HTTP, WebSocket and gRPC. By error family, as
 * the HTTP status is (shared/error-status.ts); text-embeddings-inference's
 * choices where it has one (a model of the wrong task: FAILED_PRECONDITION).
 * The error's SLABSERVE_ code goes in the trailing metadata (`slabserve-code`),
 * and an overload's retry delay as `retry-after` (seconds, as HTTP's header)
 * and `grpc-retry-pushback-ms` (gRPC's own retry-throttling trailer).
 */
import { Metadata, status as Status, type ServiceError } from '@grpc/grpc-js';
import { OverloadedError, SlabserveError, WrongTaskError, type ErrorType } from '../../shared/errors.js';

export const GRPC_CODE_OF_TYPE: Readonly<Record<ErrorType, Status>> = {
  validation: Status.INVALID_ARGUMENT, // 422 and 400
  too_long: Status.INVALID_ARGUMENT, // TEI: a validation error
  payload_too_large: Status.RESOURCE_EXHAUSTED, // gRPC's status for a message over its size limit
  not_found: Status.NOT_FOUND,
  method_not_allowed: Status.UNIMPLEMENTED,
  unsupported_media_type: Status.INVALID_ARGUMENT,
  unauthorized: Status.UNAUTHENTICATED,
  overloaded: Status.RESOURCE_EXHAUSTED, // 429
  timeout: Status.DEADLINE_EXCEEDED, // 504
  cancelled: Status.CANCELLED,
  backend: Status.INTERNAL,
  unavailable: Status.UNAVAILABLE, // 503
  unsupported_output: Status.FAILED_PRECONDITION, // 424, as TEI's gRPC answers a missing output
};

/** `err` as the status a call ends with: code, message and trailing metadata. */
export function grpcStatusOf(err: unknown): Partial<ServiceError> & { code: Status; details: string; metadata: Metadata } {
  const metadata = new Metadata();
  if (!(err instanceof SlabserveError)) {
    metadata.set('slabserve-code', 'SLABSERVE_INTERNAL');
    return { code: Status.INTERNAL, details: 'internal error', metadata };
  }
  metadata.set('slabserve-code', err.code);
  if (err instanceof OverloadedError) {
    const seconds = Math.max(1, Math.ceil(err.retryAfterSeconds));
    metadata.set('retry-after', String(seconds));
    metadata.set('grpc-retry-pushback-ms', String(seconds * 1000));
  }
  const code = err instanceof WrongTaskError ? Status.FAILED_PRECONDITION : GRPC_CODE_OF_TYPE[err.type];
  return { code, details: err.message, metadata };
}
