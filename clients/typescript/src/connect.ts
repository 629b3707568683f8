/**
 * `connect()`, built once per entry around that platform's WebSocket and `fetch`: the
 * URL's scheme picks the transport.
 */

import { settingsOf, type Client, type ConnectOptions, type HttpFetch } from "./client.js";
import type { ClientEvents, Listener } from "./events.js";
import { HttpClient } from "./http-client.js";
import type { SocketFactory } from "./socket.js";
import { WsClient } from "./ws-client.js";

export type Connect = (options: ConnectOptions) => Promise<Client>;

/** What an entry brings, asked at each connect with its options and URL. */
export interface Platform {
  /** The WebSockets to make for this URL. */
  sockets(url: URL, options: ConnectOptions): SocketFactory;
  /** The `fetch` for HTTP calls, when not the global one (and not `options.fetch`). */
  fetch?(options: ConnectOptions): HttpFetch | undefined;
}

/** `connect` over `platform`'s WebSockets and `fetch`. */
export function connectUsing(platform: Platform): Connect {
  return async (options) => {
    const url = new URL(options.url);
    const settings = settingsOf(options, url, platform.fetch?.(options));
    const noticeMemory = options.noticeMemory ?? 10_000;
    switch (url.protocol) {
      case "ws:":
      case "wss:": {
        if (url.pathname === "/" || url.pathname === "") url.pathname = "/ws";
        const sockets = platform.sockets(url, options);
        const client = new WsClient(settings, noticeMemory, url.toString(), options.form ?? "binary", sockets);
        listen(client, options);
        await client.start();
        return client;
      }
      case "http:":
      case "https:": {
        const client = new HttpClient(settings, noticeMemory);
        listen(client, options);
        await client.start();
        return client;
      }
      default:
        throw new TypeError(`url: ws://, wss://, http:// or https://, not ${url.protocol}`);
    }
  };
}

function listen(client: Client, options: ConnectOptions): void {
  for (const [event, listener] of Object.entries(options.on ?? {})) {
    if (listener) client.on(event as keyof ClientEvents, listener as Listener<unknown>);
  }
}
