/**
 * onnxruntime 1.29's telemetry stays off in a server whose operator did not
 * ask for it (src/main/onnxruntime-telemetry.ts): a real `slabserve serve`
 * started without ORT_DISABLE_TELEMETRY in its environment, and without the
 * CI variables onnxruntime also stands down for, serves a request and leaves
 * nothing of onnxruntime's behind: no device id or event cache in its home,
 * no debug log in /tmp. Without the switch, this same start writes both.
 */
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { keepOnnxruntimeTelemetryOff, ORT_TELEMETRY_SWITCH } from '../dist/src/main/onnxruntime-telemetry.js';
import { serveCli } from './cli-process.js';

/** The variables onnxruntime 1.29 reads as "running in CI" (its telemetry_environment.h): unset, so only our switch can keep it off. */
const CI_VARIABLES = ['CI', 'TF_BUILD', 'GITHUB_ACTIONS', 'GITLAB_CI', 'CIRCLECI', 'TRAVIS', 'JENKINS_URL', 'CODEBUILD_BUILD_ID', 'BUILDKITE', 'TEAMCITY_VERSION', 'APPVEYOR', 'BITBUCKET_BUILD_NUMBER', 'SYSTEM_TEAMFOUNDATIONCOLLECTIONURI', 'ORT_RUNNING_UNIT_TESTS'];

/** What onnxruntime left of a `slabserve serve` run with `switchValue` (undefined: the variable unset) in a fresh HOME. */
async function leftBehind(switchValue: string | undefined): Promise<{ home: string[]; debugLog: boolean }> {
  const home = mkdtempSync(join(tmpdir(), 'slabserve-home-'));
  try {
    const startedMs = Date.now();
    const unset = Object.fromEntries([ORT_TELEMETRY_SWITCH, ...CI_VARIABLES].map((k) => [k, undefined]));
    const server = await serveCli([], { env: { ...unset, [ORT_TELEMETRY_SWITCH]: switchValue, HOME: home } });
    try {
      const res = await fetch(`http://127.0.0.1:${server.port}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"inputs":"is telemetry off?"}' });
      expect(res.status).toBe(200); // every session is open and has run
    } finally {
      server.kill('SIGTERM');
      expect((await server.exited).code).toBe(0);
    }
    const debugLog = `/tmp/mat-debug-${server.pid}.log`;
    const written = existsSync(debugLog) && statSync(debugLog).mtimeMs >= startedMs - 1000; // an older one is another process's with the same pid
    if (written) rmSync(debugLog, { force: true });
    return { home: readdirSync(home, { recursive: true }).map(String).sort(), debugLog: written };
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
}

describe('onnxruntime telemetry', () => {
  it('a server started without ORT_DISABLE_TELEMETRY writes no device id, event cache or debug log of onnxruntime', async () => {
    // onnxruntime's would be $HOME/.cache/Microsoft/DeveloperTools/.onnxruntime/{deviceid,onnxruntime.db}
    expect(await leftBehind(undefined)).toEqual({ home: [], debugLog: false });
  });

  it('the control: the same start with ORT_DISABLE_TELEMETRY=0 (the operator turns it on) does write them, so the check above can fail', async () => {
    const on = await leftBehind('0');
    expect(on.home.some((f) => f.endsWith('.onnxruntime/deviceid') || f.endsWith('onnxruntime.db')), JSON.stringify(on)).toBe(true);
  });

  it('sets the switch where it is unset or empty, and keeps an operator\'s value', () => {
    const before = process.env[ORT_TELEMETRY_SWITCH];
    try {
      for (const [given, kept] of [[undefined, '1'], ['', '1'], ['0', '0'], ['1', '1']] as const) {
        if (given === undefined) delete process.env[ORT_TELEMETRY_SWITCH];
        else process.env[ORT_TELEMETRY_SWITCH] = given;
        keepOnnxruntimeTelemetryOff();
        expect({ given, now: process.env[ORT_TELEMETRY_SWITCH] }).toEqual({ given, now: kept });
      }
    } finally {
      if (before === undefined) delete process.env[ORT_TELEMETRY_SWITCH];
      else process.env[ORT_TELEMETRY_SWITCH] = before;
    }
  });
});
