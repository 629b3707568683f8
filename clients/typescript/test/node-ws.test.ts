/**
 * The Node WebSocket client against a scripted RFC 6455 server on loopback: the
 * handshake and its accept check, masked client frames of each length form, fragmented
 * and control frames from the server, the closing handshake, a refused upgrade's status
 * and Retry-After, and a TLS alert for an answer (a plain client at a TLS port).
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import * as net from "node:net";
import { describe, test } from "node:test";

import { nodeSocket } from "../src/node-ws.js";
import type { CloseInfo } from "../src/socket.js";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/** A server frame (unmasked). */
function frame(op: number, payload: Buffer, fin = true): Buffer {
  const head =
    payload.length < 126
      ? Buffer.from([(fin ? 0x80 : 0) | op, payload.length])
      : Buffer.from([(fin ? 0x80 : 0) | op, 126, payload.length >> 8, payload.length & 0xff]);
  return Buffer.concat([head, payload]);
}

/** Reads the client's frames, checking each is masked; returns [op, payload] pairs. */
function clientFrames(buf: Buffer): { frames: [number, Buffer][]; rest: Buffer } {
  const frames: [number, Buffer][] = [];
  for (;;) {
    if (buf.length < 2) break;
    assert.ok(buf[1]! & 0x80, "client frames are masked");
    let len = buf[1]! & 0x7f;
    let at = 2;
    if (len === 126) {
      len = buf.readUInt16BE(2);
      at = 4;
    } else if (len === 127) {
      len = Number(buf.readBigUInt64BE(2));
      at = 10;
    }
    if (buf.length < at + 4 + len) break;
    const mask = buf.subarray(at, at + 4);
    const payload = Buffer.from(buf.subarray(at + 4, at + 4 + len).map((b, i) => b ^ mask[i & 3]!));
    frames.push([buf[0]! & 0x0f, payload]);
    buf = buf.subarray(at + 4 + len);
  }
  return { frames, rest: buf };
}

function serve(onConnection: (socket: net.Socket, head: string) => void): Promise<{ url: string; close(): void }> {
  const server = net.createServer((socket) => {
    let head = "";
    const onData = (chunk: Buffer) => {
      head += chunk.toString("latin1");
      if (!head.includes("\r\n\r\n")) return;
      socket.off("data", onData);
      onConnection(socket, head);
    };
    socket.on("data", onData);
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      resolve({ url: `ws://127.0.0.1:${port}/ws`, close: () => server.close() });
    }),
  );
}

describe("node-ws", () => {
  test("handshake, masking, fragments, ping, close", async () => {
    const fromClient: [number, Buffer][] = [];
    let closeEchoed: () => void;
    const echoed = new Promise<void>((r) => (closeEchoed = r));
    const server = await serve((socket, head) => {
      const key = /Sec-WebSocket-Key: (\S+)/i.exec(head)![1]!;
      assert.match(head, /^GET \/ws HTTP\/1\.1\r\n/);
      assert.match(head, /Sec-WebSocket-Version: 13/);
      const accept = createHash("sha1").update(key + GUID).digest("base64");
      socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`);
      let buf: Buffer = Buffer.alloc(0);
      socket.on("data", (chunk: Buffer) => {
        const { frames, rest } = clientFrames(Buffer.concat([buf, chunk]));
        buf = rest;
        for (const f of frames) {
          fromClient.push(f);
          if (f[0] === 0x1 && f[1].toString() === "go") {
            // A ping, a text message in three fragments (a ping between them), a 300-byte
            // binary message, then a close — in one write, split oddly by TCP or not.
            socket.write(
              Buffer.concat([
                frame(0x9, Buffer.from("hi")),
                frame(0x1, Buffer.from("新年"), false),
                frame(0x0, Buffer.from("快"), false),
                frame(0x9, Buffer.from("")),
                frame(0x0, Buffer.from("乐"), true),
                frame(0x2, Buffer.alloc(300, 7)),
                frame(0x8, Buffer.concat([Buffer.from([0x03, 0xf0]), Buffer.from("replaced")])),
              ]),
            );
          }
          if (f[0] === 0x8) {
            socket.end();
            closeEchoed();
          }
        }
      });
    });
    const messages: (string | Uint8Array)[] = [];
    const closed = await new Promise<CloseInfo>((resolve) => {
      const ws = nodeSocket(server.url, {
        open: () => {
          ws.send(new Uint8Array(200).fill(1)); // 16-bit length form
          ws.send("go");
        },
        message: (m) => messages.push(m),
        close: resolve,
      });
    });
    await echoed;
    server.close();
    assert.deepEqual(closed, { code: 1008, reason: "replaced" });
    assert.equal(messages[0], "新年快乐");
    assert.deepEqual(messages[1], new Uint8Array(300).fill(7));
    assert.equal(messages.length, 2);
    const ops = fromClient.map(([op]) => op);
    assert.deepEqual(ops, [0x2, 0x1, 0xa, 0xa, 0x8], "binary, text, two pongs, the close echo");
    assert.deepEqual(fromClient[0]![1], Buffer.alloc(200, 1));
    assert.equal(fromClient[2]![1].toString(), "hi", "a pong carries the ping's payload");
    assert.deepEqual(fromClient[4]![1], Buffer.from([0x03, 0xf0]), "the close echoes the code");
  });

  test("a refused upgrade reports its status and Retry-After", async () => {
    const server = await serve((socket) => {
      socket.end("HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nConnection: close\r\nContent-Length: 4\r\n\r\nbusy");
    });
    const info = await new Promise<CloseInfo>((resolve) => nodeSocket(server.url, { open: () => assert.fail("opened"), message: () => {}, close: resolve }));
    server.close();
    assert.equal(info.status, 503);
    assert.equal(info.retryAfterMs, 2000);
  });

  test("a wrong Sec-WebSocket-Accept is refused", async () => {
    const server = await serve((socket) => {
      socket.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: nope\r\n\r\n");
    });
    const info = await new Promise<CloseInfo>((resolve) => nodeSocket(server.url, { open: () => assert.fail("opened"), message: () => {}, close: resolve }));
    server.close();
    assert.equal(info.status, 101);
    assert.match(info.reason, /bad upgrade answer/);
  });

  test("a TLS alert answering the handshake (a TLS port) is reported as a TLS failure", async () => {
    // What rustls answers bytes that are not TLS: a fatal decode_error alert, then the close.
    const server = await serve((socket) => socket.end(Buffer.from([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32])));
    const info = await new Promise<CloseInfo>((resolve) => nodeSocket(server.url, { open: () => assert.fail("opened"), message: () => {}, close: resolve }));
    server.close();
    assert.equal(info.code, 1006);
    assert.match(info.tls ?? "", /speaks TLS on this address \(use wss:\/\/\)/);
  });
});
