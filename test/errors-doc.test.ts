/**
 * docs/errors.md lists every error code the code base can raise, and no code
 * it cannot: read from the sources (every 'SLABSERVE_...' string literal that
 * is not an environment variable's name) and from the doc's tables.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('..', import.meta.url));

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? sources(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : []));
}

/** Codes in string literals, leaving out environment variables (lines that read or declare one). */
function codesInSources(): Set<string> {
  const codes = new Set<string>();
  for (const file of sources(join(root, 'src'))) {
    for (const line of readFileSync(file, 'utf8').split('\n')) {
      if (/\.env\(|_ENV\s*=|process\.env/.test(line)) continue;
      for (const m of line.matchAll(/'(SLABSERVE_[A-Z0-9_]+)'/g)) codes.add(m[1]!);
    }
  }
  return codes;
}

function codesInDoc(): Set<string> {
  const doc = readFileSync(join(root, 'docs', 'errors.md'), 'utf8');
  return new Set([...doc.matchAll(/^\| `(SLABSERVE_[A-Z0-9_]+)`/gm)].map((m) => m[1]!));
}

describe('docs/errors.md', () => {
  it('lists every code the sources raise, and only those', () => {
    const inSources = codesInSources();
    const inDoc = codesInDoc();
    expect(inSources.size).toBeGreaterThan(30); // the scan found the codes at all
    expect([...inSources].filter((c) => !inDoc.has(c)).sort(), 'raised but not in docs/errors.md').toEqual([]);
    expect([...inDoc].filter((c) => !inSources.has(c)).sort(), 'in docs/errors.md but raised nowhere').toEqual([]);
  });
});
