/**
 * Gives freed heap memory back to the system (glibc's malloc_trim) after a
 * model's session is released: onnxruntime frees its arena and weights into
 * malloc's free lists, which glibc keeps, so without a trim the process's RSS
 * only grows over load/unload cycles (measured: docs/model-repository.md).
 * Through koffi, as the socket calls (src/main/drain/kernel-sockets.ts); a no-op where
 * there is no glibc.
 */
import { createRequire } from 'node:module';

let trim: (() => void) | null | undefined;

/** malloc_trim(0); true if it ran. */
export function trimHeap(): boolean {
  if (trim === undefined) {
    try {
      const koffi = createRequire(import.meta.url)('koffi') as typeof import('koffi');
      const f = koffi.load('libc.so.6').func('int malloc_trim(uintptr_t pad)');
      trim = () => void f(0);
    } catch {
      trim = null; // not glibc, or koffi missing
    }
  }
  trim?.();
  return trim !== null;
}
