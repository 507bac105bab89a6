#!/usr/bin/env node
/**
 * docs/configuration.md's table of every option, made from the options table
 * (src/shared/options.ts, built into dist/). `npm run docs:options` writes it;
 * test/options.test.ts fails when the file and the table differ.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const DOC = fileURLToPath(new URL('../docs/configuration.md', import.meta.url));
/** The heading the generated table follows; everything after it is generated. */
export const HEADING = '## Every option';

const cell = (text) => String(text).replaceAll('|', '\\|');

/** The table, one row an option in the table's order. */
export function optionsTable(options, envOf, defaultText) {
  const rows = Object.values(options).map((spec) => {
    const choices = spec.choices ? ` (${spec.choices.join(', ')})` : '';
    const range = spec.max !== undefined ? ` (${spec.min ?? 0} to ${spec.max})` : '';
    return `| \`${spec.flag}\` | \`${envOf(spec)}\` | ${cell(defaultText(spec) ?? 'none')} | ${spec.scope} | ${cell(spec.help + choices + range)} |`;
  });
  return ['| flag | variable | default | scope | what it does |', '|---|---|---|---|---|', ...rows].join('\n') + '\n';
}

/** The document as it should read: its own text up to the heading, then the generated table. */
export async function configurationDoc(current = readFileSync(DOC, 'utf8')) {
  const { OPTIONS, envOf, defaultText } = await import('../dist/src/shared/options.js');
  const at = current.indexOf(HEADING);
  if (at < 0) throw new Error(`docs/configuration.md has no "${HEADING}" heading`);
  const intro = current.slice(0, at + HEADING.length);
  const scopes =
    '\n\nScope: `engine`, the server and the in-process engine (`createEngine`) alike; `server`, the server only; `cluster`, the cluster (docs/cluster.md). A `createEngine` or `startServer` option has the same name in camelCase (`--max-batch-size` is `batching.maxBatchSize`, `--model` is `models`).\n\n';
  return intro + scopes + optionsTable(OPTIONS, envOf, defaultText);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  writeFileSync(DOC, await configurationDoc());
  process.stdout.write(`wrote ${DOC}\n`);
}
