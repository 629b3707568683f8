/**
 * The platform's crypto, found once: WebCrypto for tokens and random idempotency keys.
 * Browsers and Node ≥ 19 have a global `crypto`; the Node entry hands in
 * `node:crypto`'s `webcrypto` where the global is missing (Node 18).
 */

let platform: Crypto | undefined = (globalThis as { crypto?: Crypto }).crypto;

/** Use `crypto` (a WebCrypto `Crypto`) when the platform has no global one. */
export function useCrypto(crypto: Crypto): void {
  platform ??= crypto;
}

export function platformCrypto(): Crypto {
  if (platform === undefined) throw new Error("this platform has no WebCrypto (globalThis.crypto)");
  return platform;
}

/**
 * A fresh idempotency key: a random UUID (36 characters of printable ASCII). Falls back
 * to `getRandomValues` where `randomUUID` is missing (a browser page served over plain
 * http from a host other than localhost).
 */
export function newIdempotencyKey(): string {
  const crypto = platformCrypto();
  if (typeof crypto.randomUUID === "function") return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6]! & 0x0f) | 0x40;
  b[8] = (b[8]! & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}
