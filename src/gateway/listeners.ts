/**
 * What a gateway thread listens with: its uWebSockets.js app (HTTP and
 * WebSocket) and, where this thread serves it, its gRPC server. Kept in one
 * place because they are stopped together: the drain's first step stops
 * listening on both, and close() ends every socket, since a thread that ends
 * while uWS still holds a socket aborts the process.
 */
import type { Logger } from 'pino';
import type { GatewayGrpc } from './grpc/server.js';
import type { loadUws, TemplatedApp, us_listen_socket } from './uws.js';

type Uws = ReturnType<typeof loadUws>;

export class GatewayListeners {
  readonly app: TemplatedApp;
  /** This thread's gRPC server, once started (startGatewayGrpc). */
  grpc: GatewayGrpc | null = null;
  private readonly uws: Uws;
  private readonly logger: Logger;
  private listenSocket: us_listen_socket | null = null;
  private closeWebSockets: () => void = () => {};

  constructor(uws: Uws, logger: Logger) {
    this.uws = uws;
    this.app = uws.App();
    this.logger = logger;
  }

  /** The function that closes the app's WebSockets (registerWebSocket's), called by close(). */
  closingWebSocketsWith(close: () => void): void {
    this.closeWebSockets = close;
  }

  /** Listens for HTTP and WebSocket: resolves with the port, or null where it cannot (taken, not permitted). */
  listen(host: string, port: number): Promise<number | null> {
    return new Promise((resolve) =>
      this.app.listen(host, port, (socket) => {
        this.listenSocket = socket || null;
        resolve(socket ? this.uws.us_socket_local_port(socket) : null);
      }),
    );
  }

  /** New connections refused from now on (not accepted, then reset); the open ones stay. */
  stopListening(): void {
    if (this.listenSocket) this.uws.us_listen_socket_close(this.listenSocket);
    this.listenSocket = null;
    try {
      this.grpc?.stopListening();
    } catch (err) {
      this.logger.warn({ err: (err as Error).message }, 'gRPC: stopping to listen failed'); // uWS must still close below
    }
  }

  /** Every socket closed: uWS's at once, gRPC's once their calls end (bounded). */
  close(): Promise<void> {
    this.stopListening();
    try {
      this.closeWebSockets();
    } catch {
      // the app's close below ends them too
    }
    this.app.close();
    return (this.grpc?.close() ?? Promise.resolve()).catch((err: Error) => this.logger.warn({ err: err.message }, 'gRPC: closing failed'));
  }
}
