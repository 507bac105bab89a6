/**
 * How a download shows itself: on a terminal, one line per file redrawn in
 * place (a bar, its share and size); elsewhere (a log collector, a pod), one
 * line per file as it finishes.
 */
import type { FetchProgress } from './fetch-model.js';

const REDRAW_MS = 100;
const BAR_WIDTH = 24;

export function downloadProgress(model: string, log: (line: string) => void, out: NodeJS.WriteStream = process.stderr): FetchProgress {
  const files = new Map<string, { at: number; from: number; size: number }>();
  let drawnAt = 0;
  return {
    start(file, size, from) {
      files.set(file, { at: Date.now(), from, size });
      if (from > 0) log(`slabserve: ${model}: resuming ${file} at ${mb(from)} of ${mb(size)}`);
    },
    update(file, received) {
      if (!out.isTTY || Date.now() - drawnAt < REDRAW_MS) return;
      drawnAt = Date.now();
      out.write(`\r${bar(`${model} ${file}`, received, files.get(file)?.size ?? 0)}\x1b[K`);
    },
    done(file, size) {
      if (out.isTTY) out.write('\r\x1b[K');
      const f = files.get(file);
      const secs = f ? ((Date.now() - f.at) / 1000).toFixed(1) : '?';
      log(`slabserve: ${model}: fetched ${file} (${mb(size - (f?.from ?? 0))}) in ${secs} s`);
    },
  };
}

function bar(label: string, received: number, size: number): string {
  const share = size > 0 ? Math.min(1, received / size) : 0;
  const full = Math.round(share * BAR_WIDTH);
  return `${label} [${'#'.repeat(full)}${'.'.repeat(BAR_WIDTH - full)}] ${(share * 100).toFixed(0)}% ${mb(received)}/${mb(size)}`;
}

const mb = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MB`;
