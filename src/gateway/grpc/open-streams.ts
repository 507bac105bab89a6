/**
 * The streams a gRPC server has open, so that a drain can end them well: each
 * answers the messages it has read, then ends with OK (a client resends any
 * message it sent after that elsewhere: the answers come in order, so it knows
 * which). Without this a stream the client keeps open would be cut at close.
 */
export class OpenStreams {
  private readonly open = new Set<() => void>();
  private draining = false;

  /** A stream opened: `endWhenAnswered` is called once if the drain starts before it ends. Returns its "ended". */
  add(endWhenAnswered: () => void): () => void {
    if (this.draining) {
      queueMicrotask(endWhenAnswered); // opened on a connection that had not yet heard GOAWAY
      return () => {};
    }
    this.open.add(endWhenAnswered);
    return () => this.open.delete(endWhenAnswered);
  }

  /** The drain's first step: every open stream reads no more and ends once it has answered. */
  drain(): void {
    this.draining = true;
    const open = [...this.open];
    this.open.clear();
    for (const end of open) end();
  }
}
