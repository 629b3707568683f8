/**
 * Telling a TLS failure that no retry mends from a lost connection, which a retry does.
 *
 * A server whose certificate this client does not trust (or that names another host), a
 * handshake the server refuses (no common ALPN name or version), a plain `ws://` or
 * `http://` client at a port that speaks TLS: trying again gives the same answer, so the
 * client stops and says why (`HongbaoError` kind `tls`) instead of backing off until its
 * connect timeout. Everything else — a reset, a refused connection, a handshake cut off
 * halfway — stays a lost connection, retried as before.
 *
 * No platform imports: Node's errors (node:tls, node:https, undici's fetch, which wraps
 * them as `cause`) are read by their `code`; a browser's WebSocket and fetch say nothing
 * of why they failed, so there a TLS failure looks like a lost connection.
 */

/**
 * OpenSSL's certificate verification results, as Node names them in `error.code`: the
 * certificate is not trusted, not valid now, or not for this host.
 */
const CERTIFICATE_CODES = new Set([
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_DECRYPT_CERT_SIGNATURE",
  "UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY",
  "CERT_SIGNATURE_FAILURE",
  "CERT_NOT_YET_VALID",
  "CERT_HAS_EXPIRED",
  "ERROR_IN_CERT_NOT_BEFORE_FIELD",
  "ERROR_IN_CERT_NOT_AFTER_FIELD",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "CERT_CHAIN_TOO_LONG",
  "CERT_REVOKED",
  "INVALID_CA",
  "PATH_LENGTH_EXCEEDED",
  "INVALID_PURPOSE",
  "CERT_UNTRUSTED",
  "CERT_REJECTED",
  "HOSTNAME_MISMATCH",
  "ERR_TLS_CERT_ALTNAME_INVALID",
]);

/**
 * Whether `bytes` begin with a TLS alert record (type 21, version 3.x): what a TLS server
 * answers a client that does not speak TLS, before it closes. No hongbao frame and no
 * HTTP answer begins so (a frame's length prefix starts with 0x00).
 */
export function isTlsAlert(bytes: ArrayLike<number> | string): boolean {
  if (typeof bytes === "string") return bytes.length >= 2 && bytes.charCodeAt(0) === 0x15 && bytes.charCodeAt(1) === 0x03;
  return bytes.length >= 2 && bytes[0] === 0x15 && bytes[1] === 0x03;
}

/** Why a plain client failed at a TLS port; `scheme` is the one to use instead (`wss://`, `https://`). */
export function plainAtTlsPort(scheme: string): string {
  return `the server answered with a TLS alert: it speaks TLS on this address (use ${scheme})`;
}

/**
 * Why `error` (or an error in its `cause` chain) is a TLS failure a retry cannot mend, in
 * words; undefined when it is not one. `scheme` is named in the words for a plain client
 * that reached a TLS port.
 */
export function tlsFailureOf(error: unknown, scheme: string): string | undefined {
  let e: unknown = error;
  for (let depth = 0; depth < 4 && e !== null && typeof e === "object"; depth++) {
    const { code, message, reason } = e as { code?: unknown; message?: unknown; reason?: unknown };
    if (typeof code === "string") {
      const what = typeof reason === "string" && reason !== "" ? reason : firstLine(message);
      if (CERTIFICATE_CODES.has(code)) {
        return `the server's certificate is not trusted (${code}: ${what}); the CA that signed it goes in the \`ca\` option`;
      }
      if (/^ERR_(SSL|TLS)_/.test(code)) return `the TLS handshake failed (${code}: ${what})`;
      // node:https reports OpenSSL's refusal on its write path as a system error.
      const openssl = code === "EPROTO" && typeof message === "string" ? /SSL routines:[^:]*:([^:]+)/.exec(message) : null;
      if (openssl) return `the TLS handshake failed (${code}: ${openssl[1]})`;
      if (code === "HPE_INVALID_CONSTANT") {
        // The answer is not HTTP: undici keeps the bytes it choked on in `data`, node:http
        // in `rawPacket`.
        const { data, rawPacket } = e as { data?: unknown; rawPacket?: unknown };
        const got = data ?? rawPacket;
        if ((typeof got === "string" || got instanceof Uint8Array) && isTlsAlert(got)) return plainAtTlsPort(scheme);
      }
    }
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

function firstLine(message: unknown): string {
  return typeof message === "string" ? (message.split("\n")[0] ?? "") : "";
}
