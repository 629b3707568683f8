/**
 * The client: one API over both transports. `connect()` reads the URL — `ws://` or
 * `wss://` gives a {@link WsClient} (binary frames, or the JSON form), `http://` or
 * `https://` an {@link HttpClient} (the HTTP API) — and resolves once the user is logged
 * in (over HTTP: once the token has been accepted).
 *
 * The login token is a JWT from the app server; a session lasts as long as its token,
 * and the `refresh` option is how it outlives it (`credentials.ts`): asked for a fresh
 * token when the server pushes `refresh` (WebSocket) or before an HTTP request near the
 * token's end.
 *
 * What both share lives here: argument checks, idempotency keys, the shake gate, the
 * memory of announced packets, events, and HTTP calls (a WebSocket client reads `me()`
 * and `notices()` over HTTP from the same gateway: the protocol has no request for them).
 *
 * The rules, whichever transport:
 * - Every `send` carries an idempotency key (made here unless given), and a send whose
 *   answer was lost is sent again with the same key — after a reconnect, or over HTTP
 *   after a failed connection — so the money moves once. Opens are retried as they are
 *   (opening is idempotent). Shakes and chats are not retried: a lost one rejects with
 *   `connection-lost`.
 * - After an `overloaded` shake the client sends no shake until the server's
 *   `retry_after_ms` (or HTTP `Retry-After`), drawn from ½× to 1½×, has passed; a shake
 *   meanwhile is answered by the client itself (`heldBack: true`).
 * - A packet's notice is delivered once, however often the server repeats it.
 * - After a `rate-limited` shake the client holds shakes for exactly the wait the server
 *   named (the limit is the user's own: coming back early would be refused again).
 * - A TLS failure no retry mends (an untrusted certificate, a refused handshake, a plain
 *   URL at a TLS port: `tls-failure.ts`) ends the client with kind `tls`; it is not
 *   retried as a lost connection would be.
 */

import { Backoff, DEFAULT_RECONNECT_BASE_MS, DEFAULT_RECONNECT_CAP_MS, ShakeGate, type Random } from "./backoff.js";
import { platformClock, sleepOn, type Clock } from "./clock.js";
import { Credentials, type RefreshToken } from "./credentials.js";
import { HongbaoError } from "./errors.js";
import { Emitter, SeenPackets, type ClientEvents, type ClientState, type Listener } from "./events.js";
import { Fields, JsonFormError, parseJson, stringifyJson, type JsonValue } from "./json.js";
import { toU32, toU64, type U64Input } from "./numbers.js";
import { newIdempotencyKey } from "./platform.js";
import { MAX_RECIPIENTS, validIdempotencyKey } from "./protocol.js";
import { tlsFailureOf } from "./tls-failure.js";
import {
  meFromHttp,
  noticesFromHttp,
  type ChatResult,
  type HttpAnswer,
  type MeResult,
  type OpenResult,
  type PacketNotice,
  type PingResult,
  type SendResult,
  type ShakeResult,
} from "./results.js";

export interface ConnectOptions {
  /** `ws://host:port` (the path defaults to `/ws`), `wss://…`, `http://host:port` or `https://…`. */
  url: string;
  /**
   * The login token: a JWT (its compact form) from the app server — or, in development
   * and tests, from `devToken`.
   */
  token: string;
  /** The user the token must name; left out (or 0): whoever the token names (`client.userId` says who). */
  userId?: U64Input;
  /**
   * How a session outlives its token: called with the user id when the server asks for a
   * fresh token (its `refresh` push, over WebSocket), before a reconnect whose token has
   * ended, and over HTTP before a request when the token is within `refreshBeforeMs` of
   * its `exp`. Resolves to a fresh JWT of the same user (an async function is fine), or to
   * null/undefined to let the session lapse (it is then kicked `expired`, and the client
   * closes). Without it a session ends with its token.
   */
  refresh?: RefreshToken;
  /** HTTP only: ask `refresh` this long before the token's `exp` (default 60 s). */
  refreshBeforeMs?: number;
  /** WebSocket only: binary frames (default) or the JSON form in text messages. */
  form?: "binary" | "json";
  /** How long a request may wait for its answer, reconnects included (default 10 s). */
  requestTimeoutMs?: number;
  /** How long `connect()` may take before it gives up (default 15 s). */
  connectTimeoutMs?: number;
  /**
   * Reconnect back-off, full jitter: after n failed attempts in a row the wait is drawn
   * from [0, min(maxMs, baseMs × 2^n)) (500 ms, 30 s); where the server names when to come
   * back (a kick's `retry_after_ms`, a refused upgrade's `Retry-After`), from ½× to 1½× of
   * that instead, and the count stays. A login resets it.
   */
  reconnect?: { baseMs?: number; maxMs?: number };
  /**
   * WebSocket only: how long one connection attempt may take, from dialing to the login's
   * answer (default 10 s). A server whose accept queue is full does not answer at all;
   * past this the attempt has failed and the back-off picks the next.
   */
  dialTimeoutMs?: number;
  /** WebSocket only: ping this often to find a dead connection; 0 never (default 30 s). */
  keepAliveMs?: number;
  /** Requests that may wait for a connection at once (default 1000). */
  maxQueued?: number;
  /** Packet ids remembered to drop repeated notices (default 10,000). */
  noticeMemory?: number;
  /** HTTP only: poll `GET /v1/notices` this often for `packet-notice` events; 0 never (default). */
  pollNoticesMs?: number;
  /** Where `me()` and `notices()` go for a WebSocket client (default: the same host over http(s)). */
  httpUrl?: string;
  /** The random source for jitter (tests pin it). */
  random?: Random;
  /** The clock and timers waits run on (tests simulate it); default the platform's. */
  clock?: Clock;
  /**
   * Node only: the CA to trust for `wss://` and `https://` (PEM text, or its bytes; a list
   * for several), instead of Node's own list — a private CA, or a test's throwaway one.
   * The server's certificate must still name the URL's host or IP address. A browser
   * trusts what the browser trusts: there `ca` is refused (`TypeError`).
   */
  ca?: string | Uint8Array | (string | Uint8Array)[];
  /** The `fetch` to use (default: the global one; in Node with `ca`, one over `node:https` that trusts it). */
  fetch?: typeof fetch;
  /**
   * Listeners registered before the first login, so that nothing pushed at login (the
   * notices of packets sent while I was offline) comes before anyone listens.
   */
  on?: { [K in keyof ClientEvents]?: Listener<ClientEvents[K]> };
}

export interface SendRequest {
  amountCents: U64Input;
  shares: number;
  recipients: U64Input[];
  /** 1 to 64 characters of printable ASCII; a random UUID unless given. */
  idempotencyKey?: string;
}

/** What the client hands `fetch`. */
export interface HttpInit {
  method: string;
  headers: Record<string, string>;
  body?: string | undefined;
  signal?: AbortSignal;
}

/** What the client reads of an answer: the part of `Response` it uses. */
export interface HttpAnswerLike {
  status: number;
  headers: { get(name: string): string | null };
  text(): Promise<string>;
}

/** The part of `fetch` the client uses: the global one fits, and so does `node-http.ts`'s. */
export type HttpFetch = (url: string, init: HttpInit) => Promise<HttpAnswerLike>;

/** Options after defaults, as the transports read them. */
export interface Settings {
  credentials: Credentials;
  requestTimeoutMs: number;
  connectTimeoutMs: number;
  dialTimeoutMs: number;
  reconnectBaseMs: number;
  reconnectMaxMs: number;
  keepAliveMs: number;
  maxQueued: number;
  pollNoticesMs: number;
  httpBase: string;
  random: Random;
  clock: Clock;
  fetch: HttpFetch;
}

/** What the transports have in common; see the module header for the rules. */
export abstract class Client {
  abstract readonly transport: "websocket" | "http";
  protected readonly settings: Settings;
  protected readonly credentials: Credentials;
  protected readonly events = new Emitter<ClientEvents>();
  protected readonly gate: ShakeGate;
  private readonly seen: SeenPackets;
  private current: ClientState = "connecting";

  protected constructor(settings: Settings, noticeMemory: number) {
    this.settings = settings;
    this.credentials = settings.credentials;
    this.gate = new ShakeGate(settings.random);
    this.seen = new SeenPackets(noticeMemory);
  }

  get state(): ClientState {
    return this.current;
  }

  /**
   * The user: as given to `connect`, else the one the token names (as the server named
   * it at login); 0 only while neither the caller nor the token has said.
   */
  get userId(): bigint {
    return this.credentials.userId;
  }

  /** The token the next login (or HTTP request) uses: the last fresh one the server took. */
  get token(): string {
    return this.credentials.token;
  }

  /**
   * Swaps in a fresh token now, without waiting for the server's `refresh`. Over
   * WebSocket the client logs in again with it on the live connection (rejects with
   * `bad-token` if the server refuses it: the session keeps its old token); over HTTP the
   * next requests carry it. Either way later logins use it.
   */
  abstract setToken(token: string): Promise<void>;

  /** Listens to `packet-notice`, `chat`, `broadcast`, `kick`, `refresh` or `state`; returns the unsubscribe. */
  on<K extends keyof ClientEvents>(event: K, listener: Listener<ClientEvents[K]>): () => void {
    return this.events.on(event, listener);
  }

  off<K extends keyof ClientEvents>(event: K, listener: Listener<ClientEvents[K]>): void {
    this.events.off(event, listener);
  }

  /** Milliseconds before a shake goes to the server again (after `overloaded`); 0: now. */
  shakeHeldForMs(): number {
    return this.gate.heldForMs(this.settings.clock.nowMs());
  }

  /** Tries to win a share of the running shake campaign. */
  async shake(): Promise<ShakeResult> {
    const now = () => this.settings.clock.nowMs();
    const held = this.gate.heldForMs(now());
    if (held > 0) {
      return this.gate.heldBy === "rate-limited"
        ? { result: "rate-limited", retryAfterMs: held, heldBack: true, text: "" }
        : { result: "overloaded", retryAfterMs: held, heldBack: true };
    }
    const result = await this.shakeOnce();
    if (result.result === "overloaded") this.gate.overloaded(result.retryAfterMs, now());
    if (result.result === "rate-limited") this.gate.rateLimited(result.retryAfterMs, now());
    return result;
  }

  /**
   * Sends `amountCents` from my balance in `shares` shares for `recipients`. Rejects
   * (with the key on the error) only when no answer came in time: send again with the
   * same `idempotencyKey` and the money still moves once.
   */
  async send(request: SendRequest): Promise<SendResult> {
    const amountCents = toU64(request.amountCents, "amountCents");
    const shares = toU32(request.shares, "shares");
    if (!Array.isArray(request.recipients) || request.recipients.length > MAX_RECIPIENTS) {
      throw new RangeError(`recipients: a list of at most ${MAX_RECIPIENTS} user ids`);
    }
    const recipients = request.recipients.map((id) => toU64(id, "recipients"));
    const key = request.idempotencyKey ?? newIdempotencyKey();
    if (!validIdempotencyKey(key)) throw new RangeError("idempotencyKey: 1 to 64 characters of printable ASCII");
    try {
      return await this.sendOnce(amountCents, shares, recipients, key);
    } catch (e) {
      if (e instanceof HongbaoError) e.idempotencyKey = key;
      throw e;
    }
  }

  /** Opens (拆) my share of a packet; safe to repeat (`already-opened`, same amount). */
  open(packetId: U64Input): Promise<OpenResult> {
    return this.openOnce(toU64(packetId, "packetId"));
  }

  /** Routes `text` to `toUser`'s connection. */
  chat(toUser: U64Input, text: string): Promise<ChatResult> {
    if (typeof text !== "string") throw new TypeError("text: a string");
    return this.chatOnce(toU64(toUser, "toUser"), text);
  }

  /** My balance and newest ledger events, as committed (`GET /v1/me`). */
  async me(): Promise<MeResult> {
    return meFromHttp(await this.http("GET", "/v1/me", { idempotent: true }));
  }

  /**
   * The live packets naming me that I have not opened (`GET /v1/notices`), oldest first.
   * Each one not announced before is also delivered as a `packet-notice` event.
   */
  async notices(): Promise<PacketNotice[]> {
    const answer = await this.http("GET", "/v1/notices", { idempotent: true });
    if (answer.status !== 200) return [];
    const notices = noticesFromHttp(answer);
    for (const notice of notices) this.announce(notice);
    return notices;
  }

  /** Round trip to the server, and its clock. */
  abstract ping(): Promise<PingResult>;

  /** Closes for good: pending requests reject with `closed`, no reconnect. */
  abstract close(): Promise<void>;

  protected abstract shakeOnce(): Promise<ShakeResult>;
  protected abstract sendOnce(amountCents: bigint, shares: number, recipients: bigint[], key: string): Promise<SendResult>;
  protected abstract openOnce(packetId: bigint): Promise<OpenResult>;
  protected abstract chatOnce(toUser: bigint, text: string): Promise<ChatResult>;

  protected setState(state: ClientState, reason: string): void {
    if (state === this.current) return;
    this.current = state;
    this.events.emit("state", { state, reason });
  }

  /** Delivers a packet's notice, unless it was delivered before. */
  protected announce(notice: PacketNotice): void {
    if (this.seen.firstTime(notice.packetId)) this.events.emit("packet-notice", notice);
  }

  /** "user 42's token", or "the token" while the user is not known yet. */
  protected whoseToken(): string {
    return this.userId !== 0n ? `user ${this.userId}'s token` : "the token";
  }

  /** `Bearer <JWT>`, with a fresh token first when this one is near its end. */
  protected async bearer(): Promise<string> {
    return `Bearer ${await this.credentials.forRequest()}`;
  }

  /**
   * One HTTP API call, with the answer's JSON read exactly (bigints). A call that could
   * not reach the server is tried again after a back-off if `idempotent`, until the
   * request's time is up; otherwise it rejects with `connection-lost`.
   */
  protected async http(
    method: "GET" | "POST",
    path: string,
    options: { body?: JsonValue; headers?: Record<string, string>; idempotent: boolean },
  ): Promise<HttpAnswer> {
    const clock = this.settings.clock;
    const deadline = clock.nowMs() + this.settings.requestTimeoutMs;
    const headers: Record<string, string> = { Authorization: await this.bearer(), ...options.headers };
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    const body = options.body === undefined ? undefined : stringifyJson(options.body);
    const backoff = new Backoff(this.settings.reconnectBaseMs, this.settings.reconnectMaxMs, this.settings.random);
    for (;;) {
      if (this.current === "closed") throw new HongbaoError("closed", "client", "the client is closed");
      const left = deadline - clock.nowMs();
      if (left <= 0) throw new HongbaoError("timeout", "network", `${method} ${path}: no answer in ${this.settings.requestTimeoutMs} ms`);
      let response: HttpAnswerLike;
      let text: string;
      try {
        response = await this.settings.fetch(this.settings.httpBase + path, {
          method,
          headers,
          body,
          signal: AbortSignal.timeout(left),
        });
        text = await response.text();
      } catch (e) {
        const name = (e as Error).name;
        const tls = tlsFailureOf(e, "https://");
        if (tls !== undefined) {
          const error = new HongbaoError("tls", "network", `${method} ${path}: ${tls}`, { cause: e });
          this.tlsFailed(error);
          throw error;
        }
        if (name === "TimeoutError" || name === "AbortError") {
          throw new HongbaoError("timeout", "network", `${method} ${path}: no answer in ${this.settings.requestTimeoutMs} ms`, { cause: e });
        }
        if (!options.idempotent) {
          throw new HongbaoError("connection-lost", "network", `${method} ${path}: ${(e as Error).message}; its outcome is unknown`, { cause: e });
        }
        this.httpFailed(e as Error);
        await sleepOn(clock, Math.min(Math.max(0, deadline - clock.nowMs()), backoff.next()));
        continue;
      }
      this.httpAnswered();
      return { status: response.status, body: answerFields(text, response.status), retryAfterMs: retryAfterMs(response) };
    }
  }

  /** TLS with the HTTP API failed for good (the HTTP transport closes: no call would get through). */
  protected tlsFailed(_error: HongbaoError): void {}

  /** An HTTP call could not reach the server (the HTTP transport reports a state change). */
  protected httpFailed(_error: Error): void {}

  /** An HTTP call was answered. */
  protected httpAnswered(): void {}
}

/** The fields of an answer's JSON body; a body that is not a JSON object reads as a bad-request. */
function answerFields(text: string, status: number): Fields {
  try {
    const value = parseJson(text);
    if (value !== null && typeof value === "object" && !Array.isArray(value)) return new Fields(value);
  } catch (e) {
    if (!(e instanceof SyntaxError || e instanceof JsonFormError)) throw e;
  }
  return new Fields({ result: status >= 500 ? "unavailable" : "bad-request", error: `HTTP ${status}: ${text.slice(0, 200)}` });
}

function retryAfterMs(response: HttpAnswerLike): number | undefined {
  const header = response.headers.get("retry-after");
  if (header === null) return undefined;
  const secs = Number(header);
  return Number.isFinite(secs) && secs >= 0 ? secs * 1000 : undefined;
}

/** Options with their defaults filled in; `platformFetch` is the entry's (Node's with `ca`). */
export function settingsOf(options: ConnectOptions, url: URL, platformFetch?: HttpFetch): Settings {
  const globalFetch = (globalThis as { fetch?: typeof fetch }).fetch?.bind(globalThis);
  const fetchFn: HttpFetch | undefined = options.fetch?.bind(globalThis) ?? platformFetch ?? globalFetch;
  if (fetchFn === undefined) throw new Error("this platform has no fetch");
  if (typeof options.token !== "string" || options.token === "") {
    throw new TypeError("token: a JWT's compact form (a non-empty string)");
  }
  const userId = toU64(options.userId ?? 0, "userId");
  return {
    credentials: new Credentials(options.token, userId, options.refresh, options.refreshBeforeMs ?? 60_000),
    requestTimeoutMs: options.requestTimeoutMs ?? 10_000,
    connectTimeoutMs: options.connectTimeoutMs ?? 15_000,
    dialTimeoutMs: options.dialTimeoutMs ?? 10_000,
    reconnectBaseMs: options.reconnect?.baseMs ?? DEFAULT_RECONNECT_BASE_MS,
    reconnectMaxMs: options.reconnect?.maxMs ?? DEFAULT_RECONNECT_CAP_MS,
    keepAliveMs: options.keepAliveMs ?? 30_000,
    maxQueued: options.maxQueued ?? 1000,
    pollNoticesMs: options.pollNoticesMs ?? 0,
    httpBase: (options.httpUrl ?? httpBaseOf(url)).replace(/\/+$/, ""),
    random: options.random ?? Math.random,
    clock: options.clock ?? platformClock,
    fetch: fetchFn,
  };
}

/** `ws://h:p/ws` → `http://h:p`: the gateway's WebSocket address serves the HTTP API too. */
function httpBaseOf(url: URL): string {
  const scheme = url.protocol === "wss:" || url.protocol === "https:" ? "https:" : "http:";
  return `${scheme}//${url.host}`;
}

