"""The command line's own words and choices (cli.py), with no server: where its
credentials come from, what `me` over TCP asks for, and a refused connection failing at
once instead of waiting out the connect timeout."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import time
import unittest
from unittest import mock

from hongbao_client import cli
from hongbao_client.token import DEV_SECRET, make_token


def run(*argv: str) -> tuple[int, dict[str, object]]:
    """`main(argv)`: its exit status and the JSON error it printed on stderr (or {})."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = cli.main(list(argv))
    text = err.getvalue().strip()
    return status, json.loads(text) if text else {}


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Credentials(unittest.TestCase):
    def credentials(self, *argv: str, env: str | None = None) -> dict[str, str]:
        args = cli._parser().parse_args(["shake", "--server", "tcp://127.0.0.1:7000", "--user", "7", *argv])
        environ = {} if env is None else {"HONGBAO_SECRET": env}
        with mock.patch.dict(os.environ, environ, clear=True):
            return cli._credentials(args)

    def test_a_secret_is_taken_as_given_an_empty_one_too(self) -> None:
        self.assertEqual(self.credentials("--secret", "dev"), {"secret": "dev"})
        self.assertEqual(self.credentials("--secret", "", env="from-env"), {"secret": ""})

    def test_without_one_the_environment_then_the_development_secret(self) -> None:
        self.assertEqual(self.credentials(env="from-env"), {"secret": "from-env"})
        self.assertEqual(self.credentials(env=""), {"secret": ""})  # set, as `serve` reads it
        self.assertEqual(self.credentials(), {"secret": DEV_SECRET})

    def test_a_token_wins(self) -> None:
        jwt = make_token("x", 7)
        self.assertEqual(self.credentials("--token", jwt, "--secret", "x"), {"token": jwt})

    def test_a_token_names_its_user_a_secret_needs_one(self) -> None:
        args = cli._parser().parse_args(["shake", "--server", "tcp://127.0.0.1:7000", "--token", "a.b.c"])
        self.assertEqual(cli._credentials(args), {"token": "a.b.c"})
        status, error = run("shake", "--server", f"tcp://127.0.0.1:{closed_port()}", "--secret", "x")
        self.assertEqual((status, error["error"]), (2, "invalid-argument"))
        self.assertIn("--user", str(error["message"]))


class Errors(unittest.TestCase):
    def test_me_over_tcp_without_http_names_the_flag_to_give(self) -> None:
        status, error = run("me", "--server", f"tcp://127.0.0.1:{closed_port()}", "--user", "7")
        self.assertEqual(status, 2)
        self.assertEqual(error["error"], "unsupported")
        self.assertIn("--http", str(error["message"]))
        self.assertNotIn("http_url", str(error["message"]))

    def test_a_refused_connection_fails_at_once(self) -> None:
        for scheme in ("tcp", "http"):
            started = time.monotonic()
            status, error = run("shake", "--server", f"{scheme}://127.0.0.1:{closed_port()}", "--user", "7")
            waited = time.monotonic() - started
            self.assertEqual((status, error["error"]), (2, "connect-failed"), scheme)
            # The library's default would retry for its 10 s connect timeout.
            self.assertLess(waited, 2.0, scheme)


if __name__ == "__main__":
    unittest.main()
