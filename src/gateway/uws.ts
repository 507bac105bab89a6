/**
 * Loads uWebSockets.js's native binary directly. The npm build we use
 * (@trufflesuite/uws-js-unofficial, installed as "uWebSockets.js") silently
 * falls back to a slow pure-JS server when the binary does not load; a
 * serving system should refuse to start instead, and say why.
 */
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import type * as UWS from 'uWebSockets.js';

export type { HttpRequest, HttpResponse, TemplatedApp, us_listen_socket, us_socket_context_t, WebSocket } from 'uWebSockets.js';

export function loadUws(): typeof UWS {
  const require = createRequire(import.meta.url);
  const pkg = dirname(require.resolve('uWebSockets.js/package.json'));
  const binary = join(pkg, 'binaries', `uws_${process.platform}_${process.arch}_${process.versions.modules}.node`);
  try {
    return require(binary) as typeof UWS;
  } catch (err) {
    throw new Error(
      `uWebSockets.js has no native binary that loads on ${process.platform}-${process.arch}, Node ABI ${process.versions.modules} ` +
        `(${(err as Error).message.split('\n')[0]}); slabserve will not run on its slow JS fallback. Use Node.js 20 on glibc >= 2.36.`,
    );
  }
}
