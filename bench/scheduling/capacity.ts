/**
 * The capacity probe: what 100% load means. A short closed loop
 * (--capacity-concurrency callers, each sending its next request when
 * answered) on the first configuration's engine measures the requests/s it
 * answers when never idle; every offered load is a percentage of that.
 * --capacity RPS skips the probe.
 */
import { performance } from 'node:perf_hooks';
import { fmt } from '../table.js';
import { sleep, toUs } from './clock.js';
import { engineDelta, histogram } from './results.js';
import type { Bench } from './setup.js';

export interface Capacity {
  /** Requests/s taken as 100%. */
  perS: number;
  /** Of the probe (NaN when given). */
  meanBatch: number;
  p50Ms: number;
  errors: number;
  /** From --capacity, not measured. */
  given: boolean;
}

async function probeCapacity(b: Bench): Promise<Omit<Capacity, 'given'>> {
  const { model, capacityConcurrency, warmupMs, capacityMs } = b.settings;
  const { seqs } = b.workload;
  const engine = b.ref;
  let cursor = 0;
  let stop = false;
  let counting = false;
  let done = 0;
  let errors = 0;
  const h = histogram();
  const caller = async () => {
    while (!stop) {
      const s = seqs[cursor++ % seqs.length]!;
      const t = performance.now();
      try {
        await engine.runTokens(model, [s], { timeoutMs: 30_000 });
      } catch {
        errors++;
        await sleep(1);
        continue;
      }
      if (counting) {
        done++;
        h.recordValue(toUs(performance.now() - t));
      }
    }
  };
  const callers = Array.from({ length: capacityConcurrency }, caller);
  await sleep(Math.max(500, warmupMs));
  const s0 = engine.stats()[model]!;
  counting = true;
  const t0 = performance.now();
  await sleep(capacityMs);
  counting = false;
  const windowMs = performance.now() - t0;
  const s1 = engine.stats()[model]!;
  stop = true;
  await Promise.all(callers);
  const d = engineDelta(s0, s1);
  const out = { perS: (done / windowMs) * 1000, meanBatch: d.rows / d.batches, p50Ms: h.getValueAtPercentile(50) / 1000, errors };
  h.destroy();
  return out;
}

/** The capacity given with --capacity, or probed; prints it. */
export async function measureCapacity(b: Bench): Promise<Capacity> {
  const s = b.settings;
  if (s.capacityGiven !== null) {
    console.log(`capacity: ${s.capacityGiven} requests/s (given with --capacity)`);
    return { perS: s.capacityGiven, meanBatch: NaN, p50Ms: NaN, errors: 0, given: true };
  }
  const capacity = { ...(await probeCapacity(b)), given: false };
  console.log(
    `capacity: ${fmt(capacity.perS, 0)} requests/s (closed loop, ${s.capacityConcurrency} callers, ${s.capacityMs / 1000}s on "${s.configs[0]!.name}": mean batch ${fmt(capacity.meanBatch, 1)}, P50 ${fmt(capacity.p50Ms, 1)} ms` +
      `${capacity.errors ? `, ${capacity.errors} errors` : ''})`,
  );
  return capacity;
}
