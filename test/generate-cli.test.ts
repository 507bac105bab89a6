/**
 * The model generator's command line (models/generate.ts): a folder of any
 * name, with the pooling and max length a user asks for, served as asked.
 * The served rows are checked against the unmodified graph run alone and
 * pooled by this test's own code ([CLS]: the first token's state).
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { loadTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { startServer } from '../dist/src/main/server.js';
import { makeRandom, maxAbsDiff, PlainReference, randomTexts, testServerConfig, vocabularyWords } from './helpers.js';

const GENERATE = fileURLToPath(new URL('../dist/models/generate.js', import.meta.url));
const out = mkdtempSync(join(tmpdir(), 'slabserve-generate-'));
afterAll(() => rmSync(out, { recursive: true, force: true }));

const generate = (...args: string[]) => spawnSync(process.execPath, [GENERATE, '--out', out, ...args], { encoding: 'utf8', timeout: 60_000 });

describe('generate --name, --pooling, --max-length', () => {
  it('writes the folder under its name with serve.json saying the pooling and max length, and the server serves it so', async () => {
    const r = generate('tiny-embed', '--name', 'support-cls', '--pooling', 'cls', '--max-length', '64');
    expect(r.status, r.stderr).toBe(0);
    const dir = join(out, 'support-cls');
    expect(JSON.parse(readFileSync(join(dir, 'serve.json'), 'utf8'))).toMatchObject({ task: 'embed', pooling: 'cls', maxLength: 64 });

    const server = await startServer(testServerConfig({ models: [dir] }));
    const ref = await PlainReference.open(dir);
    try {
      await server.ready;
      const info = await (await fetch(server.url + '/info')).json();
      expect(info.models.map((m: { name: string }) => m.name)).toEqual(['support-cls']);
      const rand = makeRandom('generate --pooling cls');
      const texts = randomTexts(rand, vocabularyWords(ref.spec), 6, 20);
      const rows = (await (await fetch(server.url + '/embed', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: texts, model: 'support-cls' }) })).json()) as number[][];
      const tok = await loadTokenizer(ref.spec.tokenizerPath);
      for (const [i, text] of texts.entries()) {
        const ids = tok.encode(text, { maxLength: 64, truncate: false }).ids;
        const states = await ref.raw(ids);
        const cls = Array.from(states.subarray(0, states.length / ids.length));
        const norm = Math.hypot(...cls);
        expect(maxAbsDiff(rows[i]!, cls.map((v) => v / norm))).toBeLessThan(1e-5);
      }
      // 64 tokens is the longest input now: one past it is refused.
      const long = await fetch(server.url + '/embed', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: 'parcel '.repeat(70) }) });
      expect(long.status).toBe(413);
      expect(((await long.json()) as { error: string }).error).toContain('at most 64');
    } finally {
      await ref.close();
      await server.close();
    }
  });

  it('refuses, exit 2 and nothing written, what cannot apply', () => {
    const cases: [string[], RegExp][] = [
      [['tiny-intent', '--pooling', 'cls'], /tiny-intent is a classify model: pooling is an embedding model's/],
      [['tiny-embed', '--pooling', 'average'], /pooling "average" is not one of cls, mean/],
      [['tiny-embed', '--max-length', '513'], /max length 513 is not a whole number from 1 to 512/],
      [['tiny-xlmr', '--max-length', '513'], /from 1 to 512 \(tiny-xlmr's positions\)/],
      [['tiny-embed', '--max-length', 'long'], /--max-length "long" is not a whole number/],
      [['tiny-embed', 'tiny-intent', '--name', 'both'], /--name names one folder/],
      [['tiny-embed', '--name', '..'], /cannot be a model's name/],
    ];
    for (const [args, message] of cases) {
      const r = generate(...args);
      expect(r.status, args.join(' ')).toBe(2);
      expect(r.stderr).toMatch(message);
    }
    expect(spawnSync('ls', [out], { encoding: 'utf8' }).stdout.trim().split('\n')).toEqual(['support-cls']);
  });
});
