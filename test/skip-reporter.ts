/**
 * A vitest reporter that keeps `npm test` honest about skips: a full run (no
 * name filter) fails if any test was skipped for another reason than the
 * hardware it needs (test/fixtures/skips.ts), and the summary names those that
 * were, with their reason.
 */
import type { Reporter, TestModule, Vitest } from 'vitest/node';
import { HARDWARE } from './fixtures/skips.js';

export default class SkipReporter implements Reporter {
  private filtered = false;

  onInit(vitest: Vitest): void {
    this.filtered = Boolean(vitest.config.testNamePattern);
  }

  onTestRunEnd(modules: ReadonlyArray<TestModule>): void {
    const skipped = modules.flatMap((m) => [...m.children.allTests()]).flatMap((t) => {
      const r = t.result();
      return r.state === 'skipped' ? [{ name: `${t.module.moduleId.replace(/^.*\/test\//, 'test/')} > ${t.fullName}`, note: r.note ?? '' }] : [];
    });
    const hardware = skipped.filter((s) => s.note.startsWith(HARDWARE));
    for (const s of hardware) process.stdout.write(`skipped, ${s.note} ${s.name}\n`);
    const other = skipped.filter((s) => !s.note.startsWith(HARDWARE));
    if (this.filtered || other.length === 0) return;
    process.stdout.write(`\n${other.length} test(s) skipped for no hardware reason (a full run skips none; test/fixtures/skips.ts):\n`);
    for (const s of other) process.stdout.write(`  ${s.name}${s.note ? ` (${s.note})` : ''}\n`);
    process.exitCode = 1;
  }
}
