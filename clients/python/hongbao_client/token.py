"""The login token: HMAC-SHA256(server secret, user id written as decimal ASCII).

Byte for byte what crates/proto/src/token.rs makes, so that a development tool holding
the server's secret can log in as any user. Over TCP the token travels as its 32 raw
bytes; the HTTP API's bearer carries it as 64 hex characters (`<user id>.<hex>`).
"""

from __future__ import annotations

import hashlib
import hmac

#: Bytes in a raw token.
TOKEN_LEN = 32

#: The secret `hongbao serve` uses when none is given: for development only.
DEV_SECRET = "hongbao-dev-secret"


def _as_bytes(secret: str | bytes) -> bytes:
    return secret.encode("utf-8") if isinstance(secret, str) else secret


def make_token(secret: str | bytes, user_id: int) -> bytes:
    """The 32-byte token for `user_id` under `secret`."""
    return hmac.new(_as_bytes(secret), str(user_id).encode("ascii"), hashlib.sha256).digest()


def make_token_hex(secret: str | bytes, user_id: int) -> str:
    """The token as 64 lowercase hex characters."""
    return make_token(secret, user_id).hex()


def raw_token(token: str | bytes) -> bytes:
    """A token given either way (32 raw bytes, or its 64-character hex, as text or bytes)
    as the raw bytes the binary login sends."""
    if isinstance(token, str):
        token = token.strip().encode("ascii")
    if len(token) == 2 * TOKEN_LEN:
        try:
            return bytes.fromhex(token.decode("ascii"))
        except ValueError:
            pass
    return bytes(token)
