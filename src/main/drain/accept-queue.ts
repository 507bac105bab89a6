/**
 * Closing the listen sockets without resetting what the kernel queued for them.
 *
 * The kernel completes a TCP handshake before the server accepts the
 * connection. Closing a listen socket resets every connection still in its
 * accept queue or half-way through its handshake, and a client that already
 * sent its request reads ECONNRESET: from its side, a request lost. A server
 * under load always has a few there (a client without keep-alive reconnects at
 * once), and uWS accepts in native code, with no hook between an accept pass
 * and the close. So the drain asks the kernel first:
 *
 *   1. a socket filter on each of this process's listen sockets on the port
 *      drops new SYNs (such a client retries a second later and is refused by
 *      the closed port, as if it had come after the close);
 *   2. the handshakes under way complete (their ACKs pass) and the gateways
 *      accept everything queued, as they always do;
 *   3. once the accept queues are empty and no handshake on the port is half
 *      done, the caller closes the sockets: nothing is left to reset.
 *
 * Linux only (src/main/drain/kernel-sockets.ts); elsewhere the drain closes at once, as
 * before, and the outcome says why.
 */
import { linuxSockets, type KernelSockets } from './kernel-sockets.js';

/** What the drain found and did: logged when it could not make the close safe, asserted by tests. */
export interface AcceptQueueOutcome {
  /** Listen sockets of this process on the port. */
  sockets: number;
  /** Whether they drop new connections now. */
  filtered: boolean;
  /** From the filter to empty queues (or to the timeout). */
  waitedMs: number;
  /** Connections still queued or half open when the wait ended (0 unless it timed out). */
  left: number;
  /** Set when closing may still reset connections: why. */
  why?: string;
}

export interface AcceptQueueOptions {
  /** Stop waiting after this long (the close then resets what is left). */
  timeoutMs: number;
  /** How often the queues are read. */
  pollMs?: number;
}

/**
 * Steps 1 and 2 for this process's listen sockets on `port`: resolves once
 * closing them resets nothing, or after `timeoutMs`. The sockets stay open for
 * the caller to close. Never throws; the outcome says what it did.
 */
export async function quietListenSockets(port: number, options: AcceptQueueOptions, kernel: KernelSockets | Error = linuxSockets()): Promise<AcceptQueueOutcome> {
  const outcome: AcceptQueueOutcome = { sockets: 0, filtered: false, waitedMs: 0, left: 0 };
  if (kernel instanceof Error) return { ...outcome, why: kernel.message };
  const started = Date.now();
  try {
    const fds = kernel.listenSockets(port);
    outcome.sockets = fds.length;
    if (fds.length === 0) return { ...outcome, why: `this process has no listen socket on port ${port}` };
    for (const fd of fds) kernel.dropNewConnections(fd);
    outcome.filtered = true;
    for (;;) {
      outcome.left = fds.reduce((n, fd) => n + kernel.acceptQueueLength(fd), 0) || kernel.halfOpen(port);
      outcome.waitedMs = Date.now() - started;
      if (outcome.left === 0) return outcome;
      if (outcome.waitedMs >= options.timeoutMs) return { ...outcome, why: `${outcome.left} connection(s) still waiting after ${outcome.waitedMs} ms` };
      await new Promise((r) => setTimeout(r, options.pollMs ?? 2));
    }
  } catch (err) {
    return { ...outcome, why: (err as Error).message };
  }
}
