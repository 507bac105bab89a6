/**
 * --intra-op-threads 0 (the default): one thread for a model too narrow to
 * split (tiny-embed, hidden 128), every core for a wider one (minilm-l6, 384);
 * and what the server says it chose, in its start-up line for each model, is
 * what onnxruntime got: its pool's threads counted in this process.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { describe, expect, it } from 'vitest';
import { autoIntraOpThreads, SPLIT_HIDDEN_SIZE } from '../dist/src/gpu-worker/intra-op-threads.js';
import { startServer } from '../dist/src/main/server.js';
import { testServerConfig } from './helpers.js';

describe('intra-op threads chosen for a model', () => {
  it('one below the split size, every core from it', () => {
    expect(autoIntraOpThreads(128)).toBe(1);
    expect(autoIntraOpThreads(SPLIT_HIDDEN_SIZE - 1)).toBe(1);
    expect(autoIntraOpThreads(SPLIT_HIDDEN_SIZE)).toBe(availableParallelism());
    expect(autoIntraOpThreads(384)).toBe(availableParallelism());
  });

  it('onnxruntime gets what the start-up line says: auto, or the flag (its pool threads counted in this process)', async () => {
    // onnxruntime names its intra-op pool's threads "onnxruntime": threads - 1 per session (the caller runs too).
    const poolThreads = () => readdirSync('/proc/self/task').filter((t) => readFileSync(`/proc/self/task/${t}/comm`, 'utf8').trim() === 'onnxruntime').length;
    expect(poolThreads()).toBe(0);
    for (const [intraOpThreads, expected, threads] of [[0, 'intraOpThreads=1 (auto)', 1], [3, 'intraOpThreads=3', 3]] as const) {
      const logs: string[] = [];
      const server = await startServer(testServerConfig({ models: ['tiny-embed'], intraOpThreads, log: (line) => logs.push(line) }));
      try {
        await server.ready;
        const line = logs.find((l) => l.startsWith('slabserve: model tiny-embed '));
        expect(line, logs.join('\n')).toContain(` ${expected} `);
        const sessions = Number(/ instances=(\d+)/.exec(line!)?.[1]);
        expect(poolThreads(), line).toBe((threads - 1) * sessions);
      } finally {
        await server.close();
      }
    }
  });
});
