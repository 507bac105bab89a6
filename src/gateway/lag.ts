/**
 * A gateway's event-loop delay, measured only while it has work. Node's
 * monitorEventLoopDelay samples on a timer (every 10 ms here); left on, an
 * idle gateway would wake 100 times a second for a number that is zero when
 * nothing runs. It is switched on by the first request after a quiet spell
 * and off again once a second has passed without one.
 */
import { monitorEventLoopDelay, type IntervalHistogram } from 'node:perf_hooks';

const RESOLUTION_MS = 10;
const QUIET_MS = 1000;

export class BusyLag {
  private readonly h: IntervalHistogram = monitorEventLoopDelay({ resolution: RESOLUTION_MS });
  private lastActive = 0;
  private check: NodeJS.Timeout | undefined;

  /** A request (or frame) arrived: measure from now until a quiet second. */
  touch(): void {
    this.lastActive = performance.now();
    if (this.check) return;
    this.h.enable();
    this.check = setInterval(() => {
      if (performance.now() - this.lastActive < QUIET_MS) return;
      this.h.disable();
      clearInterval(this.check);
      this.check = undefined;
    }, QUIET_MS);
    this.check.unref();
  }

  /** P99 delay since the last reset, seconds (0 when the gateway was idle). */
  p99Seconds(): number {
    return this.h.count > 0 ? this.h.percentile(99) / 1e9 : 0;
  }

  reset(): void {
    this.h.reset();
  }

  stop(): void {
    if (this.check) clearInterval(this.check);
    this.check = undefined;
    this.h.disable();
  }
}
