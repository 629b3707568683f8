"""The token a client logs in with, and how it gets a fresh one.

A session lasts as long as its token (docs/protocol.md, "login"): before the token ends
the server pushes `refresh`, and the client logs in again on the same connection with a
fresh token from the app — the `refresh` callback given to `connect`, which returns a
new JWT (from the app server, typically) or None to let the session lapse. A connection
is only dialled with a token that has not ended (a reconnect long after the last
refresh asks the callback first); the server asks for the next one in time. HTTP has no
pushes, so there the callback is asked before a request whenever the token is within
`refresh_before_s` of its `exp`.

One `Credentials` per client, shared by its sessions (a TCP connection logs in with it,
an HTTP session puts it in every request's bearer). It asks the callback once at a time:
callers that want a fresh token together share one call. A token is adopted (used for
every later login and request) only once the server took it on a live connection, or,
over HTTP and before a dial, when there is nothing better to try.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

from .token import token_expiry_s, token_user

#: The app's source of fresh tokens: called with the user id, returns a JWT (or an
#: awaitable of one), or None to let the session lapse.
RefreshCallback = Callable[[int], Awaitable[str | None] | str | None]


class Credentials:
    def __init__(self, token: str, *, user_id: int | None = None, refresh: RefreshCallback | None = None,
                 refresh_before_s: float = 60.0):
        self.token = token
        #: The user a login names: as given, or 0 ("whoever the token names").
        self.login_user = user_id or 0
        #: The user: given, else the token's `sub`, else learnt from the login reply.
        self.user_id = user_id or token_user(token) or 0
        self._refresh = refresh
        self._refresh_before_s = refresh_before_s
        self._asking: asyncio.Future[str | None] | None = None
        #: Why the last call of the callback gave nothing, in words (for the close cause).
        self.last_failure: str | None = None

    @property
    def can_refresh(self) -> bool:
        return self._refresh is not None

    def ends_within(self, seconds: float) -> bool:
        """Whether the token's `exp` is at most `seconds` away (or past); False when the
        token names no end the client can read."""
        expires = token_expiry_s(self.token)
        return expires is not None and expires - time.time() <= seconds

    async def ask(self) -> str | None:
        """A fresh token from the app's callback, or None (no callback, it gave none, or
        it raised: `last_failure` says which). Concurrent callers share one call."""
        if self._refresh is None:
            return None
        if self._asking is None or self._asking.done():
            self._asking = asyncio.ensure_future(self._call(self._refresh))
        return await asyncio.shield(self._asking)

    async def _call(self, refresh: RefreshCallback) -> str | None:
        try:
            fresh = refresh(self.user_id)
            if inspect.isawaitable(fresh):
                fresh = await fresh
        except Exception as e:  # the app's code: its failure lets the session lapse
            self.last_failure = f"the refresh callback raised {e!r}"
            return None
        if fresh is None or fresh == "":
            self.last_failure = "the refresh callback gave no token"
            return None
        if not isinstance(fresh, str):
            self.last_failure = f"the refresh callback gave a {type(fresh).__name__}, not a str"
            return None
        self.last_failure = None
        return fresh

    def adopt(self, token: str) -> None:
        """From now on, log in and authenticate with `token`."""
        self.token = token

    async def for_request(self) -> str:
        """The token for an HTTP request: a fresh one first when this one is within
        `refresh_before_s` of its end and the app can give one."""
        return await self._fresh_if_ending_within(self._refresh_before_s)

    async def for_login(self) -> str:
        """The token for a new connection's login: a fresh one first when this one has
        ended (the server asks for the next one itself, in time)."""
        return await self._fresh_if_ending_within(0.0)

    async def _fresh_if_ending_within(self, seconds: float) -> str:
        if self._refresh is not None and self.ends_within(seconds):
            fresh = await self.ask()
            if fresh is not None:
                self.token = fresh
        return self.token

    def close(self) -> None:
        if self._asking is not None:
            self._asking.cancel()
