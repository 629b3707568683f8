"""The HTTP transport against a scripted HTTP/1.1 server: keep-alive reuse, chunked
bodies, the bearer (a JWT, swapped for a fresh one near its end) and idempotency headers,
and the server's waits (`Retry-After`, `rate-limited`)."""

from __future__ import annotations

import asyncio
import json
import time
import unittest
from collections.abc import Callable
from typing import Any

import hongbao_client as hb
from hongbao_client.backoff import Backoff
from hongbao_client.messages import ResultCode

Answer = tuple[int, dict[str, str], Any]


class FakeHttpServer:
    """Reads requests (head + Content-Length body) and answers with `script(method, path,
    headers, body)`: a status, extra headers and a JSON body."""

    def __init__(self, script: Callable[[str, str, dict[str, str], Any], Answer]):
        self.script = script
        self.connections = 0
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.chunked = False

    async def __aenter__(self) -> FakeHttpServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                method, path, _ = head.split("\r\n")[0].split(" ")
                headers = {k.lower(): v.strip() for k, _, v in
                           (line.partition(":") for line in head.split("\r\n")[1:] if line)}
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                body = json.loads(raw) if raw else None
                self.requests.append((method, path, headers, body))
                status, extra, answer = self.script(method, path, headers, body)
                data = json.dumps(answer).encode()
                lines = [f"HTTP/1.1 {status} X", "Content-Type: application/json"]
                lines += [f"{k}: {v}" for k, v in extra.items()]
                if self.chunked:
                    lines.append("Transfer-Encoding: chunked")
                    half = len(data) // 2
                    payload = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (data[:half], data[half:]))
                    payload += b"0\r\n\r\n"
                else:
                    lines.append(f"Content-Length: {len(data)}")
                    payload = data
                writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


ME = {"result": "ok", "user": 7, "balance_cents": 500, "recent_events": []}


def client(server: FakeHttpServer, **kwargs: Any) -> hb.Client:
    kwargs.setdefault("backoff", Backoff(base_s=0.02, cap_s=0.2))
    return hb.connect(server.url, user_id=7, secret="s", **kwargs)


class HttpTransport(unittest.IsolatedAsyncioTestCase):
    async def test_requests_share_one_keep_alive_connection(self) -> None:
        def script(method: str, path: str, headers: dict[str, str], body: Any) -> Answer:
            if path == "/v1/packets":
                return 201, {}, {"result": "ok", "packet_id": 9, "balance_cents": 200}
            if path == "/v1/shake":
                return 200, {}, {"result": "won", "packet_id": 4, "amount_cents": 88}
            return 200, {}, ME

        for chunked in (False, True):
            async with FakeHttpServer(script) as server:
                server.chunked = chunked
                async with client(server) as c:
                    self.assertEqual(await c.shake(), hb.Shake(ResultCode.WON, 4, 88))
                    sent = await c.send(amount_cents=300, shares=2, recipients=[8, 9], idempotency_key="order-1")
                    self.assertEqual((sent.result, sent.packet_id, sent.balance_cents), (ResultCode.OK, 9, 200))
                    self.assertEqual((await c.me()).balance_cents, 500)
                self.assertEqual(server.connections, 1)
                method, path, headers, body = server.requests[2]
                self.assertEqual((method, path), ("POST", "/v1/packets"))
                self.assertEqual(headers["idempotency-key"], "order-1")
                self.assertEqual(headers["authorization"], f"Bearer {c.token}")
                self.assertEqual(hb.token_user(c.token), 7)
                self.assertEqual(body, {"amount_cents": 300, "shares": 2, "recipients": [8, 9]})

    async def test_429_without_a_body_wait_takes_retry_after(self) -> None:
        def script(method: str, path: str, headers: dict[str, str], body: Any) -> Answer:
            if path == "/v1/shake":
                return 429, {"Retry-After": "2"}, {"result": "overloaded", "packet_id": 0, "amount_cents": 0}
            return 200, {}, ME

        async with FakeHttpServer(script) as server, client(server) as c:
            shake = await c.shake()
            self.assertEqual((shake.result, shake.retry_after_ms), (ResultCode.OVERLOADED, 2000))
            self.assertGreaterEqual(c.shake_wait_s, 0.9)

    async def test_rate_limited_is_a_result_with_its_wait(self) -> None:
        def script(method: str, path: str, headers: dict[str, str], body: Any) -> Answer:
            if path == "/v1/packets":
                return 429, {"Retry-After": "1"}, {"result": "rate-limited", "error": "over 1 send a second",
                                                   "retry_after_ms": 700}
            if path == "/v1/chat":
                return 429, {"Retry-After": "2"}, {"result": "rate-limited", "error": "over 1 chat a second"}
            if path == "/v1/shake":
                return 429, {"Retry-After": "1"}, {"result": "rate-limited", "error": "slow down",
                                                   "retry_after_ms": 250}
            return 200, {}, ME

        async with FakeHttpServer(script) as server, client(server) as c:
            sent = await c.send(amount_cents=1, shares=1, recipients=[8], idempotency_key="k")
            said = await c.chat(8, "hi")
            shake = await c.shake()
            self.assertGreater(c.shake_wait_s, 0.2)
        self.assertEqual((sent.result, sent.retry_after_ms, sent.error),
                         (ResultCode.RATE_LIMITED, 700, "over 1 send a second"))
        self.assertEqual((said.result, said.retry_after_ms), (ResultCode.RATE_LIMITED, 2000))  # from Retry-After
        self.assertEqual((shake.result, shake.retry_after_ms), (ResultCode.RATE_LIMITED, 250))

    async def test_a_token_near_its_end_is_swapped_before_the_request(self) -> None:
        asked: list[int] = []

        async def fresh(user_id: int) -> str:
            asked.append(user_id)
            return hb.make_token("s", user_id, ttl_s=3600)

        def script(method: str, path: str, headers: dict[str, str], body: Any) -> Answer:
            return 200, {}, {"result": "ok", "server_time_us": 1} if path == "/v1/ping" else ME

        ending = hb.make_token("s", 7, ttl_s=20)  # inside the 60 s margin
        async with FakeHttpServer(script) as server, hb.connect(server.url, token=ending, refresh=fresh) as c:
            await c.ping()
            await c.me()
            fresh_token = c.token
            await c.set_token("set.by.the-app")
            await c.ping()
        self.assertEqual(asked, [7])  # once: the fresh token is far from its end
        bearers = [h["authorization"] for _, _, h, _ in server.requests]
        self.assertNotEqual(fresh_token, ending)
        self.assertEqual(bearers, [f"Bearer {fresh_token}"] * 3 + ["Bearer set.by.the-app"])

    async def test_a_refusal_is_a_result_with_its_reason(self) -> None:
        def script(method: str, path: str, headers: dict[str, str], body: Any) -> Answer:
            if path == "/v1/packets":
                return 400, {}, {"result": "bad-request", "error": "this idempotency key was used for a different send"}
            return 200, {}, ME

        async with FakeHttpServer(script) as server, client(server) as c:
            sent = await c.send(amount_cents=1, shares=1, recipients=[8], idempotency_key="k")
        self.assertEqual(sent.result, ResultCode.BAD_REQUEST)
        self.assertIn("different send", sent.error or "")

    async def test_unavailable_at_start_waits_as_the_server_says(self) -> None:
        calls = []

        def script(method: str, path: str, headers: dict[str, str], body: Any) -> Answer:
            calls.append(time.monotonic())
            if len(calls) == 1:
                return 503, {"Retry-After": "1"}, {"result": "unavailable", "error": "core unreachable"}
            return 200, {}, ME

        async with FakeHttpServer(script) as server, client(server) as c:
            self.assertEqual(c.state, hb.ConnectionState.CONNECTED)
        # Retry-After 1 s, give or take half (and a loaded machine's slack above).
        self.assertGreaterEqual(calls[1] - calls[0], 0.5)
        self.assertLess(calls[1] - calls[0], 1.5 + 0.5)

    async def test_401_is_bad_token_and_final(self) -> None:
        def script(method: str, path: str, headers: dict[str, str], body: Any) -> Answer:
            return 401, {"WWW-Authenticate": "Bearer"}, {"result": "bad-token",
                                                         "error": "the bearer token is refused (expired)"}

        async with FakeHttpServer(script) as server:
            with self.assertRaises(hb.HongbaoError) as caught:
                async with client(server):
                    pass
        self.assertEqual(caught.exception.kind, hb.ErrorKind.BAD_TOKEN)
        self.assertIn("(expired)", str(caught.exception))
        self.assertEqual(len(server.requests), 1)


if __name__ == "__main__":
    unittest.main()
