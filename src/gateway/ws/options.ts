/**
 * The WebSocket API's limits and their defaults, apart from src/gateway/ws/api.ts so the
 * main thread can read the defaults (SERVER_DEFAULTS) without loading the API.
 */

export interface WsOptions {
  /** Most requests in flight per socket (and the highest credit a client may ask for). */
  maxInflight: number;
  /** Unsent bytes above which the socket's requests are held back until it drains. */
  maxBufferedBytes: number;
  /** Largest frame accepted; a larger one closes the socket (1009). */
  maxFrameBytes: number;
  /** Seconds without traffic before the socket is closed (uWS sends pings meanwhile). */
  idleTimeoutSeconds: number;
}

/** The WebSocket API's defaults (the server's --ws-* flags start from these). */
export const WS_DEFAULTS: Readonly<WsOptions> = {
  maxInflight: 256,
  maxBufferedBytes: 1024 * 1024,
  maxFrameBytes: 2 * 1024 * 1024,
  idleTimeoutSeconds: 120,
};
