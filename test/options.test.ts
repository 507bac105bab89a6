/**
 * The options table (src/shared/options.ts) is the one place an option lives: `serve --help`
 * lists each with its variable and default, docs/configuration.md is made from it, and the
 * server and the engine take their defaults from it.
 */
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { DEFAULTS, defaultText, envOf, OPTIONS, type OptionSpec } from '../dist/src/shared/options.js';
import { resolveServerConfig } from '../dist/src/main/server.js';
import { ENGINE_DEFAULTS } from '../dist/src/main/engine.js';
// @ts-expect-error: a plain ES module of the repository's scripts
import { configurationDoc, optionsTable } from '../scripts/options-doc.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const specs = Object.entries(OPTIONS) as [string, OptionSpec<unknown>][];

describe('the options table', () => {
  it('docs/configuration.md is the table as npm run docs:options writes it', async () => {
    const doc = readFileSync(join(root, 'docs', 'configuration.md'), 'utf8');
    expect(doc, 'docs/configuration.md differs from the options table: run `npm run docs:options`').toBe(await configurationDoc(doc));
  });

  it('the document would change with the table: a row per option, each with its variable and default', () => {
    const table = optionsTable(OPTIONS, envOf, defaultText) as string;
    expect(table.split('\n').filter((l) => l.startsWith('| `--')).length).toBe(specs.length);
    const changed = { ...OPTIONS, port: { ...OPTIONS.port, default: 9999 } };
    expect(optionsTable(changed, envOf, defaultText)).not.toBe(table);
    expect(table).toContain('| `--port <port>` | `SLABSERVE_PORT` | 8080 | server |');
  });

  it('`serve --help` lists every option with its variable, and the default of each it applies', async () => {
    const { stdout } = await promisify(execFile)(process.execPath, [join(root, 'dist', 'src', 'cli.js'), 'serve', '--help']);
    // An entry begins on a line of its own with its flag; its text runs on to the next such line.
    const entries = new Map(
      stdout
        .split(/\n(?= {2}-)/)
        .map((e) => e.replace(/\s+/g, ' ').trim())
        .map((e) => [e.split(' ')[0]!, e] as const),
    );
    const missing = specs.flatMap(([name, spec]) => {
      const flag = spec.flag.split(' ')[0]!;
      const entry = entries.get(flag);
      if (entry === undefined) return [`${name}: ${flag} not listed`];
      const problems = [];
      if (!entry.includes(envOf(spec))) problems.push(`${name}: ${envOf(spec)} not said`);
      if (spec.default !== undefined && spec.kind !== 'priorities' && !entry.includes(`default: ${String(spec.default)}`)) problems.push(`${name}: default ${String(spec.default)} not said`);
      return problems;
    });
    expect(missing).toEqual([]);
  });

  it('a server and an engine given nothing take the table defaults (the engine: no result cache)', () => {
    const server = resolveServerConfig({ log: () => {} }) as unknown as Record<string, unknown>;
    const engine = ENGINE_DEFAULTS as unknown as Record<string, unknown>;
    for (const [name, spec] of specs) {
      if (spec.default === undefined || spec.perModel) continue;
      if (spec.scope !== 'cluster') expect(server[name], name).toEqual(spec.default);
      if (spec.scope === 'engine') expect(engine[name], name).toEqual(name === 'cacheMb' ? 0 : spec.default);
    }
    // Given, a value wins; given as undefined, the default still applies.
    expect(resolveServerConfig({ log: () => {}, port: 0, maxBodyBytes: undefined }).port).toBe(0);
    expect(resolveServerConfig({ log: () => {}, maxBodyBytes: undefined }).maxBodyBytes).toBe(DEFAULTS.maxBodyBytes);
  });
});
