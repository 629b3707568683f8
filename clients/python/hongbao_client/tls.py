"""TLS for both transports: the client side of `hongbao serve --tls-cert --tls-key`.

The gateway speaks TLS 1.3 and 1.2 on every client listener, and names its protocol by
ALPN: `hongbao/2` on the binary-frame address, `http/1.1` on the HTTP API's (a client
offering only other names is refused; offering none is served). The client offers the
name of the listener it dials, trusts the CA it is given (`cafile=`, `cadata=`, as
`ssl.create_default_context` takes them; else the system's CAs), and checks that the
server's certificate names the host or IP address of the URL.

Some TLS failures are not worth a retry: a certificate this client does not trust (or
that names another host), a handshake the server refuses, a plain `tcp://` or `http://`
URL at a port that speaks TLS (the server answers with an alert and closes). They raise
HongbaoError TLS and the client stops, rather than backing off until its connect
timeout. A handshake cut off halfway (EOF, a reset) is a lost connection, retried.
"""

from __future__ import annotations

import asyncio
import os
import ssl

#: The ALPN names of the gateway's listeners.
ALPN_FRAMES = "hongbao/2"
ALPN_HTTP = "http/1.1"

#: SSL errors that mean the connection went, not that TLS cannot be agreed.
_LOST = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError, ssl.SSLWantReadError,
         ssl.SSLWantWriteError)


def client_context(alpn: str, *, cafile: str | os.PathLike[str] | None = None,
                   cadata: str | bytes | None = None) -> ssl.SSLContext:
    """A client context that trusts `cafile`/`cadata` (else the system's CAs), checks the
    server's name, and offers `alpn`."""
    context = ssl.create_default_context(cafile=cafile, cadata=cadata)
    # create_default_context already does both; said again, as they are the point.
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols([alpn])
    return context


def tls_failure(error: BaseException) -> str | None:
    """Why `error` is a TLS failure no retry mends, in words; None when it is not one."""
    # `verify_message` and `reason` are set by the ssl module when it raises; read with a
    # default, as an error made by hand has neither.
    if isinstance(error, ssl.SSLCertVerificationError):
        why = getattr(error, "verify_message", None) or error
        return f"the server's certificate is not trusted ({why}); give the CA that signed it (cafile= or cadata= to connect(), --ca on the command line)"
    if isinstance(error, ssl.SSLError) and not isinstance(error, _LOST):
        return f"the TLS handshake failed ({getattr(error, 'reason', None) or error})"
    return None


def is_tls_alert(data: bytes | bytearray | memoryview) -> bool:
    """Whether `data` begins with a TLS alert record (type 21, version 3.x): what a TLS
    server answers bytes that are not TLS. No frame (its length prefix starts with 0x00)
    and no HTTP answer begins so."""
    return len(data) >= 2 and data[0] == 0x15 and data[1] == 0x03


def plain_at_tls_port(scheme: str) -> str:
    """Why a plain client failed at a TLS port; `scheme` is the URL scheme to use instead."""
    return f"the server answered with a TLS alert: it speaks TLS on this address (use {scheme})"


async def wait_until_closed(writer: asyncio.StreamWriter, timeout_s: float) -> None:
    """Waits until a connection `close()`d is closed (a TLS goodbye takes a round trip);
    cuts it after `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            await writer.wait_closed()
    except TimeoutError:
        writer.transport.abort()
    except OSError:
        pass  # it is closed: how it ended does not matter here
