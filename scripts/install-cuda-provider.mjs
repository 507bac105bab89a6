#!/usr/bin/env node
// Places onnxruntime's CUDA 13 execution provider beside onnxruntime-node's
// native binding, so that `--device cuda` (or `auto`) can use the GPU.
//
// onnxruntime-node 1.29.0 ships CPU only; its own installer fetches the CUDA
// files from a host we cannot reach (hence denied in package.json's
// allowScripts). The same build of the provider (ONNX Runtime 1.29.0, CUDA 13) is
// on npm as com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9.
//
//   npm run cuda:install                      # fetch the package from the npm registry
//   npm run cuda:install -- --from FILE.tgz   # or from a tarball / unpacked folder (offline machines)
//   npm run cuda:install -- --remove          # take the provider out again (CPU only)
//   npm run cuda:install -- --force           # even where no GPU or CUDA runtime is visible (an image build)
//
// CPU machines never need this; without it `auto` selects the CPU. Before
// anything is fetched it runs the server's own CUDA pre-flight (dist/, from
// `npm run build`): where no GPU or no CUDA 13 / cuDNN 9 libraries are
// visible the provider would never load, so it says which and stops, unless --force.
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { parseArgs } from 'node:util';

const PACKAGE = 'com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9';
const FILES = ['libonnxruntime_providers_cuda.so', 'libonnxruntime_providers_shared.so']; // CUDA_PROVIDER_FILES in device.ts
const INNER = 'package/Plugins/Linux/x64';

const { values } = parseArgs({ options: { from: { type: 'string' }, remove: { type: 'boolean', default: false }, force: { type: 'boolean', default: false } } });

if (process.platform !== 'linux' || process.arch !== 'x64') {
  console.log(`cuda:install: the CUDA provider is built for linux-x64; this is ${process.platform}-${process.arch}. Nothing to do.`);
  process.exit(0);
}

const require = createRequire(import.meta.url);
const target = join(dirname(require.resolve('onnxruntime-node/package.json')), 'bin', 'napi-v6', 'linux', 'x64');

if (values.remove) {
  for (const f of FILES) rmSync(join(target, f), { force: true });
  console.log(`cuda:install: removed the CUDA provider from ${target}`);
  process.exit(0);
}

/** What would keep the provider from loading here (the server's pre-flight: src/gpu-worker/device.ts), one line each. */
async function blockers() {
  const device = await import('../dist/src/gpu-worker/device.js').catch(() => null);
  if (!device) return ['cannot check for a GPU and the CUDA libraries: dist/ is missing (run `npm run build` first)'];
  const probes = device.systemProbes();
  const gpu = device.missingGpu(probes);
  const libraries = device.missingLibraries(probes);
  return [...(gpu ? [gpu.reason] : []), ...(libraries.length ? [`not on the loader path: ${libraries.join(', ')} (install the CUDA 13 runtime and cuDNN 9, or add their folder to LD_LIBRARY_PATH)`] : [])];
}

const blocked = await blockers();
for (const b of blocked) console.error(`cuda:install: ${b}`);
if (blocked.length && !values.force) {
  console.error('cuda:install: the CUDA provider could not be used on this machine, so nothing is fetched; `--device auto` serves on the CPU without it.');
  console.error('cuda:install: pass --force to install it anyway (say, for an image built without a GPU): npm run cuda:install -- --force');
  process.exit(1);
}
if (blocked.length) console.error('cuda:install: --force: installing anyway');

const work = mkdtempSync(join(tmpdir(), 'slabserve-cuda-'));
try {
  let source; // folder holding the two .so files
  const from = values.from;
  if (from && existsSync(from) && statSync(from).isDirectory()) {
    source = [from, join(from, INNER), join(from, 'Plugins/Linux/x64')].find((d) => existsSync(join(d, FILES[0])));
    if (!source) throw new Error(`${from} holds no ${FILES[0]}`);
  } else {
    let tarball = from;
    if (!tarball) {
      console.log(`cuda:install: fetching ${PACKAGE} (about 100 MB) from the npm registry...`);
      execFileSync('npm', ['pack', PACKAGE, '--pack-destination', work, '--silent'], { stdio: ['ignore', 'ignore', 'inherit'] });
      tarball = join(work, readdirSync(work).find((f) => f.endsWith('.tgz')));
    }
    if (!existsSync(tarball)) throw new Error(`no such file: ${tarball}`);
    execFileSync('tar', ['-xzf', tarball, '-C', work, ...FILES.map((f) => `${INNER}/${f}`)]);
    source = join(work, INNER);
  }
  for (const f of FILES) copyFileSync(join(source, f), join(target, f));
  console.log(`cuda:install: placed ${FILES.join(', ')} in ${target}`);
} catch (err) {
  console.error(`cuda:install: failed: ${err.message}`);
  process.exit(1);
} finally {
  rmSync(work, { recursive: true, force: true });
}
