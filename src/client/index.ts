/**
 * The slabserve client, for Node.js (>= 20) and browsers: SlabClient over
 * one WebSocket (/ws, pipelined, credit-aware, reconnecting), SlabHttpClient
 * over fetch; same methods, same result types, same typed errors. Both take
 * `apiKey` (docs/security.md).
 */
export {
  SlabClient,
  backoffDelay,
  toWebSocketUrl,
  type ReconnectOptions,
  type ServerHello,
  type SlabClientEvent,
  type SlabClientOptions,
  type SlabClientState,
  type WebSocketConstructor,
  type WebSocketLike,
} from './ws-client.js';
export { SlabHttpClient, type FetchLike, type FetchResponseLike, type SlabHttpClientOptions } from './http-client.js';
export {
  SlabAbortError,
  SlabClientError,
  SlabConnectionError,
  SlabUnauthorizedError,
  fromHttpError,
  fromServerError,
  parseRetryAfter,
  typeOfStatus,
  type ClientErrorType,
  type SlabClientErrorInit,
} from './errors.js';
export { wsKeyProtocol } from './auth.js';
export { decodeF32, decodeRows, decodeRowsOf } from './types.js';
export type {
  CallOptions,
  DecodeOptions,
  EmbeddingRow,
  EmbeddingType,
  EmbedOptions,
  LongInputs,
  Prediction,
  PredictOptions,
  RerankHit,
  RerankOptions,
  SignedEmbeddingType,
  SimilarityOptions,
  SlabApi,
  TextInputs,
  TokenInputs,
  TokenInfo,
  TokenizeOptions,
  TokenizeResult,
  UnsignedEmbeddingType,
} from './types.js';
