/**
 * The scheduling bench's pure parts (bench/scheduling/): its settings from
 * the command line (the option table, --configs, the checks across options)
 * and the arrival schedules. No engine runs here. A bad value ends the run,
 * so those cases run in a child process.
 */
import { spawnSync } from 'node:child_process';
import { dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { describe, expect, it } from 'vitest';
import { cellsOf, schedule } from '../dist/bench/scheduling/arrivals.js';
import { parseConfigs } from '../dist/bench/scheduling/configs.js';
import { schedulingSettings } from '../dist/bench/scheduling/options.js';
import { mulberry32 } from '../dist/models/generator/rng.js';

const optionsJs = pathToFileURL(resolve(dirname(fileURLToPath(import.meta.url)), '..', 'dist', 'bench', 'scheduling', 'options.js')).href;

function runSettings(argv: string[]) {
  const script = `import { schedulingSettings } from ${JSON.stringify(optionsJs)};
    console.log(JSON.stringify(schedulingSettings(${JSON.stringify(argv)})));`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe('bench/scheduling settings', () => {
  it('has the documented defaults, in ms, and the quick ones under --quick', () => {
    const s = schedulingSettings([]);
    expect(s).toMatchObject({ model: 'tiny-embed', device: 'cpu', intraOpThreads: 0, loads: [30, 60, 90, 120], burstLoads: [30, 60], deadlineMs: 1000 });
    expect(s).toMatchObject({ warmupMs: 1000, durationMs: 3000, rounds: 2, capacityGiven: null, capacityMs: 3000, capacityConcurrency: 128, requests: 8192, seed: 1234, quick: false });
    expect(s.burst).toEqual({ factor: 5, duty: 0.2, periodMs: 1000 });
    expect(s.configs.map((c) => c.name)).toEqual(['fixed 5ms if=1', 'fixed 0ms if=2', 'fixed 5ms if=2', 'fixed 20ms if=2', 'slo 25ms if=1', 'slo 50ms if=1']);
    expect(s.cells.map((c) => c.name)).toEqual(['poisson 30%', 'poisson 60%', 'poisson 90%', 'poisson 120%', 'burst 30%', 'burst 60%']);
    expect(s.modelsDir.endsWith('/models')).toBe(true);
    expect(schedulingSettings(['--quick'])).toMatchObject({ loads: [60, 120], burstLoads: [60], warmupMs: 500, durationMs: 2000, rounds: 1, capacityMs: 2000, quick: true });
  });

  it('takes "" for no burst cells, and --capacity instead of the probe', () => {
    const s = schedulingSettings(['--burst-loads', '', '--loads', '60', '--capacity', '500']);
    expect(s.cells).toEqual([{ name: 'poisson 60%', pattern: 'poisson', loadPct: 60 }]);
    expect(s.capacityGiven).toBe(500);
  });

  it('parses --configs: window, batches in flight, token budget; a latency target keeps the 5 ms window', () => {
    expect(parseConfigs(['fixed:20:2', ' slo:50 ', '', 'fixed:5:1:4096', 'slo:12.5:2:2048'])).toEqual([
      { name: 'fixed 20ms if=2', kind: 'fixed', maxBatchDelayMs: 20, maxInflightBatches: 2 },
      { name: 'slo 50ms if=1', kind: 'slo', maxBatchDelayMs: 5, maxInflightBatches: 1, sloP99Ms: 50 },
      { name: 'fixed 5ms if=1 tok=4096', kind: 'fixed', maxBatchDelayMs: 5, maxInflightBatches: 1, maxBatchTokens: 4096 },
      { name: 'slo 12.5ms if=2 tok=2048', kind: 'slo', maxBatchDelayMs: 5, maxInflightBatches: 2, sloP99Ms: 12.5, maxBatchTokens: 2048 },
    ]);
  });

  it.each([
    [['--configs', 'fixed:5:0'], /--configs: inflight must be >= 1 in "fixed:5:0"/],
    [['--configs', 'slo:0'], /--configs: a latency target must be > 0 in "slo:0"/],
    [['--configs', 'window:5'], /--configs: expected fixed:DELAY_MS.* got "window:5"/],
    [['--configs', 'fixed:5,fixed:5'], /--configs: a configuration is listed twice/],
    [['--configs', ','], /--configs: nothing to run/],
    [['--burst-factor', '6'], /--burst-factor x --burst-duty must be at most 1.*got 6 x 0.2/],
    [['--loads', '', '--burst-loads', ''], /nothing to run: --loads and --burst-loads are both empty/],
    [['--requests', '10'], /--requests: expected an integer >= 64, got "10"/],
  ])('exits 2 with one line for %j', (argv, message) => {
    const r = runSettings(argv);
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(message);
    expect(r.stdout).toBe('');
  });
});

describe('bench/scheduling arrivals', () => {
  const burst = { factor: 5, duty: 0.2, periodMs: 1000 };
  const [poisson, bursts] = cellsOf([50], [50]);

  it('draws the same schedule from the same seed', () => {
    const a = schedule(poisson!, burst, 1000, 4000, mulberry32(7), 8192);
    const b = schedule(poisson!, burst, 1000, 4000, mulberry32(7), 8192);
    expect(Array.from(a.times)).toEqual(Array.from(b.times));
    expect(Array.from(a.seq)).toEqual(Array.from(b.seq));
  });

  it('keeps the mean rate; 5x for 20% of each period is silence in between', () => {
    const p = schedule(poisson!, burst, 1000, 20_000, mulberry32(1), 8192);
    const q = schedule(bursts!, burst, 1000, 20_000, mulberry32(1), 8192);
    for (const s of [p, q]) expect(s.times.length / 20).toBeGreaterThan(450); // 500 per s expected
    for (const s of [p, q]) expect(s.times.length / 20).toBeLessThan(550);
    expect(Array.from(q.times).every((t) => t % 1000 < 200)).toBe(true);
    expect(Array.from(p.times).every((t, i) => i === 0 || t >= p.times[i - 1]!)).toBe(true);
  });
});
