/**
 * Which uWebSockets.js build serves (src/gateway/uws.ts): the first of the
 * installed builds, the newer first, whose binary loads here; and where none
 * loads, a refusal that says what was tried and which Node.js lines work on
 * this C library and elsewhere. The choice as a function of which candidates
 * load, then the candidates and glibc needs read from the installed packages.
 */
import { describe, expect, it } from 'vitest';
import { candidateGlibc, chooseUws, chooseUwsHere, glibcNeeded, thisRuntime, uwsCandidates, type Runtime, type UwsCandidate } from '../dist/src/gateway/uws.js';

const NEWER: UwsCandidate = { package: '@btc-vision/uwebsockets.js', version: '20.57.0', binary: '/x/uws_linux_x64_127.node', abis: [115, 127, 137, 141] };
const OLDER: UwsCandidate = { package: '@trufflesuite/uws-js-unofficial', version: '20.30.0-unofficial.0', binary: '/y/uws_linux_x64_127.node', abis: [115] };
const GLIBC: Record<string, string> = { [NEWER.package]: '2.38', [OLDER.package]: '2.27' };
const glibcOf = (c: UwsCandidate) => GLIBC[c.package] ?? null;
const node22 = (glibc: string | null): Runtime => ({ node: 'v22.23.5', abi: 127, platform: 'linux', arch: 'x64', glibc });
const GLIBC_ERROR = "/lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.38' not found";
const MISSING = "Cannot find module '/y/uws_linux_x64_127.node'";

describe('chooseUws', () => {
  it('takes the first candidate that loads: the newer where both do, the older where only it does', () => {
    expect(chooseUws([NEWER, OLDER], [null], node22('2.41'), glibcOf)).toEqual({ choice: { package: NEWER.package, version: '20.57.0', binary: NEWER.binary } });
    expect(chooseUws([NEWER, OLDER], [GLIBC_ERROR, null], node22('2.36'), glibcOf)).toEqual({ choice: { package: OLDER.package, version: OLDER.version, binary: OLDER.binary } });
  });

  it('refuses where none loads, naming the runtime, each attempt, and the Node.js lines that work here and elsewhere', () => {
    const r = chooseUws([NEWER, OLDER], [GLIBC_ERROR, MISSING], node22('2.36'), glibcOf);
    expect('refusal' in r).toBe(true);
    const text = (r as { refusal: string }).refusal;
    expect(text).toContain('Node.js v22.23.5, ABI 127, on linux-x64 with glibc 2.36');
    expect(text).toContain('slow JS fallback');
    expect(text).toContain(`${NEWER.package} 20.57.0 has binaries for Node.js 20, 22, 24, 25 with glibc >= 2.38; here: ${GLIBC_ERROR}`);
    expect(text).toContain(`${OLDER.package} 20.30.0-unofficial.0 has binaries for Node.js 20 with glibc >= 2.27; here: ${MISSING}`);
    expect(text).toContain('What works: on this glibc 2.36: Node.js 20; Node.js 20, 22, 24, 25 on a system with glibc >= 2.38');
    expect(text).toContain("slabserve's Docker image");
  });

  it('on another C library (musl: no glibc) nothing fits here, and the glibc builds are named as the way', () => {
    const text = (chooseUws([NEWER, OLDER], ['Error relocating', 'Error relocating'], node22(null), glibcOf) as { refusal: string }).refusal;
    expect(text).toContain('with a C library other than glibc');
    expect(text).not.toContain('on this');
    expect(text).toContain('Node.js 20 on a system with glibc >= 2.27');
  });

  it('a platform neither build has binaries for, and no build installed at all', () => {
    const none = { ...NEWER, abis: [] };
    const text = (chooseUws([none], [MISSING], { ...node22('2.36'), platform: 'freebsd' }, glibcOf) as { refusal: string }).refusal;
    expect(text).toContain('has binaries for nothing on freebsd-x64');
    expect((chooseUws([], [], node22('2.36'), glibcOf) as { refusal: string }).refusal).toContain('is installed: run npm ci');
  });
});

describe('the installed builds', () => {
  it('are both candidates, the newer first, with their binaries for this platform from Node.js 20 on', () => {
    const cands = uwsCandidates();
    expect(cands.map((c) => c.package)).toEqual(['@btc-vision/uwebsockets.js', '@trufflesuite/uws-js-unofficial']);
    expect(cands[0]!.abis).toEqual([115, 127, 137, 141]);
    expect(cands[1]!.abis).toEqual([115]); // its Node 16 and 18 binaries are older than slabserve runs on
    expect(cands[0]!.binary).toMatch(new RegExp(`uws_linux_x64_${process.versions.modules}\\.node$`));
  });

  it("need glibc 2.38 (the newer) and 2.27 (the older), read from their binaries' symbol versions", () => {
    const [newer, older] = uwsCandidates();
    expect(candidateGlibc(newer!)).toBe('2.38');
    expect(candidateGlibc(older!)).toBe('2.27');
    expect(glibcNeeded('/nonexistent')).toBeNull();
  });

  it('the one this machine serves with: the newer where its glibc has 2.38, else the older', () => {
    const glibc = thisRuntime().glibc!;
    const minor = Number(glibc.split('.')[1]);
    expect(chooseUwsHere().package).toBe(minor >= 38 ? '@btc-vision/uwebsockets.js' : '@trufflesuite/uws-js-unofficial');
  });
});
