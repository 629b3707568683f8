"""The client against a `hongbao serve` that speaks TLS on every listener and the admin
address (`--tls-cert`, `--tls-key`), with certificates made here by `openssl` (skipped,
saying so, without it or without a binary).

Over `tcps://` (binary frames, ALPN `hongbao/2`) and `https://` (ALPN `http/1.1`), the
CA given as `cadata=` or `cafile=`: login, shake until a win, a send and its retry under
one key, the recipient's notice and open, `me()` over https beside tcps, the command
line. A client trusting another CA (or only the system's) raises TLS at once and does
not retry; so does a plain `tcp://` or `http://` URL at a TLS port. The ALPN names the
server says, and its refusal of a client offering only another one.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
import tempfile
import time
import unittest
from pathlib import Path
from typing import Any, ClassVar

import hongbao_client as hb
from hongbao_client.devserver import DevServer, find_binary
from hongbao_client.messages import ResultCode
from hongbao_client.tls import ALPN_FRAMES, ALPN_HTTP, client_context, tls_failure
from tls_certs import Certs, make_certs, openssl_missing

SECRET = "python-client-tls-secret"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
BINARY = find_binary()
SKIP = ("no hongbao binary: set $HONGBAO_BIN or build one (cargo build)" if BINARY is None
        else openssl_missing())


async def win(c: hb.Client, tries: int = 400) -> hb.Shake:
    for _ in range(tries):
        shake = await c.shake()
        if shake.won:
            return shake
        await asyncio.sleep(0.01)
    raise AssertionError(f"no win in {tries} shakes")


async def next_notice(c: hb.Client, packet_id: int, timeout_s: float = 10.0) -> hb.PacketNotice:
    async with asyncio.timeout(timeout_s):
        async for event in c.events():
            if isinstance(event, hb.PacketNotice) and event.packet_id == packet_id:
                return event
    raise AssertionError("events ended")


@unittest.skipIf(SKIP, SKIP or "")
class LiveTls(unittest.IsolatedAsyncioTestCase):
    server: ClassVar[DevServer]
    certs: ClassVar[Certs]
    folder: ClassVar[tempfile.TemporaryDirectory[str]]

    @classmethod
    def setUpClass(cls) -> None:
        assert BINARY is not None
        cls.folder = tempfile.TemporaryDirectory(prefix="hongbao-py-tls-")
        cls.certs = make_certs(Path(cls.folder.name))
        cls.server = DevServer(BINARY, workers=1, secret=SECRET, tls_cert=cls.certs.cert, tls_key=cls.certs.key,
                               tls_ca=cls.certs.ca).start()
        asyncio.run(cls.server.start_shake_campaign(packets=1_000_000, rate_per_sec=500))

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            audit = asyncio.run(cls.server.audit())
            assert audit["ok"], f"money audit failed: {audit}"
        finally:
            cls.server.stop()
            cls.folder.cleanup()

    async def asyncSetUp(self) -> None:
        # Loading a CA is synchronous; asyncio's debug mode, which the test case turns on,
        # would report it as a slow callback.
        asyncio.get_running_loop().slow_callback_duration = 1.0

    def client(self, url: str, user_id: int, **kwargs: Any) -> hb.Client:
        kwargs.setdefault("cadata", self.certs.ca.read_text())
        kwargs.setdefault("notice_poll_s", 0.2)
        return hb.connect(url, user_id=user_id, secret=SECRET, **kwargs)

    async def flow(self, url: str, sender_id: int) -> None:
        """Win, send twice under one key, the recipient hears of it and opens it."""
        recipient_id = sender_id + 1
        async with (self.client(url, sender_id, http_url=self.server.http_url) as sender,
                    self.client(url, recipient_id) as recipient):
            self.assertEqual(sender.state, hb.ConnectionState.CONNECTED)
            self.assertGreater((await sender.ping()).server_time_us, 0)
            won = await win(sender)
            self.assertEqual((await sender.me()).balance_cents, won.amount_cents)
            key = f"py-tls-{sender_id}"
            first = await sender.send(amount_cents=30, shares=1, recipients=[recipient_id], idempotency_key=key)
            again = await sender.send(amount_cents=30, shares=1, recipients=[recipient_id], idempotency_key=key)
            self.assertEqual(first.result, ResultCode.OK)
            self.assertEqual(again, first)
            self.assertEqual((await sender.me()).balance_cents, won.amount_cents - 30)
            notice = await next_notice(recipient, first.packet_id)
            self.assertEqual((notice.from_user, notice.amount_cents), (sender_id, 30))
            opened = await recipient.open(notice.packet_id)
            self.assertEqual((opened.result, opened.amount_cents), (ResultCode.OPENED, 30))
            self.assertEqual((await recipient.open(notice.packet_id)).result, ResultCode.ALREADY_OPENED)
        audit = await self.server.audit()
        self.assertTrue(audit["ok"], audit)

    async def test_tcps_frames_login_shake_send_open(self) -> None:
        self.assertTrue(self.server.tcp_url.startswith("tcps://"), self.server.tcp_url)
        await self.flow(self.server.tcp_url, 801)

    async def test_https_login_shake_send_open(self) -> None:
        self.assertTrue(self.server.http_url.startswith("https://"), self.server.http_url)
        await self.flow(self.server.http_url, 811)

    async def assert_refused_for_tls(self, url: str, pattern: str, **kwargs: Any) -> None:
        """Connecting raises TLS at the first try (not CONNECT_FAILED after the connect
        timeout), and the client is closed."""
        c = self.client(url, 821, connect_timeout_s=15.0, **kwargs)
        started = time.monotonic()
        with self.assertRaises(hb.HongbaoError) as caught:
            await c.start()
        self.assertEqual(caught.exception.kind, hb.ErrorKind.TLS, f"{url}: {caught.exception!r}")
        self.assertRegex(str(caught.exception), pattern)
        self.assertLess(time.monotonic() - started, 3.0, f"{url}: retried")
        self.assertTrue(c.closed)
        with self.assertRaises(hb.HongbaoError) as later:
            await c.shake()
        self.assertEqual(later.exception.kind, hb.ErrorKind.TLS)

    async def test_a_client_trusting_another_ca_fails_at_once(self) -> None:
        for url in (self.server.tcp_url, self.server.http_url):
            await self.assert_refused_for_tls(url, "certificate is not trusted", cadata=None, cafile=self.certs.other_ca)
            # No CA given: the system's, which do not know this one either.
            await self.assert_refused_for_tls(url, "certificate is not trusted", cadata=None)

    async def test_a_plain_url_at_a_tls_port_fails_at_once(self) -> None:
        await self.assert_refused_for_tls(self.server.tcp_url.replace("tcps://", "tcp://"),
                                          r"speaks TLS on this address \(use tcps://\)")
        await self.assert_refused_for_tls(self.server.http_url.replace("https://", "http://"),
                                          r"speaks TLS on this address \(use https://\)")

    async def test_the_server_says_each_listeners_alpn_and_refuses_others(self) -> None:
        cadata = self.certs.ca.read_text()
        for (host, port), alpn in ((self.server.tcp, ALPN_FRAMES), (self.server.http, ALPN_HTTP)):
            _, writer = await asyncio.open_connection(host, port, ssl=client_context(alpn, cadata=cadata),
                                                      server_hostname=host)
            tls = writer.get_extra_info("ssl_object")
            self.assertEqual(tls.selected_alpn_protocol(), alpn)
            self.assertIn(tls.version(), ("TLSv1.3", "TLSv1.2"))
            writer.close()
            async with asyncio.timeout(5):
                await writer.wait_closed()
        # The frames' name at the HTTP port (and the other way round) is refused.
        for (host, port), alpn in ((self.server.tcp, ALPN_HTTP), (self.server.http, ALPN_FRAMES)):
            with self.assertRaises(ssl.SSLError) as caught:
                await asyncio.open_connection(host, port, ssl=client_context(alpn, cadata=cadata),
                                              server_hostname=host)
            self.assertRegex(tls_failure(caught.exception) or "", "(?i)no.application.protocol")

    async def test_the_command_line_over_tls(self) -> None:
        async def cli(*args: str) -> tuple[int, list[dict[str, Any]], str]:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "hongbao_client", *args, "--secret", SECRET,
                cwd=PACKAGE_ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(process.communicate(), 60)
            return process.returncode or 0, [json.loads(line) for line in out.decode().splitlines()], err.decode()

        ca = str(self.certs.ca)
        code, lines, err = await cli("shake", "--server", self.server.tcp_url, "--ca", ca, "--user", "831")
        self.assertEqual(code, 0, err)
        self.assertIn(lines[0]["result"], ("won", "nothing"))
        code, lines, err = await cli("me", "--server", self.server.http_url, "--ca", ca, "--user", "831")
        self.assertEqual((code, lines[0]["user_id"]), (0, 831), err)
        code, _, err = await cli("me", "--server", self.server.http_url, "--ca", str(self.certs.other_ca),
                                 "--user", "831")
        self.assertEqual(code, 2)
        self.assertEqual(json.loads(err)["error"], "tls")


if __name__ == "__main__":
    unittest.main()
