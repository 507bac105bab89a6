import { defineConfig } from 'vitest/config';

// Tests drive real threads and real onnxruntime sessions on a 2-core machine:
// generous timeouts, and at most two files at once so engines starting in
// parallel do not starve each other. No test asserts that anything was fast:
// speed is measured in bench/, and only printed here. A bound on wall time is
// there to catch a hang; the few times compared are orderings, or lower bounds
// that hold by causality (a watchdog that acted no sooner than its timeout, an
// answer held by a stand-in that came after its release), which a slow machine
// can only make larger. Memory is the bench's and the soak's, but for one
// generous leak bound (the server's RSS growth under overload, faults.test.ts).
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    maxWorkers: 2,
    // A full run fails on a skip that is not for hardware, and names the hardware ones (test/skip-reporter.ts).
    reporters: ['default', './test/skip-reporter.ts'],
    // `slabserve serve` children started with a fixed --port would all take gRPC's default 8081 and
    // collide across test files run in parallel: off for them unless a test asks for it
    // (--grpc-port wins over the variable). startServer() with port 0 picks a free gRPC port.
    // The tests' own reference sessions keep onnxruntime's telemetry off, as the server does
    // (src/main/onnxruntime-telemetry.ts); test/onnxruntime-telemetry.test.ts starts a server without it.
    env: { SLABSERVE_GRPC_PORT: '0', ORT_DISABLE_TELEMETRY: '1' },
  },
});
