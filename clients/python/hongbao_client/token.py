"""Login tokens: JWTs (RFC 7519) in their compact form, `header.claims.signature`.

In production an app server signs them and hands them to its users (docs/protocol.md,
"login"; crates/proto/src/token.rs is what the gateway checks); this library only passes
them on. `make_token` mints the kind a `hongbao serve` with a shared secret accepts —
HS256, header `kid` "hongbao", claims `sub` (the user id as a decimal string), `iat` and
`exp` — for development, tests and load generation: whoever holds the secret can log in
as anyone, so it has no place in an app's client.

`claims` reads a token's claims without checking its signature (the client has no key
to check it with): the client only wants to know whose a token is and when it ends, to
ask for a fresh one in time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time
from typing import Any

#: The secret `hongbao serve` uses when none is given (HONGBAO_SECRET, --secret): for
#: development only, and such a server listens on loopback only.
DEV_SECRET = "hongbao-dev-secret"

#: The `kid` of the HS256 key a server makes of its secret when no `[[login_keys]]` are
#: configured.
DEFAULT_KID = "hongbao"

#: How long a minted token lives unless told otherwise; the server refuses tokens that
#: live longer than `max_token_lifetime_secs` (a day by default).
DEFAULT_TTL_S = 3600


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _as_bytes(secret: str | bytes) -> bytes:
    return secret.encode("utf-8") if isinstance(secret, str) else secret


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def make_token(
    secret: str | bytes,
    user_id: int,
    *,
    ttl_s: int = DEFAULT_TTL_S,
    now: int | None = None,
    kid: str = DEFAULT_KID,
    audience: str | None = None,
    not_before: int | None = None,
) -> str:
    """An HS256 JWT naming `user_id`, issued `now` (Unix seconds; the clock's by default),
    ending `ttl_s` later, signed with `secret` under key `kid`. For development and
    tests: production tokens come from the app server."""
    if user_id <= 0:
        raise ValueError(f"user id {user_id}: a token names a user above 0")
    issued = int(time.time()) if now is None else now
    header = {"alg": "HS256", "kid": kid, "typ": "JWT"}
    # Keys in the order of the example in golden.txt and protocol.md: sub, exp, iat.
    claims: dict[str, Any] = {"sub": str(user_id), "exp": issued + ttl_s, "iat": issued}
    if not_before is not None:
        claims["nbf"] = not_before
    if audience is not None:
        claims["aud"] = audience
    signing_input = f"{_b64url(_json(header))}.{_b64url(_json(claims))}"
    signature = hmac.new(_as_bytes(secret), signing_input.encode("ascii"), hashlib.sha256).digest()
    return f"{signing_input}.{_b64url(signature)}"


def claims(token: str) -> dict[str, Any] | None:
    """The claims of a JWT, unverified; None for anything that is not one."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        value = json.loads(_b64url_decode(parts[1]))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def token_user(token: str) -> int | None:
    """The user a JWT's `sub` names (unverified), or None."""
    sub = (claims(token) or {}).get("sub")
    return int(sub) if isinstance(sub, str) and re.fullmatch(r"[1-9][0-9]{0,19}", sub) else None


def token_expiry_s(token: str) -> float | None:
    """A JWT's `exp` in Unix seconds (unverified), or None when it has none."""
    exp = (claims(token) or {}).get("exp")
    return float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None
