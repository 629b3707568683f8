"""The decoded form of golden.txt (`type=send request_id=7 amount_cents=1000 ...`), both
ways: `describe` writes a frame in it, `parse` reads one back. The file's header defines
the form; this is test code because the form exists only for the conformance file."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from hongbao_client import messages as m
from hongbao_client.messages import Frame, KickReason, ResultCode

#: The repository root, found from this file: clients/python/tests/ → three levels up.
REPO_ROOT = Path(__file__).resolve().parents[3]
GOLDEN = REPO_ROOT / "crates" / "proto" / "testdata" / "golden.txt"

TYPE_NAMES = {
    m.Login: "login", m.Shake: "shake", m.Send: "send", m.Open: "open", m.Chat: "chat", m.Ping: "ping",
    m.LoginReply: "login-reply", m.ShakeReply: "shake-reply", m.SendReply: "send-reply",
    m.OpenReply: "open-reply", m.ChatReply: "chat-reply", m.Pong: "pong", m.Error: "error",
    m.PacketNotice: "packet-notice", m.ChatMessage: "chat-message", m.Broadcast: "broadcast", m.Kick: "kick",
    m.Refresh: "refresh",
}
BY_TYPE_NAME = {name: cls for cls, name in TYPE_NAMES.items()}


def _escape_text(text: str) -> str:
    out = []
    for ch in text:
        if ch in "% |" or ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    return "".join(out)


def _unescape_text(text: str) -> str:
    raw = re.sub(rb"%([0-9A-Fa-f]{2})", lambda mt: bytes([int(mt.group(1), 16)]), text.encode("utf-8"))
    return raw.decode("utf-8")


def describe(frame: Frame) -> str:
    """The frame in golden.txt's decoded form: fields in wire order."""
    message = frame.message
    pairs = [f"type={TYPE_NAMES[type(message)]}", f"request_id={frame.request_id}"]
    for field in dataclasses.fields(message):
        value = getattr(message, field.name)
        if value is None:  # optional trailing fields (idempotency_key, retry_after_ms): absent
            continue
        if isinstance(value, (ResultCode, KickReason)):
            pairs.append(f"{field.name}={value.wire_name}")
        elif field.name == "token":
            pairs.append(f"token={value.hex()}")
        elif field.name == "recipients":
            pairs.append("recipients=" + ",".join(str(r) for r in value))
        elif field.name == "text":
            pairs.append(f"text={_escape_text(value)}")
        else:
            pairs.append(f"{field.name}={value}")
    return " ".join(pairs)


def parse(form: str) -> Frame:
    """A decoded form back into a frame; every key must be used exactly once."""
    values: dict[str, str] = {}
    for pair in form.split(" "):
        key, sep, value = pair.partition("=")
        assert sep, f"not key=value: {pair!r}"
        assert key not in values, f"key {key} twice"
        values[key] = value
    cls = BY_TYPE_NAME[values.pop("type")]
    request_id = int(values.pop("request_id"))
    kwargs: dict[str, object] = {}
    for field in dataclasses.fields(cls):
        if field.name not in values:
            assert field.name in ("idempotency_key", "retry_after_ms"), f"{field.name} missing from {form!r}"
            continue
        value = values.pop(field.name)
        if field.name == "result":
            kwargs[field.name] = ResultCode.from_wire_name(value)
        elif field.name == "reason":
            kwargs[field.name] = KickReason.from_wire_name(value)
        elif field.name == "token":
            kwargs[field.name] = bytes.fromhex(value)
        elif field.name == "recipients":
            kwargs[field.name] = tuple(int(r) for r in value.split(",")) if value else ()
        elif field.name == "text":
            kwargs[field.name] = _unescape_text(value)
        elif field.name == "idempotency_key":
            kwargs[field.name] = value
        else:
            kwargs[field.name] = int(value)
    assert not values, f"unused keys {sorted(values)} in {form!r}"
    return Frame(request_id, cls(**kwargs))


@dataclasses.dataclass(frozen=True)
class Vector:
    line_no: int
    name: str  # "invalid" for an invalid vector
    data: bytes
    expected: str  # the decoded form, or the error kind


def vectors(path: Path = GOLDEN) -> list[Vector]:
    out = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split(" | ")
        assert len(cols) == 3, f"line {line_no}: want 3 columns"
        out.append(Vector(line_no, cols[0].strip(), bytes.fromhex(cols[1].strip()), cols[2].strip()))
    return out
