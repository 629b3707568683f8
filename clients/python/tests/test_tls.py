"""TLS without a server: the URL schemes, the client's SSL context, which errors are TLS
failures no retry mends, and a scripted plain server answering with a TLS alert (what a
TLS port answers a plain client): the client stops at the first try, naming the scheme
to use. The live side is test_live_tls.py."""

from __future__ import annotations

import asyncio
import ssl
import time
import unittest

import hongbao_client as hb
from hongbao_client.tls import ALPN_FRAMES, client_context, is_tls_alert, tls_failure

#: What rustls sends bytes that are not TLS: a fatal decode_error alert.
TLS_ALERT = bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32])


class Schemes(unittest.TestCase):
    def test_tls_schemes_are_urls(self) -> None:
        self.assertEqual(hb.parse_url("tcps://127.0.0.1:7000"), ("tcps", "127.0.0.1", 7000))
        self.assertEqual(hb.parse_url("https://[::1]:7003/"), ("https", "::1", 7003))
        with self.assertRaises(hb.HongbaoError) as caught:
            hb.parse_url("wss://127.0.0.1:7002")
        self.assertEqual(caught.exception.kind, hb.ErrorKind.INVALID_ARGUMENT)

    def test_a_ca_that_is_not_there_is_an_argument_error(self) -> None:
        with self.assertRaises(hb.HongbaoError) as caught:
            hb.connect("tcps://127.0.0.1:7000", user_id=1, secret="s", cafile="/nonexistent/ca.pem")
        self.assertEqual(caught.exception.kind, hb.ErrorKind.INVALID_ARGUMENT)
        with self.assertRaises(hb.HongbaoError) as caught:
            hb.connect("https://127.0.0.1:7003", user_id=1, secret="s", cadata="not PEM")
        self.assertEqual(caught.exception.kind, hb.ErrorKind.INVALID_ARGUMENT)
        # A plain URL makes no context: its CA options are not read.
        hb.connect("tcp://127.0.0.1:7000", user_id=1, secret="s", cafile="/nonexistent/ca.pem")

    def test_the_context_checks_the_name_and_offers_one_alpn(self) -> None:
        context = client_context(ALPN_FRAMES)
        self.assertTrue(context.check_hostname)
        self.assertEqual(context.verify_mode, ssl.CERT_REQUIRED)
        self.assertGreaterEqual(context.minimum_version, ssl.TLSVersion.TLSv1_2)


class Failures(unittest.TestCase):
    def test_certificates_and_refused_handshakes_are_tls_failures(self) -> None:
        self.assertRegex(tls_failure(ssl.SSLCertVerificationError(1, "certificate verify failed")) or "",
                         "certificate is not trusted")
        self.assertRegex(tls_failure(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")) or "",
                         "TLS handshake failed")

    def test_lost_connections_are_not(self) -> None:
        for error in (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"), ssl.SSLZeroReturnError(6, "x"),
                      ConnectionResetError(104, "reset"), ConnectionRefusedError(111, "refused")):
            self.assertIsNone(tls_failure(error), repr(error))

    def test_a_tls_alert_record_and_nothing_else(self) -> None:
        self.assertTrue(is_tls_alert(TLS_ALERT))
        self.assertFalse(is_tls_alert(b"\x00\x00\x00\x0a\x02"))  # a frame's length prefix
        self.assertFalse(is_tls_alert(b"HTTP/1.1 200 OK\r\n"))
        self.assertFalse(is_tls_alert(b"\x15"))


class PlainAtATlsPort(unittest.IsolatedAsyncioTestCase):
    """A server that answers whatever comes with a TLS alert and closes, as a TLS port does."""

    async def asyncSetUp(self) -> None:
        self.connections = 0

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            await reader.read(1)
            writer.write(TLS_ALERT)
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(answer, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def asyncTearDown(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def assert_stops_at_once(self, url: str, use: str) -> None:
        c = hb.connect(url, user_id=5, secret="s", connect_timeout_s=10.0)
        started = time.monotonic()
        with self.assertRaises(hb.HongbaoError) as caught:
            await c.start()
        self.assertEqual(caught.exception.kind, hb.ErrorKind.TLS, repr(caught.exception))
        self.assertIn(f"speaks TLS on this address (use {use})", str(caught.exception))
        self.assertLess(time.monotonic() - started, 2.0)
        self.assertEqual(self.connections, 1, "tried again")
        self.assertTrue(c.closed)

    async def test_tcp_frames(self) -> None:
        await self.assert_stops_at_once(f"tcp://127.0.0.1:{self.port}", "tcps://")

    async def test_http(self) -> None:
        await self.assert_stops_at_once(f"http://127.0.0.1:{self.port}", "https://")


if __name__ == "__main__":
    unittest.main()
