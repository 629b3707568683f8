"""A small command line for scripts: one JSON object per line on stdout.

    python3 -m hongbao_client shake  --server tcp://127.0.0.1:7000 --user 7 --secret S [--until-win] [--count N]
    python3 -m hongbao_client send   --server ... --user 7 --secret S --amount-cents 300 --shares 2 --to 8,9 [--key K]
    python3 -m hongbao_client open   --server ... --user 8 --secret S PACKET_ID
    python3 -m hongbao_client chat   --server ... --user 7 --secret S TO TEXT
    python3 -m hongbao_client me     --server http://127.0.0.1:7003 --user 7 --secret S
    python3 -m hongbao_client listen --server ... --user 8 --secret S [--seconds N]

Credentials: `--token JWT` (from the app server, or `GET /token?user=N` of a server run
with `--demo-login`; `--user` may then be left out: the token names the user), or
`--secret` (else `$HONGBAO_SECRET` when set, else the server's development secret; taken
as given, an empty one too) to mint a JWT for `--user` (development: see token.py). `me`
needs the HTTP API: an `http://` server, or `--http http://...` beside a `tcp://` one.
TLS: `tcps://` and `https://` trust the CA in `--ca FILE` (PEM), else the system's. A
refused connection is an error at once (the library would retry it for
`connect_timeout_s`). The exit status is 0 when the last answer was what was asked for (a
win with --until-win, `ok`, `opened`, ...), 1 otherwise, 2 on an error.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import enum
import json
import os
import sys
from typing import Any

from . import connect, parse_url
from .client import Client
from .errors import ErrorKind, ErrorSource, HongbaoError
from .messages import ResultCode
from .token import DEV_SECRET


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.wire_name if hasattr(value, "wire_name") else value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__, **{f.name: _jsonable(getattr(value, f.name))
                                                 for f in dataclasses.fields(value)}}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _print(value: Any) -> None:
    print(json.dumps(_jsonable(value), ensure_ascii=False), flush=True)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", required=True, help="tcp://HOST:PORT or http://HOST:PORT (tcps://, https:// "
                        "for TLS)")
    common.add_argument("--user", type=int, help="user id (needed to mint a token; with --token, "
                        "default: the user the token names)")
    common.add_argument("--secret", help="server secret to mint the token with, as given (default: "
                        "$HONGBAO_SECRET, else the development secret)")
    common.add_argument("--token", help="the login token, a JWT (instead of --secret)")
    common.add_argument("--http", help="the HTTP API address beside a tcp:// server, for `me`")
    common.add_argument("--ca", help="a PEM file of the CA to trust for tcps:// and https:// (default: the "
                        "system's CAs)")
    common.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")

    parser = argparse.ArgumentParser(prog="python3 -m hongbao_client", description="hongbao client")
    commands = parser.add_subparsers(dest="command", required=True)
    shake = commands.add_parser("shake", parents=[common], help="shake for a packet")
    shake.add_argument("--count", type=int, help="shakes to make (default 1; with --until-win, no limit)")
    shake.add_argument("--until-win", action="store_true", help="stop at the first win")
    send = commands.add_parser("send", parents=[common], help="send a packet")
    send.add_argument("--amount-cents", type=int, required=True)
    send.add_argument("--shares", type=int, required=True)
    send.add_argument("--to", required=True, help="recipients, comma-separated user ids")
    send.add_argument("--key", help="idempotency key (default: a fresh UUID, printed with the answer)")
    open_ = commands.add_parser("open", parents=[common], help="open my share of a packet")
    open_.add_argument("packet_id", type=int)
    chat = commands.add_parser("chat", parents=[common], help="send a chat message")
    chat.add_argument("to", type=int)
    chat.add_argument("text")
    commands.add_parser("me", parents=[common], help="my balance and newest ledger events")
    listen = commands.add_parser("listen", parents=[common], help="print pushes as they come")
    listen.add_argument("--seconds", type=float, help="stop after this long (default: never)")
    return parser


def _credentials(args: argparse.Namespace) -> dict[str, str]:
    """`--token`, else `--secret`, else `$HONGBAO_SECRET` when set, else the development
    secret: the secret as given, an empty one too, as `hongbao serve` takes its `--secret`
    and `$HONGBAO_SECRET`."""
    if args.token:
        return {"token": args.token}
    if args.user is None:
        raise HongbaoError(ErrorKind.INVALID_ARGUMENT, "minting a token needs the user: give --user N "
                           "(or a token with --token)", source=ErrorSource.CLIENT)
    secret = args.secret if args.secret is not None else os.environ.get("HONGBAO_SECRET")
    return {"secret": DEV_SECRET if secret is None else secret}


def _client(args: argparse.Namespace) -> Client:
    if args.command == "me" and args.http is None and parse_url(args.server)[0] in ("tcp", "tcps"):
        raise HongbaoError(ErrorKind.UNSUPPORTED, "me over a tcp:// server needs the HTTP API beside it: "
                           "give --http http://HOST:PORT", source=ErrorSource.CLIENT)
    return connect(args.server, user_id=args.user, http_url=args.http, cafile=args.ca,
                   request_timeout_s=args.timeout, **_credentials(args))  # type: ignore[arg-type]


async def _run(args: argparse.Namespace) -> int:
    client = _client(args)
    await client.start(retry_refused=False)
    try:
        match args.command:
            case "shake":
                limit = args.count if args.count is not None else (None if args.until_win else 1)
                made = 0
                while limit is None or made < limit:
                    shake = await client.shake()
                    made += 1
                    _print(shake)
                    if args.until_win and shake.won:
                        return 0
                if args.until_win or made == 0:
                    return 1
                return 0 if shake.result in (ResultCode.WON, ResultCode.NOTHING) else 1
            case "send":
                recipients = [int(r) for r in args.to.split(",") if r]
                sent = await client.send(amount_cents=args.amount_cents, shares=args.shares, recipients=recipients,
                                         idempotency_key=args.key)
                _print(sent)
                return 0 if sent.ok else 1
            case "open":
                opened = await client.open(args.packet_id)
                _print(opened)
                return 0 if opened.credited else 1
            case "chat":
                said = await client.chat(args.to, args.text)
                _print(said)
                return 0 if said.delivered else 1
            case "me":
                _print(await client.me())
                return 0
            case "listen":
                try:
                    async with asyncio.timeout(args.seconds):
                        async for event in client.events():
                            _print(event)
                except TimeoutError:
                    pass
                return 0
    finally:
        await client.close()
    return 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except HongbaoError as e:
        print(json.dumps({"error": e.kind.value, "source": e.source.value, "message": str(e),
                          "idempotency_key": e.idempotency_key}), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
