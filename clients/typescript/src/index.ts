/**
 * The browser entry (also fine for any platform with a global `WebSocket`, `fetch` and
 * WebCrypto: Node ≥ 22, Deno, Bun). Imports nothing from Node; `npm run build` bundles it
 * into the single file `dist/browser/hongbao-client.js`.
 */

import { connectUsing } from "./connect.js";
import { platformSocket } from "./socket.js";

export * from "./api.js";

/** Connects and logs in; see `ConnectOptions`. */
export const connect = connectUsing(() => platformSocket);
