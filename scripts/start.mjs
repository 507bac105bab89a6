#!/usr/bin/env node
/**
 * `npm start [-- flags]`: build if the sources changed, generate the missing
 * default models, then `slabserve serve [flags]` in this same process (so
 * signals reach the server as they would `slabserve serve` itself, and one npm
 * process prints its warnings once).
 */
import { fileURLToPath } from 'node:url';
import { build, models } from './prepare.mjs';

build();
models();
const cli = fileURLToPath(new URL('../dist/src/cli.js', import.meta.url));
process.argv = [process.argv[0], cli, 'serve', ...process.argv.slice(2)];
await import(cli);
