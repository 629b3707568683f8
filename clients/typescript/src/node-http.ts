/**
 * HTTP API calls over `node:https` for a client given a CA to trust (`ca`): Node's global
 * `fetch` (undici) takes no CA of its own without undici's `Agent`, which Node does not
 * export, and the package has no runtime dependencies. Only the Node entry imports it.
 *
 * It does what the client asks of `fetch` and no more: a method, headers, a string body,
 * an abort signal; the status, headers and text of the answer. One keep-alive agent per
 * client, offering ALPN `http/1.1` as the gateway's HTTP listener says; the certificate
 * must name the URL's host or IP address. `http://` URLs go to the platform's `fetch`.
 */

import * as https from "node:https";

import type { HttpAnswerLike, HttpFetch, HttpInit } from "./client.js";
import { tlsCa, type TrustedCa } from "./node-ws.js";

/** A `fetch` that trusts `ca` for `https://`. */
export function nodeHttpsFetch(ca: TrustedCa, plain: HttpFetch): HttpFetch {
  const agent = new https.Agent({ ca: tlsCa(ca), keepAlive: true, ALPNProtocols: ["http/1.1"] });
  return (url, init) => (new URL(url).protocol === "https:" ? request(agent, url, init) : plain(url, init));
}

function request(agent: https.Agent, url: string, init: HttpInit): Promise<HttpAnswerLike> {
  return new Promise((resolve, reject) => {
    const signal = init.signal;
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const req = https.request(url, { method: init.method, headers: init.headers, agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (chunk: Buffer) => chunks.push(chunk));
      res.on("end", () => {
        signal?.removeEventListener("abort", onAbort);
        const text = Buffer.concat(chunks).toString("utf8");
        resolve({
          status: res.statusCode ?? 0,
          headers: { get: (name) => headerOf(res.headers[name.toLowerCase()]) },
          text: async () => text,
        });
      });
      res.on("error", fail);
    });
    function fail(e: unknown): void {
      signal?.removeEventListener("abort", onAbort);
      reject(e);
    }
    // The signal's reason (a `TimeoutError` from `AbortSignal.timeout`) is what the client
    // reads the timeout from, as with `fetch`.
    function onAbort(): void {
      req.destroy();
      fail(signal!.reason);
    }
    signal?.addEventListener("abort", onAbort, { once: true });
    req.on("error", fail);
    req.end(init.body);
  });
}

function headerOf(value: string | string[] | undefined): string | null {
  if (value === undefined) return null;
  return Array.isArray(value) ? value.join(", ") : value;
}
