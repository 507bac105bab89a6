/**
 * Seeded pseudo-random numbers for deterministic model generation.
 *
 * Generator: xoshiro128** (Blackman & Vigna), 128-bit state, 32-bit output,
 * seeded through splitmix32 so that nearby seeds give unrelated streams.
 * Gaussians use the Box–Muller transform (both values of each pair are used).
 *
 * Everything is integer arithmetic (Math.imul, shifts) plus Math.log /
 * Math.sqrt / Math.cos / Math.sin; V8 implements the latter with its fdlibm
 * port, so a given seed produces the same bits on every run and platform.
 */

/** 32-bit FNV-1a of a string: turns tensor names into stream labels. */
export function hashString(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** splitmix32 step: a good mixer for seeding. */
function splitmix32(state: { s: number }): number {
  state.s = (state.s + 0x9e3779b9) | 0;
  let z = state.s;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
  return (z ^ (z >>> 16)) >>> 0;
}

const TWO_PI = 2 * Math.PI;
const INV_2_32 = 1 / 4294967296;

export class Rng {
  private a: number;
  private b: number;
  private c: number;
  private d: number;
  private spare: number | null = null;
  readonly seed: number;

  /** `seed` is any integer (taken mod 2^32) or a string (hashed). */
  constructor(seed: number | string) {
    this.seed = typeof seed === 'string' ? hashString(seed) : seed >>> 0;
    const st = { s: this.seed };
    this.a = splitmix32(st);
    this.b = splitmix32(st);
    this.c = splitmix32(st);
    this.d = splitmix32(st);
    if ((this.a | this.b | this.c | this.d) === 0) this.a = 1; // the all-zero state is a fixed point
  }

  /**
   * An independent generator for a named sub-stream (e.g. one per tensor), so
   * that one tensor's values don't depend on how many numbers were drawn for
   * the tensors generated before it.
   */
  fork(label: string): Rng {
    return new Rng((Math.imul(this.seed ^ 0x5bd1e995, 0x27d4eb2d) ^ hashString(label)) >>> 0);
  }

  /** Uniform 32-bit unsigned integer (xoshiro128**). */
  nextU32(): number {
    const result = Math.imul(rotl(Math.imul(this.b, 5), 7), 9) >>> 0;
    const t = this.b << 9;
    this.c ^= this.a;
    this.d ^= this.b;
    this.b ^= this.c;
    this.a ^= this.d;
    this.c ^= t;
    this.d = rotl(this.d, 11);
    return result;
  }

  /** Uniform in [0, 1). */
  next(): number {
    return this.nextU32() * INV_2_32;
  }

  /** Uniform integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  /** Standard normal N(0, 1) via Box–Muller. */
  normal(): number {
    if (this.spare !== null) {
      const s = this.spare;
      this.spare = null;
      return s;
    }
    const u1 = (this.nextU32() + 1) * INV_2_32; // (0, 1]: log never sees 0
    const u2 = this.nextU32() * INV_2_32;
    const r = Math.sqrt(-2 * Math.log(u1));
    const theta = TWO_PI * u2;
    this.spare = r * Math.sin(theta);
    return r * Math.cos(theta);
  }

  /** Fills `out` with N(mean, std²) samples (rounded to float32 by the array). */
  fillNormal(out: Float32Array, std: number, mean = 0): Float32Array {
    for (let i = 0; i < out.length; i++) out[i] = mean + std * this.normal();
    return out;
  }

  /** A new Float32Array of `n` N(mean, std²) samples. */
  normalArray(n: number, std: number, mean = 0): Float32Array {
    return this.fillNormal(new Float32Array(n), std, mean);
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}

/**
 * mulberry32: a tiny seeded generator of floats in [0, 1), for workloads in
 * benchmarks and tests (model weights use Rng above).
 */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
