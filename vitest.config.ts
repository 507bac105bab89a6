import { defineConfig } from 'vitest/config';

// Tests drive real threads and real onnxruntime sessions on a 2-core machine:
// generous timeouts (nothing asserts on time), and at most two files at once
// so engines starting in parallel do not starve each other.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    maxWorkers: 2,
  },
});
