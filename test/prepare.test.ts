/**
 * scripts/prepare.mjs, what `npm start` and `npm test` run first: tsc only
 * when a source changed since the last build (a restart ran 13 s of tsc each
 * time). tsc itself is replaced by a counter here; the list of sources is the
 * real one.
 */
import { mkdtempSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
// @ts-expect-error: a plain .mjs script, no types
import { build, sourceList } from '../scripts/prepare.mjs';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'slabserve-prepare-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('prepare: build only when the sources changed', () => {
  it('runs tsc the first time, not again while nothing changed, again when a source is touched, added or removed, and with force', () => {
    const stamp = join(dir, 'sources');
    let runs = 0;
    const lines: string[] = [];
    const step = (force = false) => build({ stamp, force, tsc: () => runs++, log: (l: string) => lines.push(l) });
    expect(step()).toBe(true);
    expect(step()).toBe(false);
    expect(runs).toBe(1);
    expect(lines.at(-1)).toMatch(/up to date/);

    const file = join(ROOT, 'src', 'version.ts');
    const { atime, mtime } = statSync(file);
    try {
      utimesSync(file, atime, new Date(mtime.getTime() + 5000));
      expect(step()).toBe(true);
      expect(lines.at(-1)).toMatch(/sources changed/);
    } finally {
      utimesSync(file, atime, mtime);
    }
    expect(step()).toBe(true); // the old time again is a change too: the list is compared, not the newest time
    expect(step()).toBe(false);

    const added = join(ROOT, 'bench', `prepare-probe-${process.pid}.ts`);
    try {
      writeFileSync(added, 'export {};\n');
      expect(sourceList()).toContain(`bench/prepare-probe-${process.pid}.ts`);
      expect(step()).toBe(true);
    } finally {
      rmSync(added, { force: true });
    }
    expect(step()).toBe(true); // removed
    expect(step(true)).toBe(true); // npm run build: always
    expect(runs).toBe(6);
  });
});
