/**
 * Login tokens, as `crates/proto/src/token.rs` makes them: HMAC-SHA256(secret, the user
 * id written as decimal ASCII), 32 bytes, passed around as 64 lowercase hex characters.
 *
 * Uses WebCrypto (`crypto.subtle`), which browsers (in secure contexts: https, or
 * http://localhost / 127.0.0.1) and Node ≥ 18 provide. Only whoever holds the server's
 * secret can mint tokens: this is for development, tests and load generation, not for
 * a browser in production (its app server hands tokens out instead).
 */

import { hex } from "./json.js";
import { toU64 } from "./numbers.js";
import { platformCrypto } from "./platform.js";

/** The secret `hongbao serve` uses when none is given; for development only. */
export const DEV_SECRET = "hongbao-dev-secret";

/** The 32-byte token of `userId` under `secret`. */
export async function tokenBytes(secret: string | Uint8Array, userId: bigint | number): Promise<Uint8Array> {
  const subtle = platformCrypto().subtle;
  if (!subtle) throw new Error("making a token: crypto.subtle is missing (a browser offers it only in secure contexts)");
  let key = typeof secret === "string" ? new TextEncoder().encode(secret) : new Uint8Array(secret);
  // WebCrypto refuses an empty HMAC key. HMAC pads a short key with zero bytes to the
  // hash's block size, so one zero byte is the same key and gives the same token.
  if (key.length === 0) key = new Uint8Array(1);
  const hmacKey = await subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const message = new TextEncoder().encode(toU64(userId, "userId").toString());
  return new Uint8Array(await subtle.sign("HMAC", hmacKey, message));
}

/** The token of `userId` as 64 lowercase hex characters (what `connect` takes). */
export async function devToken(secret: string | Uint8Array, userId: bigint | number): Promise<string> {
  return hex(await tokenBytes(secret, userId));
}
