/**
 * The suite's scheduling case, its pure parts: its options (the suite's
 * option table: --scheduling-configs, the loads, the capacity), the
 * configurations, and the arrival schedules it draws (bench/arrivals.ts). No
 * engine runs here. A bad value ends the run, so those cases run in a child
 * process.
 */
import { spawnSync } from 'node:child_process';
import { dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { describe, expect, it } from 'vitest';
import { arrivalTimes } from '../dist/bench/arrivals.js';
import { parseConfigs } from '../dist/bench/suite/scheduling/configs.js';
import { parseSuiteOptions } from '../dist/bench/suite/options.js';
import { mulberry32 } from '../dist/models/generator/rng.js';

const optionsJs = pathToFileURL(resolve(dirname(fileURLToPath(import.meta.url)), '..', 'dist', 'bench', 'suite', 'options.js')).href;

function runSettings(argv: string[]) {
  const script = `import { parseSuiteOptions } from ${JSON.stringify(optionsJs)};
    console.log(JSON.stringify(parseSuiteOptions(${JSON.stringify(argv)}).scheduling));`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe('the scheduling case: settings', () => {
  it('has the documented defaults, and the quick ones under --quick', () => {
    const s = parseSuiteOptions([]).scheduling;
    expect(s.capacity).toBe(null);
    expect(s.configs.map((c) => c.name)).toEqual(['fixed 5ms if=1', 'fixed 0ms if=2', 'fixed 5ms if=2', 'fixed 20ms if=2', 'slo 25ms if=1', 'slo 50ms if=1']);
    expect(s.cells.map((c) => c.name)).toEqual(['poisson 30%', 'poisson 60%', 'poisson 90%', 'poisson 120%', 'burst 30%', 'burst 60%']);
    expect(parseSuiteOptions(['--quick']).scheduling.cells.map((c) => c.name)).toEqual(['poisson 60%', 'poisson 120%', 'burst 60%']);
  });

  it('takes "" for no burst cells, and --scheduling-capacity instead of the probe', () => {
    const s = parseSuiteOptions(['--scheduling-burst-loads', '', '--scheduling-loads', '60', '--scheduling-capacity', '500']).scheduling;
    expect(s.cells).toEqual([{ name: 'poisson 60%', pattern: 'poisson', loadPct: 60 }]);
    expect(s.capacity).toBe(500);
  });

  it('parses the configurations: window, batches in flight, token budget; a latency target keeps the 5 ms window', () => {
    expect(parseConfigs(['fixed:20:2', ' slo:50 ', '', 'fixed:5:1:4096', 'slo:12.5:2:2048'])).toEqual([
      { name: 'fixed 20ms if=2', kind: 'fixed', maxBatchDelayMs: 20, maxInflightBatches: 2 },
      { name: 'slo 50ms if=1', kind: 'slo', maxBatchDelayMs: 5, maxInflightBatches: 1, sloP99Ms: 50 },
      { name: 'fixed 5ms if=1 tok=4096', kind: 'fixed', maxBatchDelayMs: 5, maxInflightBatches: 1, maxBatchTokens: 4096 },
      { name: 'slo 12.5ms if=2 tok=2048', kind: 'slo', maxBatchDelayMs: 5, maxInflightBatches: 2, sloP99Ms: 12.5, maxBatchTokens: 2048 },
    ]);
  });

  it.each([
    [['--scheduling-configs', 'fixed:5:0'], /--scheduling-configs: inflight must be >= 1 in "fixed:5:0"/],
    [['--scheduling-configs', 'slo:0'], /--scheduling-configs: a latency target must be > 0 in "slo:0"/],
    [['--scheduling-configs', 'window:5'], /--scheduling-configs: expected fixed:DELAY_MS.* got "window:5"/],
    [['--scheduling-configs', 'fixed:5,fixed:5'], /--scheduling-configs: a configuration is listed twice/],
    [['--scheduling-configs', ','], /--scheduling-configs: nothing to run/],
    [['--scheduling-loads', '', '--scheduling-burst-loads', ''], /nothing to run in scheduling: --scheduling-loads and --scheduling-burst-loads are both empty/],
  ])('exits 2 with one line for %j', (argv, message) => {
    const r = runSettings(argv);
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(message);
    expect(r.stdout).toBe('');
  });
});

describe('the scheduling case: arrivals', () => {
  const burst = { factor: 5, duty: 0.2, periodMs: 1000 };

  it('draws the same schedule from the same seed', () => {
    expect(arrivalTimes(500, 4000, mulberry32(7), burst)).toEqual(arrivalTimes(500, 4000, mulberry32(7), burst));
  });

  it('keeps the mean rate; 5x for 20% of each period is silence in between', () => {
    const p = arrivalTimes(500, 20_000, mulberry32(1));
    const q = arrivalTimes(500, 20_000, mulberry32(1), burst);
    for (const s of [p, q]) expect(s.length / 20).toBeGreaterThan(450); // 500 per s expected
    for (const s of [p, q]) expect(s.length / 20).toBeLessThan(550);
    expect(q.every((t) => t % 1000 < 200)).toBe(true);
    expect(p.every((t, i) => i === 0 || t >= p[i - 1]!)).toBe(true);
  });
});
