/**
 * bench:quick's checks before timing: a server must compute what the bench
 * computes (the same tokens, the engine's vectors), and /ws rows must be the
 * vectors POST /embed answers.
 */
import type { Engine } from '../../src/main/engine.js';
import { createLoadClient } from '../http-clients.js';
import type { ServerProcess } from '../server-process.js';
import { embedOnce } from '../ws-load.js';
import type { QuickOptions } from './options.js';
import type { Seq } from './workload.js';

/** Before timing over /ws: the f32 rows must be the vectors POST /embed answers (same server). */
export async function checkWs(o: QuickOptions, server: ServerProcess, seqs: Seq[], n = 4): Promise<{ line: string; rowBytes: number }> {
  const client = createLoadClient(server.origin, 1);
  try {
    let maxDiff = 0;
    let dim = 0;
    for (const s of seqs.slice(0, n)) {
      const r = await client.post('/embed', Buffer.from(JSON.stringify({ inputs: s.text })));
      if (r.status !== 200) throw new Error(`ws check: POST /embed answered ${r.status}`);
      const want = (JSON.parse(r.body.toString('utf8')) as number[][])[0]!;
      const got = await embedOnce(server.origin, s.text!);
      if (got.length !== want.length) throw new Error(`ws check: /ws answered ${got.length} dimensions, POST /embed ${want.length}`);
      dim = got.length;
      want.forEach((v, i) => (maxDiff = Math.max(maxDiff, Math.abs(v - got[i]!))));
    }
    if (maxDiff > 1e-5) throw new Error(`ws check: /ws f32 rows differ from POST /embed by up to ${maxDiff}`);
    return { line: `${n} texts over /ws (f32, ${dim} dims) = POST /embed (max diff ${maxDiff.toExponential(1)})`, rowBytes: 4 * dim };
  } finally {
    await client.close();
  }
}

/**
 * Before timing: the server must compute what raw computes. Sends `n` texts one by one and
 * checks the server counted exactly the tokens of the bench's own tokenization, and (with an
 * engine at hand) that the vectors match engine.embed of the same texts.
 */
export async function checkServer(o: QuickOptions, name: string, server: ServerProcess, seqs: Seq[], engine: Engine | undefined, n = 16): Promise<string> {
  const client = createLoadClient(server.origin, 1);
  try {
    const before = await server.counters(o.model);
    let maxDiff = 0;
    for (const s of seqs.slice(0, n)) {
      const r = await client.post('/embed', Buffer.from(JSON.stringify({ inputs: s.text })));
      if (r.status !== 200) throw new Error(`${name}: POST /embed answered ${r.status}: ${r.body.toString('utf8').slice(0, 300)}`);
      const got = JSON.parse(r.body.toString('utf8')) as number[][];
      if (engine) {
        const want = (await engine.embed(s.text!, { model: o.model }))[0]!;
        if (got[0]!.length !== want.length) throw new Error(`${name}: ${got[0]!.length} dimensions, engine ${want.length}`);
        want.forEach((v, i) => (maxDiff = Math.max(maxDiff, Math.abs(v - got[0]![i]!))));
      }
    }
    const after = await server.counters(o.model);
    const want = seqs.slice(0, n).reduce((a, s) => a + s.ids.length, 0);
    const real = after.realTokens - before.realTokens;
    if (real !== want) throw new Error(`${name}: the server computed ${real} real tokens for ${n} texts, the bench's tokenization has ${want}`);
    if (maxDiff > 1e-4) throw new Error(`${name}: vectors differ from engine.embed by up to ${maxDiff}`);
    return `${n} texts, ${real} tokens as tokenized here${engine ? `, vectors = engine.embed (max diff ${maxDiff.toExponential(1)})` : ''}`;
  } finally {
    await client.close();
  }
}
