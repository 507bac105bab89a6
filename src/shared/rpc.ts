/**
 * Request/response over a worker's message port, for control traffic only
 * (metrics scrapes, shutdown): never on the per-request data path, which
 * goes through the slabs.
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
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void; timer: NodeJS.Timeout }>();
  private nextId = 1;

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

  call<T = unknown>(method: string, arg?: unknown, timeoutMs = 10_000): Promise<T> {
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`rpc ${method} timed out after ${timeoutMs} ms`));
      }, timeoutMs);
      timer.unref();
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

  private settle(msg: RpcResponse): void {
    const p = this.pending.get(msg.id);
    if (!p) return;
    this.pending.delete(msg.id);
    clearTimeout(p.timer);
    if (msg.error !== undefined) p.reject(new Error(msg.error));
    else p.resolve(msg.result);
  }
}
