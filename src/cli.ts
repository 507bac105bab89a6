#!/usr/bin/env node
/**
 * The slabserve command line. Every option is also an environment variable
 * (SLABSERVE_<NAME>), shown by --help.
 *
 *   slabserve embed "where is my parcel?" "cancel my plan"
 *   slabserve classify --model tiny-intent "I want my money back"
 *
 * `slabserve serve` arrives with the HTTP gateway.
 */
import { Command, Option } from 'commander';
import { createEngine, type Engine, type EngineOptions } from './engine.js';
import { SlabserveError } from './shared/errors.js';

interface CommonFlags {
  modelsDir?: string;
  model?: string;
  device: string;
  truncate: boolean;
}

function commonOptions(cmd: Command): Command {
  return cmd
    .addOption(new Option('--models-dir <dir>', 'model repository folder (default: the package models/)').env('SLABSERVE_MODELS_DIR'))
    .addOption(new Option('--model <name>', 'model to use (default: the first of the right task)').env('SLABSERVE_MODEL'))
    .addOption(new Option('--device <device>', 'auto, cpu, cuda or cuda:N').default('auto').env('SLABSERVE_DEVICE'))
    .addOption(new Option('--truncate', 'cut inputs longer than the model accepts').default(false).env('SLABSERVE_TRUNCATE'));
}

async function withEngine(flags: CommonFlags, fn: (e: Engine) => Promise<unknown>): Promise<void> {
  const opts: EngineOptions = { device: flags.device, log: () => {} };
  if (flags.modelsDir) opts.modelsDir = flags.modelsDir;
  if (flags.model) opts.models = [flags.model];
  const engine = await createEngine(opts);
  try {
    const out = await fn(engine);
    process.stdout.write(JSON.stringify(out) + '\n');
  } finally {
    await engine.close();
  }
}

const program = new Command('slabserve').description('Dynamic-batching inference for BERT-class models').showHelpAfterError();

commonOptions(program.command('embed').description('print the embedding of each text as JSON').argument('<text...>')).action(
  (texts: string[], flags: CommonFlags) =>
    withEngine(flags, async (e) => (await e.embed(texts, { truncate: flags.truncate, ...(flags.model ? { model: flags.model } : {}) })).map((v) => Array.from(v))),
);

commonOptions(program.command('classify').description('print the top label and score of each text as JSON').argument('<text...>')).action(
  (texts: string[], flags: CommonFlags) =>
    withEngine(flags, async (e) =>
      (await e.classify(texts, { truncate: flags.truncate, ...(flags.model ? { model: flags.model } : {}) })).map((c) => ({ label: c.label, score: c.score })),
    ),
);

program.parseAsync().catch((err: unknown) => {
  const e = err as Error;
  process.stderr.write(`slabserve: ${e instanceof SlabserveError ? `${e.code}: ` : ''}${e.message}\n`);
  process.exitCode = 1;
});
