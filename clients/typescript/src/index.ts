/**
 * The browser entry (also fine for any platform with a global `WebSocket`, `fetch` and
 * WebCrypto: Node ≥ 22, Deno, Bun). Imports nothing from Node; `npm run build` bundles it
 * into the single file `dist/browser/hongbao-client.js`. `wss://` and `https://` work as
 * the platform's WebSocket and `fetch` do: trusting the CAs the browser trusts.
 */

import { connectUsing } from "./connect.js";
import { platformSocket } from "./socket.js";

export * from "./api.js";

/** Connects and logs in; see `ConnectOptions`. */
export const connect = connectUsing({
  sockets: () => platformSocket,
  // Asked at every connect, whichever the transport.
  fetch: (options) => {
    if (options.ca !== undefined) {
      throw new TypeError("ca: Node only; a browser trusts the CAs the browser (or its system) trusts");
    }
    return undefined;
  },
});
