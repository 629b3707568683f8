/**
 * Login tokens: JWTs (RFC 7519) in their compact form, `header.claims.signature`.
 *
 * In production an app server signs them and hands them to its users
 * (docs/protocol.md, "login"; `crates/proto/src/token.rs` is what the gateway checks);
 * this library only passes them on. {@link devToken} mints the kind a `hongbao serve`
 * with a shared secret accepts — HS256, header `kid` "hongbao", claims `sub` (the user id
 * as a decimal string), `exp` and `iat` — for development, tests and load generation:
 * whoever holds the secret can log in as anyone, so it has no place in an app's client.
 *
 * Uses WebCrypto (`crypto.subtle`), which browsers (in secure contexts: https, or
 * http://localhost / 127.0.0.1) and Node ≥ 18 provide (the Node entry hands in
 * `node:crypto`'s). {@link tokenClaims} reads a token's claims without checking its
 * signature (a client has no key to check it with): the client only wants to know whose
 * a token is and when it ends, to ask for a fresh one in time.
 */

import { toU64, type U64Input } from "./numbers.js";
import { platformCrypto } from "./platform.js";

/**
 * The secret `hongbao serve` uses when none is given (HONGBAO_SECRET, --secret): for
 * development only, and such a server listens on loopback only.
 */
export const DEV_SECRET = "hongbao-dev-secret";

/** The `kid` of the HS256 key a server makes of its secret when no `[[login_keys]]` are configured. */
export const DEFAULT_KID = "hongbao";

export interface DevTokenOptions {
  /** How long the token lives, in seconds (default 3600; the server refuses more than a day by default). */
  ttlSecs?: number;
  /** When it is issued, in Unix seconds (default: now). */
  nowSecs?: number;
  /** The key id in the header (default {@link DEFAULT_KID}). */
  kid?: string;
  /** An `aud` claim, for a server configured with an audience. */
  audience?: string;
}

/** What {@link tokenClaims} reads of a token (unverified). */
export interface TokenClaims {
  /** The user `sub` names, if it names one. */
  userId?: bigint;
  /** `exp` in Unix milliseconds, if present. */
  expiresAtMs?: number;
  /** Every claim, as the token's JSON has them. */
  raw: Record<string, unknown>;
}

/**
 * An HS256 JWT naming `userId`, signed with the server's `secret`: for development and
 * tests (production tokens come from the app server).
 */
export async function devToken(secret: string | Uint8Array, userId: U64Input, options: DevTokenOptions = {}): Promise<string> {
  const user = toU64(userId, "userId");
  if (user === 0n) throw new RangeError("userId: a token names a user above 0");
  const subtle = platformCrypto().subtle;
  if (!subtle) throw new Error("making a token: crypto.subtle is missing (a browser offers it only in secure contexts)");
  const issued = options.nowSecs ?? Math.floor(Date.now() / 1000);
  const header = { alg: "HS256", kid: options.kid ?? DEFAULT_KID, typ: "JWT" };
  // Keys in the order of the example in golden.txt and protocol.md: sub, exp, iat.
  const claims: Record<string, unknown> = { sub: user.toString(), exp: issued + (options.ttlSecs ?? 3600), iat: issued };
  if (options.audience !== undefined) claims["aud"] = options.audience;
  const signingInput = `${base64url(utf8.encode(JSON.stringify(header)))}.${base64url(utf8.encode(JSON.stringify(claims)))}`;
  let key = typeof secret === "string" ? utf8.encode(secret) : new Uint8Array(secret);
  // WebCrypto refuses an empty HMAC key. HMAC pads a short key with zero bytes to the
  // hash's block size, so one zero byte is the same key and gives the same signature.
  if (key.length === 0) key = new Uint8Array(1);
  const hmacKey = await subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const signature = new Uint8Array(await subtle.sign("HMAC", hmacKey, utf8.encode(signingInput)));
  return `${signingInput}.${base64url(signature)}`;
}

/** The claims of a JWT, unverified; undefined for anything that is not one. */
export function tokenClaims(token: string): TokenClaims | undefined {
  const parts = token.split(".");
  if (parts.length !== 3) return undefined;
  let raw: unknown;
  try {
    raw = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(unbase64url(parts[1]!)));
  } catch {
    return undefined;
  }
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) return undefined;
  const claims: TokenClaims = { raw: raw as Record<string, unknown> };
  const { sub, exp } = raw as { sub?: unknown; exp?: unknown };
  if (typeof sub === "string" && /^[1-9][0-9]{0,19}$/.test(sub) && BigInt(sub) < 1n << 64n) claims.userId = BigInt(sub);
  if (typeof exp === "number" && Number.isFinite(exp)) claims.expiresAtMs = exp * 1000;
  return claims;
}

const utf8 = new TextEncoder();
const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/** Base64url without padding (RFC 7515). */
export function base64url(bytes: Uint8Array): string {
  let out = "";
  for (let i = 0; i < bytes.length; i += 3) {
    const n = (bytes[i]! << 16) | ((bytes[i + 1] ?? 0) << 8) | (bytes[i + 2] ?? 0);
    const chars = Math.min(4, Math.ceil(((bytes.length - i) * 8) / 6));
    for (let c = 0; c < chars; c++) out += ALPHABET[(n >> (18 - 6 * c)) & 63];
  }
  return out;
}

/** Bytes of base64url text (padding allowed); throws a SyntaxError on anything else. */
export function unbase64url(text: string): Uint8Array {
  const s = text.replace(/=+$/, "");
  if (!/^[A-Za-z0-9_-]*$/.test(s) || s.length % 4 === 1) throw new SyntaxError("not base64url");
  const out = new Uint8Array(Math.floor((s.length * 6) / 8));
  let bits = 0;
  let value = 0;
  let at = 0;
  for (const ch of s) {
    // Fewer than 8 bits are pending before each character: keep those only.
    value = ((value & 0xff) << 6) | ALPHABET.indexOf(ch);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[at++] = (value >> bits) & 0xff;
    }
  }
  return out;
}
