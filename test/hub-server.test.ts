/**
 * The fake Hub (test/fixtures/hub-server.ts) driven by the official client, @huggingface/hub,
 * unmodified and pointed at it by `hubUrl`: what it answers (checked against shas, sizes and oids
 * computed here, and against git itself), the errors the client raises, and what the client's cache
 * download does and does not do, which decides what the server may leave to it.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { lstat, mkdir, mkdtemp, readFile, readdir, readlink, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { downloadFile, downloadFileToCacheDir, fileDownloadInfo, HubApiError, listFiles, modelInfo, pathsInfo, snapshotDownload } from '@huggingface/hub';
import { startHub, type FakeHub, type LoggedRequest } from './fixtures/hub-server.js';
import { whenFileSize } from './helpers.js';

// ---- fresh contents, from a printed seed ----

const seed = Number(process.env.SLABSERVE_TEST_SEED ?? Math.floor(Math.random() * 2 ** 31));
console.log(`hub-server.test: seed ${seed}`);

/** `n` bytes drawn from the seed and `label` (sha256 in counter mode). */
function bytes(label: string, n: number): Buffer {
  const out = Buffer.alloc(n);
  for (let i = 0, off = 0; off < n; i++, off += 32) createHash('sha256').update(`${seed}:${label}:${i}`).digest().copy(out, off);
  return out;
}

const text = (label: string, n: number) => Buffer.from(JSON.stringify({ label, noise: bytes(label, n).toString('hex') }, null, 2));

// ---- what git and git-lfs would compute, written here independently of the fixture ----

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const gitBlobOid = (b: Buffer) => createHash('sha1').update(`blob ${b.length}\0`).update(b).digest('hex');
const pointer = (b: Buffer) => Buffer.from(`version https://git-lfs.github.com/spec/v1\noid sha256:${sha256(b)}\nsize ${b.length}\n`);

// ---- the repositories ----

const REPO = 'acme/tiny-bert';
const GATED = 'acme/gated-bert';
const PRIVATE = 'acme/private-bert';
const TOKEN = 'hf_granted0000000000000000000000000';
const OTHER = 'hf_other00000000000000000000000000';
const UNKNOWN = 'hf_unknown000000000000000000000000';

const SPECIAL = 'extra/notes v1+ü.txt';
const files0 = {
  '.gitattributes': Buffer.from('*.onnx filter=lfs diff=lfs merge=lfs -text\n'),
  'config.json': text('config', 64),
  'tokenizer.json': text('tokenizer', 40_000),
  'model.onnx': bytes('model v0', 1_200_000),
  'onnx/model_quantized.onnx': bytes('quantized', 300_000),
  [SPECIAL]: text('special', 16),
};
const files1 = { ...files0, 'model.onnx': bytes('model v1', 1_300_000), 'README.md': Buffer.from(`# tiny-bert ${seed}\n`) };
const LFS = new Set(['model.onnx', 'onnx/model_quantized.onnx']);
const asSpec = (files: Record<string, Buffer>) => Object.fromEntries(Object.entries(files).map(([p, b]) => [p, LFS.has(p) ? { lfs: b } : b]));
const gatedModel = bytes('gated model', 100_000);

let hub: FakeHub;
let hubUrl: string;
const scratch: string[] = [];

async function cacheDir(): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), 'hub-cache-'));
  scratch.push(d);
  return d;
}

beforeAll(async () => {
  hub = await startHub({
    repos: {
      [REPO]: {
        commits: [
          { files: asSpec(files0), title: 'Initial upload' },
          { files: asSpec(files1), title: 'Update model' },
        ],
        branches: { main: 1, 'feature/x': 0, 'refs/pr/1': 0 },
        tags: { 'v1.0': 0 },
      },
      [GATED]: { gated: 'manual', access: [TOKEN], commits: [{ files: { 'config.json': text('gated config', 32), 'model.onnx': { lfs: gatedModel } } }] },
      [PRIVATE]: { private: true, access: [TOKEN], commits: [{ files: { 'config.json': text('private config', 32) } }] },
    },
    tokens: [TOKEN, OTHER],
    // Small pages, so that every listing below is paged.
    treePageSize: 3,
    treeExpandPageSize: 2,
  });
  hubUrl = hub.url;
});

afterAll(async () => {
  await hub?.close();
  for (const d of scratch) await rm(d, { recursive: true, force: true });
});

const since = (mark: number, pred: (r: LoggedRequest) => boolean = () => true) => hub.log.slice(mark).filter(pred);

async function collect<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}

/** The HubApiError `p` rejects with. */
async function apiError(p: Promise<unknown>): Promise<HubApiError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(HubApiError);
  return err as HubApiError;
}

describe('the fake Hub answers @huggingface/hub', () => {
  it('modelInfo: the commit a revision names (branch, tag, refs/pr, sha, short sha), the file names, visibility', async () => {
    const info = await modelInfo({ name: REPO, hubUrl, additionalFields: ['sha', 'filePaths'] });
    expect(info).toMatchObject({ name: REPO, private: false, gated: false, sha: hub.commitSha(REPO, 1) });
    expect(info.filePaths.sort()).toEqual(Object.keys(files1).sort());
    expect(info.updatedAt.getTime()).not.toBeNaN();
    for (const revision of ['v1.0', 'feature/x', 'refs/pr/1', hub.commitSha(REPO, 0), hub.commitSha(REPO, 0).slice(0, 12)]) {
      const at = await modelInfo({ name: REPO, hubUrl, revision, additionalFields: ['sha'] });
      expect(at.sha, revision).toBe(hub.commitSha(REPO, 0));
    }
    expect(hub.log.some((r) => r.url.includes('/revision/refs%2Fpr%2F1?'))).toBe(true);
    // A gated repository's metadata is public.
    expect(await modelInfo({ name: GATED, hubUrl })).toMatchObject({ gated: 'manual', private: false });
    // huggingface_hub's model_info(files_metadata=True) asks blobs=true: sizes, blob ids, LFS sha256.
    const withBlobs = (await (await fetch(`${hubUrl}/api/models/${REPO}/revision/v1.0?blobs=true`)).json()) as { sha: string; siblings: { rfilename: string; blobId: string; size: number; lfs?: unknown }[] };
    expect(withBlobs.sha).toBe(hub.commitSha(REPO, 0));
    expect(withBlobs.siblings.find((x) => x.rfilename === 'model.onnx')).toEqual({
      rfilename: 'model.onnx',
      blobId: gitBlobOid(pointer(files0['model.onnx'])),
      size: files0['model.onnx'].length,
      lfs: { sha256: sha256(files0['model.onnx']), size: files0['model.onnx'].length, pointerSize: pointer(files0['model.onnx']).length },
    });
    expect(withBlobs.siblings.find((x) => x.rfilename === 'config.json')).toEqual({ rfilename: 'config.json', blobId: gitBlobOid(files0['config.json']), size: files0['config.json'].length });
  });

  it('commit shas are the ones git makes of the same trees', async () => {
    const dir = await cacheDir();
    // No configuration of this machine's (an encoding, a signing key, hooks) may change the commit.
    const identity = { GIT_CONFIG_GLOBAL: '/dev/null', GIT_CONFIG_NOSYSTEM: '1', GIT_AUTHOR_NAME: 'Fake Hub', GIT_AUTHOR_EMAIL: 'hub@example.invalid', GIT_COMMITTER_NAME: 'Fake Hub', GIT_COMMITTER_EMAIL: 'hub@example.invalid' };
    const git = (args: string[], env: Record<string, string> = {}) =>
      execFileSync('git', ['-c', 'core.autocrlf=false', ...args], { cwd: dir, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...identity, ...env } }).trim();
    git(['init', '-q']);
    const commits: [Record<string, Buffer>, string][] = [
      [files0, 'Initial upload'],
      [files1, 'Update model'],
    ];
    for (const [i, [files, title]] of commits.entries()) {
      for (const [p, b] of Object.entries(files)) {
        await mkdir(dirname(join(dir, p)), { recursive: true });
        await writeFile(join(dir, p), LFS.has(p) ? pointer(b) : b, { mode: 0o644 });
      }
      git(['add', '-A']);
      const date = `@${1_700_000_000 + i * 3600} +0000`;
      git(['commit', '-q', '-m', title], { GIT_AUTHOR_DATE: date, GIT_COMMITTER_DATE: date });
      expect(git(['rev-parse', 'HEAD'])).toBe(hub.commitSha(REPO, i));
      expect(git(['rev-parse', 'HEAD:onnx'])).toBe(((await pathsInfo({ repo: REPO, hubUrl, paths: ['onnx'], revision: hub.commitSha(REPO, i) }))[0]).oid);
    }
  });

  it('listFiles: recursive and expanded, paged by Link; sizes, git and LFS oids, the last commit of each path', async () => {
    const mark = hub.log.length;
    const entries = await collect(listFiles({ repo: REPO, hubUrl, recursive: true, expand: true }));
    const tree = since(mark, (r) => r.kind === 'tree');
    expect(tree.length).toBeGreaterThan(2);
    expect(tree.slice(1).every((r) => r.url.includes('cursor='))).toBe(true);

    const byPath = new Map(entries.map((e) => [e.path, e]));
    expect([...byPath.keys()].sort()).toEqual([...Object.keys(files1), 'onnx', 'extra'].sort());
    for (const [p, b] of Object.entries(files1)) {
      const e = byPath.get(p)!;
      expect(e.type).toBe('file');
      expect(e.size, p).toBe(b.length);
      expect(e.oid, p).toBe(gitBlobOid(LFS.has(p) ? pointer(b) : b));
      expect(e.lfs, p).toEqual(LFS.has(p) ? { oid: sha256(b), size: b.length, pointerSize: pointer(b).length } : undefined);
      const changed = p === 'model.onnx' || p === 'README.md';
      expect(e.lastCommit?.id, p).toBe(hub.commitSha(REPO, changed ? 1 : 0));
      expect(e.xetHash).toBeUndefined();
    }
    expect(byPath.get('onnx')).toMatchObject({ type: 'directory', lastCommit: { id: hub.commitSha(REPO, 0), title: 'Initial upload' } });

    const top = await collect(listFiles({ repo: REPO, hubUrl }));
    expect(top.map((e) => e.path).sort()).toEqual(['.gitattributes', 'README.md', 'config.json', 'extra', 'model.onnx', 'onnx', 'tokenizer.json']);
    const sub = await collect(listFiles({ repo: REPO, hubUrl, path: 'onnx', revision: 'v1.0' }));
    expect(sub.map((e) => [e.path, e.lfs?.oid])).toEqual([['onnx/model_quantized.onnx', sha256(files0['onnx/model_quantized.onnx'])]]);
  });

  it('pathsInfo: files and folders asked for, missing ones left out, lastCommit with expand', async () => {
    const info = await pathsInfo({ repo: REPO, hubUrl, paths: ['config.json', 'model.onnx', 'onnx', 'nope.txt'], expand: true });
    expect(info.map((i) => i.path)).toEqual(['config.json', 'model.onnx', 'onnx']);
    expect(info[0]).toMatchObject({ type: 'file', oid: gitBlobOid(files1['config.json']), size: files1['config.json'].length, lastCommit: { id: hub.commitSha(REPO, 0) } });
    expect(info[1]).toMatchObject({ lfs: { oid: sha256(files1['model.onnx']), size: files1['model.onnx'].length }, lastCommit: { id: hub.commitSha(REPO, 1), title: 'Update model' } });
    expect(info[2].type).toBe('directory');
    const old = await pathsInfo({ repo: REPO, hubUrl, paths: ['model.onnx'], revision: 'feature/x' });
    expect(old[0].lfs?.oid).toBe(sha256(files0['model.onnx']));
    expect(old[0].lastCommit).toBeUndefined();
    // huggingface_hub's get_paths_info posts a form, the revision quoted.
    const form = await fetch(`${hubUrl}/api/models/${REPO}/paths-info/feature%2Fx`, { method: 'POST', body: new URLSearchParams([['paths', 'onnx'], ['paths', SPECIAL], ['expand', 'true']]) });
    const got = (await form.json()) as { path: string; type: string; lastCommit?: { id: string } }[];
    expect(got.map((x) => [x.path, x.type, x.lastCommit?.id])).toEqual([
      ['onnx', 'directory', hub.commitSha(REPO, 0)],
      [SPECIAL, 'file', hub.commitSha(REPO, 0)],
    ]);
  });

  it('fileDownloadInfo: a regular file by its blob sha1; an LFS file through the 302 to the CDN, whose own ETag the client returns', async () => {
    const cfg = await fileDownloadInfo({ repo: REPO, hubUrl, path: 'config.json' });
    expect(cfg).toMatchObject({ size: files1['config.json'].length, etag: `"${gitBlobOid(files1['config.json'])}"` });
    expect(cfg!.url).toContain(`/api/resolve-cache/models/${REPO}/${hub.commitSha(REPO, 1)}/config.json`);

    const mark = hub.log.length;
    const model = await fileDownloadInfo({ repo: REPO, hubUrl, path: 'model.onnx' });
    expect(model!.size).toBe(files1['model.onnx'].length);
    // Not the sha256 that huggingface_hub names the blob after (X-Linked-Etag, on the 302 it follows).
    expect(model!.etag).toBe(hub.cdnEtag(REPO, 'model.onnx'));
    expect(model!.etag).not.toContain(sha256(files1['model.onnx']));
    expect(model!.url.startsWith(`${hub.cdnUrl}/cdn/repos/`)).toBe(true);
    expect(since(mark).map((r) => [r.server, r.kind, r.range, r.status])).toEqual([
      ['hub', 'resolve', 'bytes=0-0', 302],
      ['cdn', 'cdn', 'bytes=0-0', 206],
    ]);

    expect(await fileDownloadInfo({ repo: REPO, hubUrl, path: 'nope.txt' })).toBeNull();
  });

  it('downloadFile: the bytes of LFS files (from the CDN), regular files (from resolve-cache), any revision; raw gives the pointer', async () => {
    const mark = hub.log.length;
    const model = Buffer.from(await (await downloadFile({ repo: REPO, hubUrl, path: 'model.onnx' }))!.arrayBuffer());
    expect(model.equals(files1['model.onnx'])).toBe(true);
    const get = since(mark, (r) => r.kind === 'cdn' && r.range === undefined);
    expect(get.map((r) => [r.status, r.bytesSent])).toEqual([[200, files1['model.onnx'].length]]);

    for (const [revision, files] of [
      ['main', files1],
      ['v1.0', files0],
      ['refs/pr/1', files0],
    ] as const) {
      for (const p of ['model.onnx', 'tokenizer.json', SPECIAL] as const) {
        const blob = await downloadFile({ repo: REPO, hubUrl, path: p, revision });
        expect(Buffer.from(await blob!.arrayBuffer()).equals(files[p]), `${revision} ${p}`).toBe(true);
      }
    }
    const raw = await downloadFile({ repo: REPO, hubUrl, path: 'model.onnx', raw: true });
    expect(Buffer.from(await raw!.arrayBuffer()).equals(pointer(files1['model.onnx']))).toBe(true);
    expect(await downloadFile({ repo: REPO, hubUrl, path: 'nope.txt' })).toBeNull();
  });

  it('Range: a slice of a file is one 206 from the CDN; suffix, open and unsatisfiable ranges as RFC 9110 has them', async () => {
    const model = files1['model.onnx'];
    const blob = (await downloadFile({ repo: REPO, hubUrl, path: 'model.onnx' }))!;
    const mark = hub.log.length;
    const part = Buffer.from(await blob.slice(1000, 70_000).arrayBuffer());
    expect(part.equals(model.subarray(1000, 70_000))).toBe(true);
    expect(since(mark).map((r) => [r.server, r.range, r.status, r.bytesSent])).toEqual([['cdn', 'bytes=1000-69999', 206, 69_000]]);

    const url = (await fileDownloadInfo({ repo: REPO, hubUrl, path: 'model.onnx' }))!.url;
    const tail = await fetch(url, { headers: { Range: 'bytes=-10' } });
    expect([tail.status, tail.headers.get('content-range')]).toEqual([206, `bytes ${model.length - 10}-${model.length - 1}/${model.length}`]);
    expect(Buffer.from(await tail.arrayBuffer()).equals(model.subarray(-10))).toBe(true);
    const open = await fetch(url, { headers: { Range: `bytes=${model.length - 5}-` } });
    expect(Buffer.from(await open.arrayBuffer()).equals(model.subarray(-5))).toBe(true);
    const beyond = await fetch(url, { headers: { Range: `bytes=${model.length}-` } });
    expect([beyond.status, beyond.headers.get('content-range')]).toEqual([416, `bytes */${model.length}`]);
    // A regular file takes ranges too, where huggingface_hub resumes it.
    const cfg = await fetch(`${hubUrl}/${REPO}/resolve/main/config.json`, { headers: { Range: 'bytes=2-9' } });
    expect([cfg.status, Buffer.from(await cfg.arrayBuffer()).toString()]).toEqual([206, files1['config.json'].subarray(2, 10).toString()]);
  });

  it('HEAD /resolve answers what huggingface_hub reads, redirects not followed (it follows relative ones only)', async () => {
    const head = (path: string, headers: Record<string, string> = {}) => fetch(`${hubUrl}${path}`, { method: 'HEAD', redirect: 'manual', headers });
    const model = files1['model.onnx'];
    const lfs = await head(`/${REPO}/resolve/main/model.onnx`);
    expect(lfs.status).toBe(302);
    expect(lfs.headers.get('location')!.startsWith(`${hub.cdnUrl}/cdn/repos/`)).toBe(true);
    expect(lfs.headers.get('x-linked-etag')).toBe(`"${sha256(model)}"`);
    expect(lfs.headers.get('x-linked-size')).toBe(String(model.length));
    expect(lfs.headers.get('x-repo-commit')).toBe(hub.commitSha(REPO, 1));
    expect(lfs.headers.get('etag')).toBeNull();
    const cdn = await fetch(lfs.headers.get('location')!, { method: 'HEAD' });
    expect([cdn.status, cdn.headers.get('content-length'), cdn.headers.get('x-repo-commit')]).toEqual([200, String(model.length), null]);

    const cfg = files1['config.json'];
    const moved = await head(`/${REPO}/resolve/main/config.json`, { 'Accept-Encoding': 'identity' });
    expect(moved.status).toBe(307);
    const location = moved.headers.get('location')!;
    expect(location.startsWith(`/api/resolve-cache/models/${REPO}/${hub.commitSha(REPO, 1)}/config.json?`)).toBe(true);
    // huggingface_hub keeps only the Location's path (utils/_http.py), so the query must not matter.
    const final = await head(location.split('?')[0], { 'Accept-Encoding': 'identity' });
    expect([final.status, final.headers.get('etag'), final.headers.get('x-repo-commit'), final.headers.get('content-length')]).toEqual([200, `"${gitBlobOid(cfg)}"`, hub.commitSha(REPO, 1), String(cfg.length)]);

    // File paths come quoted with "/" kept (huggingface_hub hf_hub_url), revisions with "/" encoded too
    // (quote(revision, safe="") / encodeURIComponent).
    const quoted = SPECIAL.split('/').map(encodeURIComponent).join('/');
    const special = await head(`/api/resolve-cache/models/${REPO}/${hub.commitSha(REPO, 1)}/${quoted}`, { 'Accept-Encoding': 'identity' });
    expect([special.status, special.headers.get('etag')]).toEqual([200, `"${gitBlobOid(files1[SPECIAL])}"`]);
    expect((await head(`/${REPO}/resolve/main/${quoted}`)).headers.get('location')).toContain(`/${quoted}?`);
    for (const rev of ['refs%2Fpr%2F1', 'feature%2Fx', 'v1.0', hub.commitSha(REPO, 0)]) {
      expect((await head(`/${REPO}/resolve/${rev}/model.onnx`)).headers.get('x-repo-commit'), rev).toBe(hub.commitSha(REPO, 0));
    }
    const gz = await fetch(`${hubUrl}${location}`, { headers: { 'Accept-Encoding': 'gzip' } });
    expect([gz.headers.get('content-encoding'), gz.headers.get('content-length')]).toEqual(['gzip', null]);
    expect(Buffer.from(await gz.arrayBuffer()).equals(cfg)).toBe(true);
  });

  it('errors: status, X-Error-Code and message as the Hub sends them, and the HubApiError the client raises', async () => {
    const code = async (path: string, token?: string) => {
      const r = await fetch(`${hubUrl}${path}`, { headers: token ? { Authorization: `Bearer ${token}` } : {} });
      return [r.status, r.headers.get('x-error-code'), ((await r.json()) as { error: string }).error];
    };
    const gatedNoToken = `Access to model ${GATED} is restricted. You must have access to it and be authenticated to access it. Please log in.`;
    const gatedOther = `Access to model ${GATED} is restricted and you are not in the authorized list. Visit https://huggingface.co/${GATED} to ask for access.`;
    expect(await code('/api/models/acme/missing')).toEqual([401, 'RepoNotFound', 'Invalid username or password.']);
    expect(await code('/api/models/acme/missing', OTHER)).toEqual([404, 'RepoNotFound', 'Repository not found']);
    expect(await code(`/api/models/${PRIVATE}`)).toEqual([401, 'RepoNotFound', 'Invalid username or password.']);
    expect(await code(`/api/models/${PRIVATE}`, OTHER)).toEqual([404, 'RepoNotFound', 'Repository not found']);
    expect(await code(`/${GATED}/resolve/main/config.json`)).toEqual([401, 'GatedRepo', gatedNoToken]);
    expect(await code(`/${GATED}/resolve/main/config.json`, OTHER)).toEqual([403, 'GatedRepo', gatedOther]);
    expect(await code(`/${REPO}/resolve/nope/config.json`)).toEqual([404, 'RevisionNotFound', 'Invalid rev id: nope']);
    expect(await code(`/${REPO}/resolve/main/nope.txt`)).toEqual([404, 'EntryNotFound', 'Entry not found']);
    expect(await code(`/api/models/${REPO}`, UNKNOWN)).toEqual([401, null, 'Invalid credentials in Authorization header']);

    // The client: a HubApiError with the status and the Hub's message, for every one of them.
    expect(await apiError(modelInfo({ name: 'acme/missing', hubUrl }))).toMatchObject({ statusCode: 401, data: { error: 'Invalid username or password.' } });
    expect((await apiError(modelInfo({ name: 'acme/missing', hubUrl, accessToken: OTHER }))).statusCode).toBe(404);
    expect((await apiError(modelInfo({ name: PRIVATE, hubUrl }))).statusCode).toBe(401);
    expect((await apiError(modelInfo({ name: PRIVATE, hubUrl, accessToken: OTHER }))).statusCode).toBe(404);
    expect(await modelInfo({ name: PRIVATE, hubUrl, accessToken: TOKEN })).toMatchObject({ private: true });
    const gated401 = await apiError(downloadFile({ repo: GATED, hubUrl, path: 'model.onnx' }));
    expect([gated401.statusCode, gated401.message.startsWith(gatedNoToken)]).toEqual([401, true]);
    const gated403 = await apiError(downloadFile({ repo: GATED, hubUrl, path: 'model.onnx', accessToken: OTHER }));
    expect([gated403.statusCode, gated403.message.startsWith(gatedOther)]).toEqual([403, true]);
    const mark = hub.log.length;
    const granted = await downloadFile({ repo: GATED, hubUrl, path: 'model.onnx', accessToken: TOKEN });
    expect(Buffer.from(await granted!.arrayBuffer()).equals(gatedModel)).toBe(true);
    // fetch drops the token on the cross-origin redirect, but the client then sends it to the CDN's
    // URL itself (it takes that URL for a CloudFront one), where huggingface_hub drops it.
    expect(since(mark).map((r) => [r.server, r.range, r.authorization])).toEqual([
      ['hub', 'bytes=0-0', true],
      ['cdn', 'bytes=0-0', false],
      ['cdn', undefined, true],
    ]);
    expect(await apiError(modelInfo({ name: REPO, hubUrl, revision: 'nope' }))).toMatchObject({ statusCode: 404, data: { error: 'Invalid rev id: nope' } });
    // An unknown revision is an error, a missing file is null: fileDownloadInfo tells them apart by X-Error-Code.
    expect((await apiError(fileDownloadInfo({ repo: REPO, hubUrl, path: 'config.json', revision: 'nope' }))).statusCode).toBe(404);
    expect((await apiError(collect(listFiles({ repo: REPO, hubUrl, path: 'nope' })))).statusCode).toBe(404);
    expect((await apiError(modelInfo({ name: REPO, hubUrl, accessToken: UNKNOWN }))).statusCode).toBe(401);
    // downloadFileToCacheDir turns a missing file into a plain Error, not a HubApiError.
    await expect(downloadFileToCacheDir({ repo: REPO, hubUrl, path: 'nope.txt', cacheDir: await cacheDir() })).rejects.toThrow('cannot get path info for nope.txt');
  });

  it('listFiles puts the revision in the URL unencoded: "refs/pr/1" reads as revision "refs", path "pr/1"', async () => {
    const mark = hub.log.length;
    expect(await apiError(collect(listFiles({ repo: REPO, hubUrl, revision: 'refs/pr/1' })))).toMatchObject({ statusCode: 404, data: { error: 'Invalid rev id: refs' } });
    expect(since(mark)[0].path).toBe(`/api/models/${REPO}/tree/refs/pr/1`);
    // Encoded by the caller, it is one revision.
    const files = await collect(listFiles({ repo: REPO, hubUrl, revision: encodeURIComponent('refs/pr/1'), recursive: true }));
    expect(files.find((f) => f.path === 'model.onnx')?.lfs?.oid).toBe(sha256(files0['model.onnx']));
  });

  it('fault injection: failures, a cut, corruption, a held request, going offline', async () => {
    const cfgResolve = (r: LoggedRequest) => r.kind === 'resolve' && r.file === 'config.json';
    hub.failNext(cfgResolve, 2, 503);
    expect((await apiError(fileDownloadInfo({ repo: REPO, hubUrl, path: 'config.json' }))).statusCode).toBe(503);
    expect((await apiError(fileDownloadInfo({ repo: REPO, hubUrl, path: 'config.json' }))).statusCode).toBe(503);
    expect(await fileDownloadInfo({ repo: REPO, hubUrl, path: 'config.json' })).not.toBeNull();

    const model = files1['model.onnx'];
    const cdnGet = (r: LoggedRequest) => r.kind === 'cdn' && r.file === 'model.onnx' && r.range === undefined;
    hub.cutOnce(cdnGet, 100_000);
    const url = (await fileDownloadInfo({ repo: REPO, hubUrl, path: 'model.onnx' }))!.url;
    const cut = await fetch(url);
    await expect(cut.arrayBuffer()).rejects.toThrow();
    expect(hub.log.filter(cdnGet).at(-1)).toMatchObject({ cut: true, bytesSent: 100_000 });
    expect(Buffer.from(await (await fetch(url)).arrayBuffer()).equals(model)).toBe(true);

    hub.corruptOnce(cdnGet);
    const bad = Buffer.from(await (await fetch(url)).arrayBuffer());
    expect([bad.length, bad.equals(model)]).toEqual([model.length, false]);

    const held = hub.hold(cdnGet, { afterBytes: 200_000 });
    let done = false;
    const body = fetch(url)
      .then((r) => r.arrayBuffer())
      .then((b) => ((done = true), Buffer.from(b)));
    expect((await held.arrived).bytesSent).toBe(200_000);
    expect(done).toBe(false);
    held.release();
    expect((await body).equals(model)).toBe(true);

    // Held before it is answered: a string target is the decoded path.
    const before = hub.hold(`/api/models/${REPO}`);
    const info = fetch(`${hubUrl}/api/models/${REPO}`);
    expect((await before.arrived).status).toBeUndefined();
    before.release();
    expect((await info).status).toBe(200);

    await hub.offline();
    await expect(fetch(`${hubUrl}/api/models/${REPO}`)).rejects.toThrow();
    await hub.online();
    expect((await fetch(`${hubUrl}/api/models/${REPO}`)).status).toBe(200);
  });
});

describe('the fake Hub, other settings', () => {
  it('the CDN under the Hub origin, regular files served by /resolve itself, expired CDN URLs', async () => {
    const files = { 'config.json': text('variant config', 32), 'model.onnx': bytes('variant model', 50_000) };
    const repos = { [REPO]: { commits: [{ files: { 'config.json': files['config.json'], 'model.onnx': { lfs: files['model.onnx'] } } }] } };
    const same = await startHub({ repos, cdn: 'hub-host', resolveCache: false });
    const expired = await startHub({ repos, cdnUrlTtlSeconds: -60 });
    try {
      expect(same.cdnUrl).toBe(same.url);
      const info = await fileDownloadInfo({ repo: REPO, hubUrl: same.url, path: 'model.onnx' });
      expect(info!.url.startsWith(`${same.url}/cdn/repos/`)).toBe(true);
      for (const [p, b] of Object.entries(files)) {
        const got = await downloadFile({ repo: REPO, hubUrl: same.url, path: p });
        expect(Buffer.from(await got!.arrayBuffer()).equals(b), p).toBe(true);
      }
      const cfg = await fetch(`${same.url}/${REPO}/resolve/main/config.json`, { method: 'HEAD', redirect: 'manual' });
      expect([cfg.status, cfg.headers.get('etag'), cfg.headers.get('x-repo-commit')]).toEqual([200, `"${gitBlobOid(files['config.json'])}"`, same.commitSha(REPO, 0)]);
      expect(same.log.every((r) => r.server === 'hub')).toBe(true);

      const denied = await apiError(downloadFile({ repo: REPO, hubUrl: expired.url, path: 'model.onnx' }));
      expect(denied.statusCode).toBe(403);
    } finally {
      await same.close();
      await expired.close();
    }
  });
});

describe("@huggingface/hub's cache download (what a server caching files may leave to it)", () => {
  const storage = (dir: string) => join(dir, 'models--acme--tiny-bert');

  it('downloadFileToCacheDir: blobs/<sha256 or blob sha1>, a relative symlink in snapshots/<commit>/<path>; no refs/, no .locks', async () => {
    const dir = await cacheDir();
    const model = await downloadFileToCacheDir({ repo: REPO, hubUrl, path: 'model.onnx', cacheDir: dir });
    expect(model).toBe(join(storage(dir), 'snapshots', hub.commitSha(REPO, 1), 'model.onnx'));
    expect((await lstat(model)).isSymbolicLink()).toBe(true);
    expect(await readlink(model)).toBe(`../../blobs/${sha256(files1['model.onnx'])}`);
    expect((await readFile(model)).equals(files1['model.onnx'])).toBe(true);

    const quantized = await downloadFileToCacheDir({ repo: REPO, hubUrl, path: 'onnx/model_quantized.onnx', cacheDir: dir });
    expect(await readlink(quantized)).toBe(`../../../blobs/${sha256(files1['onnx/model_quantized.onnx'])}`);

    // The snapshot folder is the commit that last changed the file (pathsInfo's lastCommit), not the
    // commit main names: config.json of main lands beside commit 0, model.onnx of main beside commit 1.
    const cfg = await downloadFileToCacheDir({ repo: REPO, hubUrl, path: 'config.json', cacheDir: dir });
    expect(cfg).toBe(join(storage(dir), 'snapshots', hub.commitSha(REPO, 0), 'config.json'));
    expect(await readlink(cfg)).toBe(`../../blobs/${gitBlobOid(files1['config.json'])}`);
    expect((await readdir(join(storage(dir), 'snapshots'))).sort()).toEqual([hub.commitSha(REPO, 0), hub.commitSha(REPO, 1)].sort());
    expect((await readdir(storage(dir))).sort()).toEqual(['blobs', 'snapshots']);
    expect(existsSync(join(dir, '.locks'))).toBe(false);

    // A branch asks the Hub every time (paths-info), and fails offline though the file is there;
    // only a commit sha is answered from the cache without a request.
    let mark = hub.log.length;
    expect(await downloadFileToCacheDir({ repo: REPO, hubUrl, path: 'model.onnx', cacheDir: dir })).toBe(model);
    expect(since(mark).map((r) => r.kind)).toEqual(['paths-info']);
    mark = hub.log.length;
    expect(await downloadFileToCacheDir({ repo: REPO, hubUrl, path: 'model.onnx', cacheDir: dir, revision: hub.commitSha(REPO, 1) })).toBe(model);
    expect(since(mark)).toEqual([]);
    await hub.offline();
    try {
      await expect(downloadFileToCacheDir({ repo: REPO, hubUrl, path: 'model.onnx', cacheDir: dir })).rejects.toThrow('fetch failed');
      expect(await downloadFileToCacheDir({ repo: REPO, hubUrl, path: 'model.onnx', cacheDir: dir, revision: hub.commitSha(REPO, 1) })).toBe(model);
    } finally {
      await hub.online();
    }
  });

  it('snapshotDownload: refs/<revision> written, one snapshot folder named after the revision commit, every file', async () => {
    const dir = await cacheDir();
    const snapshot = await snapshotDownload({ repo: REPO, hubUrl, cacheDir: dir, revision: 'v1.0' });
    expect(snapshot).toBe(join(storage(dir), 'snapshots', hub.commitSha(REPO, 0)));
    expect(await readFile(join(storage(dir), 'refs', 'v1.0'), 'utf8')).toBe(hub.commitSha(REPO, 0));
    for (const [p, b] of Object.entries(files0)) expect((await readFile(join(snapshot, p))).equals(b), p).toBe(true);
  });

  it('no hash check: corrupted bytes are kept as blobs/<sha256> and served from the cache from then on', async () => {
    const dir = await cacheDir();
    const path = 'onnx/model_quantized.onnx';
    hub.corruptOnce((r) => r.kind === 'cdn' && r.file === path && r.range === undefined);
    const got = await readFile(await downloadFileToCacheDir({ repo: REPO, hubUrl, path, cacheDir: dir }));
    expect(got.length).toBe(files1[path].length);
    expect(sha256(got)).not.toBe(sha256(files1[path]));
    const again = await readFile(await downloadFileToCacheDir({ repo: REPO, hubUrl, path, cacheDir: dir }));
    expect(again.equals(got)).toBe(true);
  });

  it('no resume: a cut download rejects and leaves <blob>.incomplete; the next one starts again from byte 0', async () => {
    const dir = await cacheDir();
    const model = files1['model.onnx'];
    const cdnGet = (r: LoggedRequest) => r.kind === 'cdn' && r.file === 'model.onnx' && r.range === undefined;
    hub.cutOnce(cdnGet, 300_000);
    await expect(downloadFileToCacheDir({ repo: REPO, hubUrl, path: 'model.onnx', cacheDir: dir })).rejects.toThrow();
    const incomplete = join(storage(dir), 'blobs', `${sha256(model)}.incomplete`);
    expect((await stat(incomplete)).size).toBeLessThanOrEqual(300_000);
    const mark = hub.log.length;
    expect((await readFile(await downloadFileToCacheDir({ repo: REPO, hubUrl, path: 'model.onnx', cacheDir: dir }))).equals(model)).toBe(true);
    expect(since(mark, cdnGet).map((r) => [r.range, r.bytesSent])).toEqual([[undefined, model.length]]);
    expect(existsSync(incomplete)).toBe(false);
  });

  it('no lock: two downloads of one file at once both fetch it into the same .incomplete', async () => {
    const dir = await cacheDir();
    const path = 'onnx/model_quantized.onnx';
    const cdnGet = (r: LoggedRequest) => r.kind === 'cdn' && r.file === path && r.range === undefined;
    const mark = hub.log.length;
    const held = hub.hold(cdnGet, { afterBytes: 100_000 });
    const first = downloadFileToCacheDir({ repo: REPO, hubUrl, path, cacheDir: dir }).then(
      (p) => ({ ok: true as const, p }),
      (e: Error) => ({ ok: false as const, e }),
    );
    await held.arrived;
    // The first is writing its .incomplete (its bytes reach the file some time after the fake sent them).
    const incomplete = join(storage(dir), 'blobs', `${sha256(files1[path])}.incomplete`);
    await whenFileSize(incomplete, (n) => n > 0, "the first download's .incomplete written");
    // The second truncates the first's .incomplete, downloads it whole and renames it into place.
    const second = await downloadFileToCacheDir({ repo: REPO, hubUrl, path, cacheDir: dir });
    expect((await readFile(second)).equals(files1[path])).toBe(true);
    held.release();
    const outcome = await first;
    expect(since(mark, cdnGet).length).toBe(2);
    // The first one's rename finds no .incomplete any more; what it wrote went into the blob the
    // second renamed (the same bytes, here).
    expect(outcome.ok ? 'resolved' : outcome.e.message).toMatch(/ENOENT.*rename/);
    expect((await readFile(second)).equals(files1[path])).toBe(true);
  });
});
