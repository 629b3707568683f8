/**
 * The client's one error type: a kind to branch on, and where the trouble came from.
 *
 * Only what is not an answer from the server is an error. An answer — `nothing`,
 * `insufficient-funds`, `overloaded`, even the server's `error` reply — is a result
 * (see `results.ts`); a request rejects with a {@link HongbaoError} when no answer came.
 */

export type HongbaoErrorKind =
  /** No answer within the request's time: the outcome is unknown. */
  | "timeout"
  /** The connection went while a shake or chat was in flight (they are not retried): its outcome is unknown. */
  | "connection-lost"
  /** The login token was refused; the client does not reconnect. */
  | "bad-token"
  /** The same user logged in on another connection (kick `replaced`); the client does not reconnect. */
  | "replaced"
  /** The session's token ended with no fresh one (kick `expired`); the client does not reconnect. */
  | "expired"
  /** The user's tokens were revoked, or their key removed (kick `revoked`); the client does not reconnect. */
  | "revoked"
  /**
   * TLS cannot be agreed with the server, and trying again would not change that: its
   * certificate is not trusted (the `ca` option names the CA to trust) or names another
   * host, the handshake was refused, or a `ws://`/`http://` URL points at a port that
   * speaks TLS. The client does not reconnect.
   */
  | "tls"
  /** The client was closed (by `close()`, or after `bad-token`, `replaced`, `expired`, `revoked`, `tls`). */
  | "closed"
  /** More requests waiting for a connection than `maxQueued`. */
  | "queue-full"
  /** The server sent something that is not the protocol. */
  | "protocol";

/** Where it came from: the server's answer, the network, or this client itself. */
export type ErrorSource = "server" | "network" | "client";

export class HongbaoError extends Error {
  readonly kind: HongbaoErrorKind;
  readonly source: ErrorSource;
  /** For a send: the idempotency key to retry it with, so that money moves once. */
  idempotencyKey?: string;

  constructor(kind: HongbaoErrorKind, source: ErrorSource, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "HongbaoError";
    this.kind = kind;
    this.source = source;
  }
}
