/**
 * The HTTP transport (docs/http-api.md): every request proves its user with a bearer
 * token (`Authorization: Bearer <JWT>`), so there is no connection to keep and nothing
 * to log in to. `start()` checks the token with `GET /v1/notices` and announces what it
 * lists — HTTP clients get no pushes, so notices come from there (at start, from
 * `notices()`, and every `pollNoticesMs` if set) and `chat`, `broadcast`, `kick` and
 * `refresh` events never come. A token near its `exp` is swapped for a fresh one from the
 * `refresh` option before a request (`credentials.ts`); a refused one (401: forged,
 * expired, revoked) ends the client at start, and is a `refused` answer with code
 * `bad-token` after.
 *
 * A call that cannot reach the server is tried again, after a back-off, only where that
 * is safe: a send (with its `Idempotency-Key`), an open, a read. The state goes
 * `reconnecting` while calls fail and `open` again at the next answer. A TLS failure no
 * retry mends (an untrusted certificate, `http://` at a TLS port) closes the client: the
 * call rejects with kind `tls`, later ones with `closed`.
 */

import { Backoff } from "./backoff.js";
import { Client, type Settings } from "./client.js";
import { sleepOn } from "./clock.js";
import { HongbaoError } from "./errors.js";
import {
  chatFromHttp,
  openFromHttp,
  sendFromHttp,
  shakeFromHttp,
  type ChatResult,
  type OpenResult,
  type PingResult,
  type SendResult,
  type ShakeResult,
} from "./results.js";

export class HttpClient extends Client {
  readonly transport = "http" as const;
  private pollTimer: ReturnType<typeof setInterval> | undefined;

  constructor(settings: Settings, noticeMemory: number) {
    super(settings, noticeMemory);
  }

  /** Checks the token (and reads my notices), retrying an unreachable server until `connectTimeoutMs`. */
  async start(): Promise<void> {
    const clock = this.settings.clock;
    const deadline = clock.nowMs() + this.settings.connectTimeoutMs;
    const backoff = new Backoff(this.settings.reconnectBaseMs, this.settings.reconnectMaxMs, this.settings.random);
    for (;;) {
      let serverAskedMs: number | undefined;
      let limitMs: number | undefined;
      try {
        const answer = await this.http("GET", "/v1/notices", { idempotent: true });
        // `unavailable` (503) or `rate-limited` (429): after the wait the server names
        // (a hint: ½× to 1½× of it), the whole of it for a per-user limit.
        serverAskedMs = answer.retryAfterMs;
        if (answer.status === 429) limitMs = answer.retryAfterMs;
        if (answer.status === 401) {
          const why = answer.body.has("error") ? `: ${answer.body.string("error")}` : "";
          this.setState("closed", "token refused");
          throw new HongbaoError("bad-token", "server", `${this.whoseToken()} was refused${why}`);
        }
        if (answer.status === 200) break;
      } catch (e) {
        if (!(e instanceof HongbaoError) || e.kind !== "timeout" || clock.nowMs() >= deadline) throw e;
      }
      if (clock.nowMs() >= deadline) throw new HongbaoError("timeout", "network", `no answer within ${this.settings.connectTimeoutMs} ms`);
      await sleepOn(clock, Math.min(Math.max(0, deadline - clock.nowMs()), backoff.next(serverAskedMs, limitMs)));
    }
    if (this.userId === 0n) {
      // A token whose user this client cannot read: the server names it.
      const me = await this.me();
      if (me.result === "ok") this.credentials.userId = me.userId;
    }
    this.setState("open", "token accepted");
    await this.notices();
    if (this.settings.pollNoticesMs > 0) {
      this.pollTimer = setInterval(() => {
        this.notices().catch(() => {});
      }, this.settings.pollNoticesMs);
    }
  }

  async ping(): Promise<PingResult> {
    const startedMs = performance.now();
    const answer = await this.http("GET", "/v1/ping", { idempotent: true });
    const rttMs = performance.now() - startedMs;
    if (answer.status === 200) return { result: "ok", rttMs, serverTimeUs: answer.body.u64("server_time_us") };
    return { result: "unavailable" };
  }

  async close(): Promise<void> {
    clearInterval(this.pollTimer);
    this.setState("closed", "closed by the client");
  }

  async setToken(token: string): Promise<void> {
    if (this.state === "closed") throw new HongbaoError("closed", "client", "the client is closed");
    this.credentials.token = token;
  }

  protected async shakeOnce(): Promise<ShakeResult> {
    return shakeFromHttp(await this.http("POST", "/v1/shake", { idempotent: false }));
  }

  protected async sendOnce(amountCents: bigint, shares: number, recipients: bigint[], key: string): Promise<SendResult> {
    const answer = await this.http("POST", "/v1/packets", {
      body: { amount_cents: amountCents, shares, recipients },
      headers: { "Idempotency-Key": key },
      idempotent: true,
    });
    return sendFromHttp(answer, key);
  }

  protected async openOnce(packetId: bigint): Promise<OpenResult> {
    return openFromHttp(await this.http("POST", `/v1/packets/${packetId}/open`, { idempotent: true }), packetId);
  }

  protected async chatOnce(toUser: bigint, text: string): Promise<ChatResult> {
    return chatFromHttp(await this.http("POST", "/v1/chat", { body: { to_user: toUser, text }, idempotent: false }));
  }

  protected override tlsFailed(error: HongbaoError): void {
    clearInterval(this.pollTimer);
    this.setState("closed", error.message);
  }

  protected override httpFailed(error: Error): void {
    if (this.state === "open") this.setState("reconnecting", `the server could not be reached: ${error.message}`);
  }

  protected override httpAnswered(): void {
    if (this.state === "reconnecting") this.setState("open", "the server answers again");
  }
}
