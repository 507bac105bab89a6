/**
 * The layout's rule, read from the import lines of src/: a folder per kind of thread, and who may
 * import whom (docs/architecture.md). Type-only imports count: a type from another folder is a
 * dependency on it all the same.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const src = join(root, 'src');

/** Every .ts file under src/, as a path relative to src/. */
function sourceFiles(dir = src): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (e.isDirectory()) return sourceFiles(path);
    return e.name.endsWith('.ts') ? [relative(src, path)] : [];
  });
}

/** The files under src/ that `file` imports (static, dynamic and `new URL(...)` thread entries), relative to src/. */
export function importsOf(file: string, text: string): string[] {
  const specs = [...text.matchAll(/(?:\bfrom\s+|\bimport\s*\(\s*|\bimport\s+|new URL\(\s*)['"](\.{1,2}\/[^'"]+)['"]/g)].map((m) => m[1]!);
  return specs.map((s) => normalize(join(dirname(file), s)).replace(/\.js$/, '.ts')).filter((p) => !p.startsWith('..'));
}

/** The top folder a path belongs to ('' for src/'s own files). */
const folderOf = (p: string) => (p.includes('/') ? p.slice(0, p.indexOf('/')) : '');

/** Who may import what, by the importer's folder: a list of allowed path prefixes (relative to src/). */
const MAY_IMPORT: Record<string, (target: string) => boolean> = {
  shared: (t) => t.startsWith('shared/'),
  core: (t) => t.startsWith('core/') || t.startsWith('shared/'),
  'gpu-worker': (t) => t.startsWith('gpu-worker/') || t.startsWith('shared/'),
  gateway: (t) => t.startsWith('gateway/') || t.startsWith('core/') || t.startsWith('shared/'),
  client: (t) => t.startsWith('client/') || t === 'shared/errors.ts' || t === 'shared/error-status.ts',
};

/** What stands at src/ root: the command line, the package's entry and its version. */
const ROOT_FILES = ['cli.ts', 'index.ts', 'version.ts'];
const FOLDERS = ['client', 'core', 'gateway', 'gpu-worker', 'main', 'shared'];

export function ruleBreaks(files: Record<string, string>): string[] {
  const breaks: string[] = [];
  for (const [file, text] of Object.entries(files)) {
    const folder = folderOf(file);
    if (folder === '' && !ROOT_FILES.includes(file)) breaks.push(`${file}: only ${ROOT_FILES.join(', ')} stand at src/ root`);
    if (folder !== '' && !FOLDERS.includes(folder)) breaks.push(`${file}: src/${folder}/ is not one of ${FOLDERS.join(', ')}`);
    const allowed = MAY_IMPORT[folder];
    if (!allowed) continue; // main/ and the root files wire everything together
    for (const target of importsOf(file, text)) if (!allowed(target)) breaks.push(`${file} imports ${target}`);
  }
  return breaks;
}

describe('the layout', () => {
  const files = Object.fromEntries(sourceFiles().map((f) => [f, readFileSync(join(src, f), 'utf8')]));

  it('reads the import lines it judges', () => {
    expect(importsOf('gateway/thread.ts', files['gateway/thread.ts']!)).toContain('core/infer.ts');
    expect(importsOf('main/threads/gateway-supervisor.ts', files['main/threads/gateway-supervisor.ts']!)).toContain('gateway/thread.ts');
  });

  it('shared/ imports only shared/; core/ and gpu-worker/ only themselves and shared/; gateway/ only itself, core/ and shared/; client/ only shared/ errors', () => {
    expect(ruleBreaks(files)).toEqual([]);
  });

  it('the rule catches a break', () => {
    const breaks = ruleBreaks({
      'shared/x.ts': "import { y } from '../core/y.js';",
      'gateway/x.ts': "import type { Y } from '../main/y.js';",
      'client/x.ts': "import { y } from '../shared/slab.js';",
      'loose.ts': '',
    });
    expect(breaks).toEqual([
      'shared/x.ts imports core/y.ts',
      'gateway/x.ts imports main/y.ts',
      'client/x.ts imports shared/slab.ts',
      'loose.ts: only cli.ts, index.ts, version.ts stand at src/ root',
    ]);
  });
});
