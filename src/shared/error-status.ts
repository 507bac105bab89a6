/**
 * The HTTP status of each error family (shared/errors.ts ErrorType): what the
 * gateway answers an error with, and what the WebSocket client reports as an
 * error frame's `status`, so one error has one status over either transport.
 * Its own module, with no runtime imports: the browser client bundles it.
 */
import type { ErrorType } from './errors.js';

export const STATUS_OF_TYPE: Readonly<Record<ErrorType, number>> = {
  validation: 422,
  too_long: 413,
  payload_too_large: 413,
  not_found: 404,
  method_not_allowed: 405,
  unsupported_media_type: 415,
  unauthorized: 401,
  overloaded: 429,
  timeout: 504,
  cancelled: 499,
  backend: 500,
  unavailable: 503,
  unsupported_output: 424,
};
