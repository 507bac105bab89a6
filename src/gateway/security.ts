/**
 * What guards the gateway's edges (docs/security.md): API keys, model names,
 * request ids, the request head's size, and the decoding of msgpack bodies
 * and frames.
 *
 * API keys are compared as SHA-256 digests with crypto.timingSafeEqual: every
 * digest has the same length, so neither the key's length nor how much of it
 * matched shows in the time taken; every configured key is compared, so
 * neither does which key matched.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { Unpackr } from 'msgpackr';

// ------------------------------------------------------------------ API keys

/** The subprotocol prefix that carries an API key on /ws: `bearer.<base64url(key)>` (browsers cannot set headers there). */
export const WS_BEARER_PREFIX = 'bearer.';
/** The subprotocol the server answers when a client also offers it (and offers a key in another). */
export const WS_PROTOCOL = 'slabserve';

export type AuthResult = 'ok' | 'missing' | 'invalid';

export class ApiKeys {
  private readonly digests: Buffer[];

  constructor(keys: readonly string[]) {
    this.digests = keys.map(digest);
  }

  /** Whether keys are required at all (none configured: every request is let in). */
  get enabled(): boolean {
    return this.digests.length > 0;
  }

  /** Whether `token` is one of the keys, in time independent of the keys' lengths and contents. */
  matches(token: string): boolean {
    const d = digest(token);
    let found = 0;
    for (const k of this.digests) found |= timingSafeEqual(d, k) ? 1 : 0;
    return found === 1;
  }

  /** Checks an `Authorization` header value: `Bearer <key>` (the scheme in any case). */
  authorize(header: string): AuthResult {
    if (!this.enabled) return 'ok';
    const token = bearerToken(header);
    if (token === null) return 'missing';
    return this.matches(token) ? 'ok' : 'invalid';
  }

  /**
   * Checks a WebSocket upgrade: the Authorization header, else a subprotocol
   * `bearer.<base64url(key)>` among those offered.
   */
  authorizeUpgrade(authorization: string, protocols: string): AuthResult {
    if (!this.enabled) return 'ok';
    if (authorization !== '') return this.authorize(authorization);
    const offered = protocolKey(protocols);
    if (offered === null) return 'missing';
    return this.matches(offered) ? 'ok' : 'invalid';
  }
}

function digest(s: string): Buffer {
  return createHash('sha256').update(s, 'utf8').digest();
}

/** The token of `Bearer <token>`, or null when the header is absent or another scheme. */
export function bearerToken(header: string): string | null {
  if (header.length < 8 || header.slice(0, 7).toLowerCase() !== 'bearer ') return null;
  const token = header.slice(7).trim();
  return token === '' ? null : token;
}

/** The API key in a `bearer.<base64url>` subprotocol, if one is offered. */
export function protocolKey(protocols: string): string | null {
  for (const p of protocols.split(',')) {
    const t = p.trim();
    if (t.startsWith(WS_BEARER_PREFIX) && t.length > WS_BEARER_PREFIX.length) return Buffer.from(t.slice(WS_BEARER_PREFIX.length), 'base64url').toString('utf8');
  }
  return null;
}

/**
 * The subprotocol to answer: `slabserve` if offered, else the first offered one
 * that is not a key ('' for none). Never a `bearer.` one: the key would travel
 * back in the answer (and proxies log answers).
 */
export function chooseProtocol(protocols: string): string {
  let first = '';
  for (const p of protocols.split(',')) {
    const t = p.trim();
    if (t === '' || t.startsWith(WS_BEARER_PREFIX)) continue;
    if (t === WS_PROTOCOL) return t;
    if (first === '') first = t;
  }
  return first;
}

/** The subprotocol that carries `key` (for clients: `new WebSocket(url, ['slabserve', wsKeyProtocol(key)])`). */
export function wsKeyProtocol(key: string): string {
  return WS_BEARER_PREFIX + Buffer.from(key, 'utf8').toString('base64url');
}

/**
 * Checks configured keys: non-empty, printable ASCII without spaces (what
 * every client can put in a header as is). Returns a problem, or null.
 */
export function apiKeyProblem(key: string): string | null {
  if (key.length === 0) return 'an API key must not be empty';
  if (/[^\x21-\x7e]/.test(key)) return 'an API key must be printable ASCII, without spaces or control characters';
  if (key.length > 4096) return 'an API key must be at most 4096 characters';
  return null;
}

// ------------------------------------------------------------------ model names

// The rule and its check live with the model folders (src/shared/model-format/model-config.ts): a folder is a model's name.
export { checkModelName, isValidModelName } from '../shared/model-format/model-config.js';

/** A client-sent string for a message: JSON-quoted, at most 64 characters. */
export function shown(s: string): string {
  return JSON.stringify(s.length > 64 ? `${s.slice(0, 64)}...` : s);
}

// ------------------------------------------------------------------ request ids

const REQUEST_ID = /^[A-Za-z0-9._:@/+=-]{1,128}$/;
/** Random per thread (and process): ids from different gateway threads never collide. */
const ID_PREFIX = randomBytes(6).toString('hex');
let idCounter = 0;

/** The client's x-request-id when it is sane (1-128 of [A-Za-z0-9._:@/+=-]), else a new one. */
export function requestId(given: string): string {
  if (given !== '' && REQUEST_ID.test(given)) return given;
  return `${ID_PREFIX}-${(++idCounter).toString(36)}`;
}

// ------------------------------------------------------------------ msgpack

/**
 * The one msgpack decoder for request bodies and frames: no structured-clone
 * references (so no cycles), no records, 64-bit integers as numbers (never
 * BigInt, which JSON.stringify and zod's number checks cannot take). Keys
 * named `__proto__` are renamed by msgpackr, so a map never sets a prototype.
 */
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, structuredClone: false, int64AsType: 'number' });

export function decodeMsgpack(bytes: Uint8Array): unknown {
  return unpackr.unpack(bytes);
}
