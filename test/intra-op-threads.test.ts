/**
 * --intra-op-threads 0 (the default): one thread for a model too narrow to
 * split (tiny-embed, hidden 128), every core for a wider one (minilm-l6, 384);
 * and what the server says it chose, in its start-up line for each model.
 */
import { availableParallelism } from 'node:os';
import { describe, expect, it } from 'vitest';
import { autoIntraOpThreads, SPLIT_HIDDEN_SIZE } from '../dist/src/gpu-worker/intra-op-threads.js';
import { startServer } from '../dist/src/server.js';
import { testServerConfig } from './helpers.js';

describe('intra-op threads chosen for a model', () => {
  it('one below the split size, every core from it', () => {
    expect(autoIntraOpThreads(128)).toBe(1);
    expect(autoIntraOpThreads(SPLIT_HIDDEN_SIZE - 1)).toBe(1);
    expect(autoIntraOpThreads(SPLIT_HIDDEN_SIZE)).toBe(availableParallelism());
    expect(autoIntraOpThreads(384)).toBe(availableParallelism());
  });

  it('the start-up line of each model says what it got: auto, or the flag', async () => {
    for (const [intraOpThreads, expected] of [[0, 'intraOpThreads=1 (auto)'], [3, 'intraOpThreads=3']] as const) {
      const logs: string[] = [];
      const server = await startServer(testServerConfig({ models: ['tiny-embed'], intraOpThreads, log: (line) => logs.push(line) }));
      try {
        await server.ready;
        const line = logs.find((l) => l.startsWith('slabserve: model tiny-embed '));
        expect(line, logs.join('\n')).toContain(` ${expected} `);
      } finally {
        await server.close();
      }
    }
  });
});
