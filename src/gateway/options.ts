/**
 * The options a gateway thread reads (src/shared/options.ts), by name: the
 * server sends them resolved in the thread's workerData. Its own module, with
 * no side effects, so the main thread can import the list (the thread's entry
 * starts the thread when loaded).
 */
import type { OptionName, ResolvedValues } from '../shared/options.js';

export const GATEWAY_OPTIONS = [
  'host',
  'maxBodyBytes',
  'maxClientBatchSize',
  'truncate',
  'longInputs',
  'maxInputTokens',
  'chunkOverlapTokens',
  'openaiTokenIds',
  'requestTimeoutMs',
  'loneWaitUs',
  'heartbeatTimeoutMs',
  'tokenizerThreads',
  'tokenizerQueue',
  'inlineTokenizeChars',
  'wsMaxInflight',
  'wsMaxBufferedBytes',
  'wsMaxFrameBytes',
  'wsIdleTimeoutSeconds',
  'priorities',
  'sloP99Ms',
  'apiKeys',
  'adminApiKeys',
  'metricsAuth',
  'maxConnections',
  'maxUrlBytes',
  'maxHeaderBytes',
  'maxDiscardBytes',
  'discardTimeoutMs',
  'lazyLoad',
  'logLevel',
  'logFormat',
  'logProbes',
] as const satisfies readonly OptionName[];
export type GatewayOptions = ResolvedValues<(typeof GATEWAY_OPTIONS)[number]>;
