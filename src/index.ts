export { createEngine, Engine, ENGINE_DEFAULTS, resolveBatching } from './main/engine.js';
export type { Classification, EmbedOptions, EngineOptions, ModelInfo, ModelOptions, ModelStats, RequestOptions } from './main/engine.js';
export * from './shared/errors.js';
export type { BatchingOptions } from './gpu-worker/scheduler.js';
export { SlabClient, SlabHttpClient, SlabClientError, SlabConnectionError, SlabAbortError } from './client/index.js';
