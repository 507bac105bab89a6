/**
 * API keys on the client side (docs/security.md): the checks the server makes
 * of a key, and the `bearer.<base64url(key)>` WebSocket subprotocol that
 * carries one where headers cannot be set (browsers). Kept free of Node APIs
 * (no Buffer) so browser bundles can use it.
 */

/** The subprotocol prefix that carries an API key on /ws (src/gateway/security.ts WS_BEARER_PREFIX). */
export const WS_BEARER_PREFIX = 'bearer.';
/** The subprotocol the server answers when offered (never the one carrying the key). */
export const WS_PROTOCOL = 'slabserve';

/**
 * Throws a TypeError unless `key` is a key the server could accept: non-empty,
 * printable ASCII without spaces, at most 4096 characters (what the server
 * requires of its keys, and what every client can put in a header as is).
 */
export function checkApiKey(key: unknown): string {
  if (typeof key !== 'string' || key.length === 0) throw new TypeError('apiKey must be a non-empty string');
  if (/[^\x21-\x7e]/.test(key)) throw new TypeError('apiKey must be printable ASCII, without spaces or control characters');
  if (key.length > 4096) throw new TypeError('apiKey must be at most 4096 characters');
  return key;
}

/** `Authorization` header value for `key`. */
export function bearerHeader(key: string): string {
  return `Bearer ${key}`;
}

/**
 * The subprotocol that carries `key`: `bearer.` + base64url(UTF-8 of key), no
 * padding (byte for byte what the server's wsKeyProtocol makes and protocolKey reads).
 */
export function wsKeyProtocol(key: string): string {
  const bytes = new TextEncoder().encode(key);
  let binary = '';
  for (const b of bytes) binary += String.fromCharCode(b);
  return WS_BEARER_PREFIX + btoa(binary).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}
