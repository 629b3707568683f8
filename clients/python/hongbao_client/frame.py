"""Bytes ↔ frames, with no I/O: the Python twin of crates/proto/src/frame.rs.

A frame on the wire, all integers big-endian::

    [len: u32][version: u8][type: u8][request_id: u32][payload ...]

`len` counts the bytes after the length prefix. The connection calls `check` on what it
has buffered: it reads the header only, so a peer announcing a huge frame is refused
before anything is buffered for it. Once `check` says a whole frame is there, `decode`
turns exactly those bytes into a `Frame`; `encode` does the reverse.

Errors come in two grades (`FrameError.fatal`): a bad length or version means the stream
can no longer be cut into frames, so the connection must go; an unknown type or a
malformed payload still has a known end, so a reader can skip the frame and read on.
The fields are read in the same order as the Rust decoder, so that a frame with two
faults is refused with the same error kind on both sides (golden.txt pins the kinds).
"""

from __future__ import annotations

import enum
import struct

from . import messages as m
from .messages import (
    HEADER_LEN,
    MAX_FRAME_LEN,
    MAX_RECIPIENTS,
    MAX_TEXT_LEN,
    MAX_TOKEN_LEN,
    VERSION,
    Frame,
    KickReason,
    Message,
    ResultCode,
    valid_idempotency_key,
)

PREFIX_LEN = 4
#: Smallest legal value of the length field: version + type + request id.
MIN_BODY_LEN = HEADER_LEN - PREFIX_LEN

_HEADER = struct.Struct(">IBBI")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")


class FrameErrorKind(enum.Enum):
    """The error kinds of golden.txt; the value is the name used there and in metrics."""

    TOO_LONG = "too-long"
    TOO_SHORT = "too-short"
    BAD_VERSION = "bad-version"
    INCOMPLETE = "incomplete"
    TRAILING_BYTES = "trailing-bytes"
    UNKNOWN_TYPE = "unknown-type"
    SHORT_PAYLOAD = "short-payload"
    TRAILING_PAYLOAD = "trailing-payload"
    BAD_UTF8 = "bad-utf8"
    UNKNOWN_RESULT = "unknown-result"
    UNKNOWN_KICK_REASON = "unknown-kick-reason"
    TOO_MANY_RECIPIENTS = "too-many-recipients"
    TEXT_TOO_LONG = "text-too-long"
    TOKEN_TOO_LONG = "token-too-long"
    TOKEN_NOT_ASCII = "token-not-ascii"
    BAD_IDEMPOTENCY_KEY = "bad-idempotency-key"
    ZERO_RETRY_AFTER = "zero-retry-after"


# Known only once a whole, well-delimited frame is in hand; the reader may skip the frame.
_RECOVERABLE = frozenset(
    k for k in FrameErrorKind
    if k not in (FrameErrorKind.TOO_LONG, FrameErrorKind.TOO_SHORT, FrameErrorKind.BAD_VERSION,
                 FrameErrorKind.INCOMPLETE, FrameErrorKind.TRAILING_BYTES)
)


class FrameError(ValueError):
    """Bytes that are not a frame, with the kind golden.txt names and, for a
    well-delimited frame, its request id (so the pending request can be failed)."""

    def __init__(self, kind: FrameErrorKind, detail: str, request_id: int | None = None):
        super().__init__(f"{kind.value}: {detail}")
        self.kind = kind
        self.detail = detail
        self.request_id = request_id

    @property
    def fatal(self) -> bool:
        """True when the stream cannot be cut into frames any more: close the connection."""
        return self.kind not in _RECOVERABLE


def check(buf: bytes | bytearray | memoryview) -> int | None:
    """Whether a whole frame starts `buf`: None (read more) or its length, prefix included.

    Raises a fatal FrameError as soon as the length prefix is out of bounds (4 bytes in)
    or the version is wrong (5 bytes in). Copies nothing.
    """
    if len(buf) < PREFIX_LEN:
        return None
    (length,) = _U32.unpack_from(buf, 0)
    if length > MAX_FRAME_LEN:
        raise FrameError(FrameErrorKind.TOO_LONG, f"frame length {length} over limit {MAX_FRAME_LEN}")
    if length < MIN_BODY_LEN:
        raise FrameError(FrameErrorKind.TOO_SHORT, f"frame length {length} under the {MIN_BODY_LEN}-byte minimum")
    if len(buf) > PREFIX_LEN and buf[PREFIX_LEN] != VERSION:
        raise FrameError(FrameErrorKind.BAD_VERSION, f"frame version {buf[PREFIX_LEN]}, expected {VERSION}")
    total = PREFIX_LEN + length
    return total if len(buf) >= total else None


def decode(frame: bytes | bytearray | memoryview) -> Frame:
    """Decodes exactly one whole frame: the bytes `check` delimited, no more, no fewer."""
    total = check(frame)
    if total is None:
        raise FrameError(FrameErrorKind.INCOMPLETE, f"{len(frame)} bytes given, a whole frame needs more")
    if len(frame) > total:
        raise FrameError(FrameErrorKind.TRAILING_BYTES, f"{len(frame) - total} bytes after the end of the frame")
    _, _, kind, request_id = _HEADER.unpack_from(frame, 0)
    payload = bytes(frame[HEADER_LEN:total])
    cls = m.BY_KIND.get(kind)
    if cls is None:
        raise FrameError(FrameErrorKind.UNKNOWN_TYPE, f"unknown message type 0x{kind:02x}", request_id)
    try:
        message = _decode_payload(kind, _Reader(payload))
    except _PayloadError as e:
        raise FrameError(e.kind, f"bad payload for message type 0x{kind:02x} in request {request_id}: {e.detail}",
                         request_id) from None
    return Frame(request_id, message)


def encode(frame: Frame) -> bytes:
    """One encoded frame. Like the Rust encoder it never fails: a text over MAX_TEXT_LEN is
    cut at the last character boundary before the limit; a token, key or recipient list too
    long for its length field is cut to fit. Over-limit tokens and recipient lists are
    written as given, so tests can check that the server refuses them."""
    message = frame.message
    payload = _encode_payload(message)
    return _HEADER.pack(MIN_BODY_LEN + len(payload), VERSION, message.KIND, frame.request_id) + payload


def truncate_text(text: str) -> bytes:
    """The UTF-8 of `text`, cut to at most MAX_TEXT_LEN bytes at a character boundary."""
    raw = text.encode("utf-8")
    if len(raw) <= MAX_TEXT_LEN:
        return raw
    end = MAX_TEXT_LEN
    while end > 0 and (raw[end] & 0xC0) == 0x80:  # a continuation byte: not a boundary
        end -= 1
    return raw[:end]


class _PayloadError(Exception):
    def __init__(self, kind: FrameErrorKind, detail: str):
        self.kind = kind
        self.detail = detail


class _Reader:
    """A cursor over a payload; each read names its field so errors can say what was short."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes):
        self.buf = buf
        self.pos = 0

    def rest(self) -> int:
        return len(self.buf) - self.pos

    def bytes(self, field: str, n: int) -> bytes:
        if self.rest() < n:
            raise _PayloadError(FrameErrorKind.SHORT_PAYLOAD, f"{field} needs {n} bytes, {self.rest()} left")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def u8(self, field: str) -> int:
        return self.bytes(field, 1)[0]

    def u16(self, field: str) -> int:
        return int.from_bytes(self.bytes(field, 2), "big")

    def u32(self, field: str) -> int:
        return int.from_bytes(self.bytes(field, 4), "big")

    def u64(self, field: str) -> int:
        return int.from_bytes(self.bytes(field, 8), "big")

    def result(self) -> ResultCode:
        code = self.u8("result")
        try:
            return ResultCode(code)
        except ValueError:
            raise _PayloadError(FrameErrorKind.UNKNOWN_RESULT, f"unknown result code {code}") from None

    def text(self) -> str:
        length = self.u16("text_len")
        if length > MAX_TEXT_LEN:
            raise _PayloadError(FrameErrorKind.TEXT_TOO_LONG, f"text of {length} bytes over limit {MAX_TEXT_LEN}")
        raw = self.bytes("text", length)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _PayloadError(FrameErrorKind.BAD_UTF8, "text is not valid UTF-8") from None

    def retry_after_ms(self) -> int | None:
        """The optional trailing `retry_after_ms` (shake-reply, error, kick): present only when
        not 0, so that every message has one encoding."""
        if not self.rest():
            return None
        retry_after_ms = self.u32("retry_after_ms")
        if retry_after_ms == 0:
            raise _PayloadError(FrameErrorKind.ZERO_RETRY_AFTER, "retry_after_ms 0 is sent by leaving it out")
        return retry_after_ms


def _decode_payload(kind: int, r: _Reader) -> Message:
    message: Message
    if kind == m.Login.KIND:
        user_id = r.u64("user_id")
        length = r.u16("token_len")
        if length > MAX_TOKEN_LEN:
            raise _PayloadError(FrameErrorKind.TOKEN_TOO_LONG, f"token of {length} bytes over limit {MAX_TOKEN_LEN}")
        token = r.bytes("token", length)
        # A JWT's compact form: printable ASCII only.
        if not all(0x20 < b < 0x7F for b in token):
            raise _PayloadError(FrameErrorKind.TOKEN_NOT_ASCII, "token is not printable ASCII (a JWT's compact form)")
        message = m.Login(user_id, token)
    elif kind == m.Shake.KIND:
        message = m.Shake()
    elif kind == m.Send.KIND:
        amount_cents = r.u64("amount_cents")
        shares = r.u32("shares")
        count = r.u16("count")
        if count > MAX_RECIPIENTS:
            raise _PayloadError(FrameErrorKind.TOO_MANY_RECIPIENTS, f"{count} recipients over limit {MAX_RECIPIENTS}")
        ids = r.bytes("recipients", count * 8)
        recipients = struct.unpack(f">{count}Q", ids)
        key = None
        if r.rest():
            raw_key = r.bytes("key", r.u8("key_len"))
            key = raw_key.decode("ascii", errors="replace")
            if not valid_idempotency_key(key):
                raise _PayloadError(FrameErrorKind.BAD_IDEMPOTENCY_KEY,
                                    "idempotency key is not 1..=64 bytes of printable ASCII")
        message = m.Send(amount_cents, shares, recipients, key)
    elif kind == m.Open.KIND:
        message = m.Open(r.u64("packet_id"))
    elif kind == m.Chat.KIND:
        message = m.Chat(r.u64("to_user"), r.text())
    elif kind == m.Ping.KIND:
        message = m.Ping(r.u64("client_time_us"))
    elif kind == m.LoginReply.KIND:
        message = m.LoginReply(r.result(), r.u64("user_id"))
    elif kind == m.ShakeReply.KIND:
        result, packet_id, amount_cents = r.result(), r.u64("packet_id"), r.u64("amount_cents")
        message = m.ShakeReply(result, packet_id, amount_cents, r.retry_after_ms())
    elif kind == m.SendReply.KIND:
        message = m.SendReply(r.result(), r.u64("packet_id"), r.u64("balance_cents"))
    elif kind == m.OpenReply.KIND:
        message = m.OpenReply(r.result(), r.u64("packet_id"), r.u64("amount_cents"))
    elif kind == m.ChatReply.KIND:
        message = m.ChatReply(r.result())
    elif kind == m.Pong.KIND:
        message = m.Pong(r.u64("client_time_us"), r.u64("server_time_us"))
    elif kind == m.Error.KIND:
        result, text = r.result(), r.text()
        message = m.Error(result, text, r.retry_after_ms())
    elif kind == m.PacketNotice.KIND:
        message = m.PacketNotice(r.u64("packet_id"), r.u64("from_user"), r.u64("amount_cents"),
                                 r.u32("shares"), r.u64("expires_at_ms"))
    elif kind == m.ChatMessage.KIND:
        message = m.ChatMessage(r.u64("from_user"), r.text())
    elif kind == m.Broadcast.KIND:
        message = m.Broadcast(r.u64("server_time_us"), r.text())
    elif kind == m.Kick.KIND:
        code = r.u8("reason")
        try:
            reason = KickReason(code)
        except ValueError:
            raise _PayloadError(FrameErrorKind.UNKNOWN_KICK_REASON, f"unknown kick reason {code}") from None
        message = m.Kick(reason, r.text(), r.retry_after_ms())
    elif kind == m.Refresh.KIND:
        message = m.Refresh(r.u64("expires_at_ms"))
    else:  # BY_KIND and this chain list the same codes
        raise AssertionError(f"type 0x{kind:02x} has a class but no decoder")
    if r.rest():
        raise _PayloadError(FrameErrorKind.TRAILING_PAYLOAD, f"{r.rest()} bytes after the last field")
    return message


def _text(text: str) -> bytes:
    raw = truncate_text(text)
    return _U16.pack(len(raw)) + raw


def _encode_payload(message: Message) -> bytes:
    match message:
        case m.Login(user_id=user_id, token=token):
            token = token[:0xFFFF]
            return _U64.pack(user_id) + _U16.pack(len(token)) + token
        case m.Shake():
            return b""
        case m.Send(amount_cents=amount_cents, shares=shares, recipients=recipients, idempotency_key=key):
            recipients = tuple(recipients[:0xFFFF])
            out = struct.pack(f">QIH{len(recipients)}Q", amount_cents, shares, len(recipients), *recipients)
            if key is not None:
                raw_key = key.encode("utf-8")[:255]
                out += bytes((len(raw_key),)) + raw_key
            return out
        case m.Open(packet_id=packet_id):
            return _U64.pack(packet_id)
        case m.Chat(to_user=to_user, text=text):
            return _U64.pack(to_user) + _text(text)
        case m.Ping(client_time_us=client_time_us):
            return _U64.pack(client_time_us)
        case m.LoginReply(result=result, user_id=user_id):
            return struct.pack(">BQ", result, user_id)
        case m.ShakeReply(result=result, packet_id=packet_id, amount_cents=amount_cents, retry_after_ms=retry):
            out = struct.pack(">BQQ", result, packet_id, amount_cents)
            return out + _U32.pack(retry) if retry else out
        case m.SendReply(result=result, packet_id=packet_id, balance_cents=balance_cents):
            return struct.pack(">BQQ", result, packet_id, balance_cents)
        case m.OpenReply(result=result, packet_id=packet_id, amount_cents=amount_cents):
            return struct.pack(">BQQ", result, packet_id, amount_cents)
        case m.ChatReply(result=result):
            return bytes((result,))
        case m.Pong(client_time_us=client_time_us, server_time_us=server_time_us):
            return struct.pack(">QQ", client_time_us, server_time_us)
        case m.Error(result=result, text=text, retry_after_ms=retry):
            out = bytes((result,)) + _text(text)
            return out + _U32.pack(retry) if retry else out
        case m.PacketNotice(packet_id=p, from_user=f, amount_cents=a, shares=s, expires_at_ms=e):
            return struct.pack(">QQQIQ", p, f, a, s, e)
        case m.ChatMessage(from_user=from_user, text=text):
            return _U64.pack(from_user) + _text(text)
        case m.Broadcast(server_time_us=server_time_us, text=text):
            return _U64.pack(server_time_us) + _text(text)
        case m.Kick(reason=reason, text=text, retry_after_ms=retry):
            out = bytes((reason,)) + _text(text)
            return out + _U32.pack(retry) if retry else out
        case m.Refresh(expires_at_ms=expires_at_ms):
            return _U64.pack(expires_at_ms)
    raise TypeError(f"not a protocol message: {message!r}")
