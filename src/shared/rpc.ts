/**
 * Request/response over a worker's message port, for control traffic
 * (metrics scrapes, shutdown, loads) and one call per batch to a session
 * thread: never per request, whose data goes through the slabs.
 */

interface Port {
  postMessage(message: unknown): void;
  on(event: 'message', listener: (message: unknown) => void): unknown;
}

type RpcRequest = { rpc: 'req'; id: number; method: string; arg?: unknown };
type RpcResponse = { rpc: 'res'; id: number; result?: unknown; error?: string };

export type RpcHandlers = Record<string, (arg: unknown) => unknown>;

export function isRpcMessage(m: unknown): boolean {
  return typeof m === 'object' && m !== null && 'rpc' in m;
}

export class RpcPeer {
  private readonly port: Port;
  private readonly handlers: RpcHandlers;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void; timer: NodeJS.Timeout | undefined }>();
  private nextId = 1;
  /** Set once the other side is gone: every call then fails with it. */
  private closedBecause: string | null = null;

  constructor(port: Port, handlers: RpcHandlers = {}) {
    this.port = port;
    this.handlers = handlers;
    port.on('message', (m) => {
      if (!isRpcMessage(m)) return;
      const msg = m as RpcRequest | RpcResponse;
      if (msg.rpc === 'req') void this.answer(msg);
      else this.settle(msg);
    });
  }

  /** Calls `method` on the other side; `timeoutMs` 0: no time limit (a watchdog elsewhere bounds it). */
  call<T = unknown>(method: string, arg?: unknown, timeoutMs = 10_000): Promise<T> {
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      if (this.closedBecause !== null) {
        reject(new Error(this.closedBecause));
        return;
      }
      const timer =
        timeoutMs > 0
          ? setTimeout(() => {
              this.pending.delete(id);
              reject(new Error(`rpc ${method} timed out after ${timeoutMs} ms`));
            }, timeoutMs).unref()
          : undefined;
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject, timer });
      this.port.postMessage({ rpc: 'req', id, method, arg } satisfies RpcRequest);
    });
  }

  private async answer(msg: RpcRequest): Promise<void> {
    const handler = this.handlers[msg.method];
    try {
      if (!handler) throw new Error(`no rpc method "${msg.method}"`);
      this.port.postMessage({ rpc: 'res', id: msg.id, result: await handler(msg.arg) } satisfies RpcResponse);
    } catch (err) {
      this.port.postMessage({ rpc: 'res', id: msg.id, error: (err as Error).message } satisfies RpcResponse);
    }
  }

  /** The other side is gone (its thread exited): fails every pending call, and every later one, with `reason`. */
  close(reason: string): void {
    this.closedBecause = reason;
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(new Error(reason));
    }
    this.pending.clear();
  }

  private settle(msg: RpcResponse): void {
    const p = this.pending.get(msg.id);
    if (!p) return;
    this.pending.delete(msg.id);
    clearTimeout(p.timer);
    if (msg.error !== undefined) p.reject(new Error(msg.error));
    else p.resolve(msg.result);
  }
}
