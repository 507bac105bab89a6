/**
 * A request's cancellation: the client went away, cancelled it, or a sibling
 * input failed. Cheaper than an AbortController on the request path (which
 * allocates an AbortSignal, an EventTarget and an event per abort, and whose
 * listeners cost the gateway CPU on every request): a reason and one listener.
 * A request is in one stage at a time (its body being read, its texts waiting
 * for the tokenizer pool, its slots queued or running), and that stage is
 * the listener.
 */
export class Cancellation {
  private why: string | undefined;
  private listener: ((reason: string) => void) | undefined;

  /** Why it was cancelled (client_disconnect, ws_cancel, ws_close, ...), or undefined. */
  get reason(): string | undefined {
    return this.why;
  }

  get cancelled(): boolean {
    return this.why !== undefined;
  }

  /** Cancels once (later calls do nothing) and tells the listener. */
  cancel(reason: string): void {
    if (this.why !== undefined) return;
    this.why = reason;
    const l = this.listener;
    this.listener = undefined;
    l?.(reason);
  }

  /** `fn` is called on cancel (at once if already cancelled); it replaces the previous listener. */
  listen(fn: (reason: string) => void): void {
    if (this.why !== undefined) {
      fn(this.why);
      return;
    }
    this.listener = fn;
  }

  /** Removes `fn` if it is the listener. */
  unlisten(fn: (reason: string) => void): void {
    if (this.listener === fn) this.listener = undefined;
  }

  /**
   * A cancellation that follows `signal` (the public API takes AbortSignals;
   * the reason is the signal's when it is a string), and the function that
   * stops following it: call it once the request has settled, so a signal
   * shared by many calls keeps no listener per call.
   */
  static following(signal: AbortSignal | undefined): { cancellation: Cancellation | undefined; stop: () => void } {
    if (!signal) return { cancellation: undefined, stop: noop };
    const c = new Cancellation();
    const onAbort = () => c.cancel(typeof signal.reason === 'string' ? signal.reason : 'aborted');
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
    return { cancellation: c, stop: () => signal.removeEventListener('abort', onAbort) };
  }
}

const noop = () => {};
