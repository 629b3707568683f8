"""Turns the version-1 golden vectors into version 2 (issue 44), independently of the
Rust encoder: every frame's version byte is 2; a login's token length is a u16 and its
token a JWT's bytes; result 18 (rate-limited), kick reasons 7 and 8 (expired, revoked),
error's trailing retry_after_ms and the refresh push are new."""
import sys, struct

src = open(sys.argv[1], encoding="utf-8").read().splitlines()

def frame(kind, req, payload, version=2):
    body = bytes([version, kind]) + struct.pack(">I", req) + payload
    return struct.pack(">I", len(body)) + body

def text(t):
    b = t.encode()
    return struct.pack(">H", len(b)) + b

def pct(t):
    out = []
    for ch in t:
        b = ch.encode()
        if ch in "% |" or (len(b) == 1 and (b[0] < 0x20 or b[0] == 0x7f)):
            out.append("".join("%%%02X" % x for x in b))
        else:
            out.append(ch)
    return "".join(out)

JWT = ("eyJhbGciOiJIUzI1NiIsImtpZCI6ImhvbmdiYW8iLCJ0eXAiOiJKV1QifQ."
       "eyJzdWIiOiI0MiIsImV4cCI6MTgwMDAwMzYwMCwiaWF0IjoxODAwMDAwMDAwfQ."
       "3n0kS3l9GJ3wZb0m2J8Qk5sD1pXn7mF0aYqK8cWv4uE")

def login(req, user, token):
    return frame(0x01, req, struct.pack(">QH", user, len(token)) + token)

out = []
for line in src:
    if line.startswith("#") or not line.strip():
        out.append(line)
        continue
    name, hexs, form = line.split(" | ")
    b = bytearray(bytes.fromhex(hexs))
    if name.startswith("login") and not name.startswith("login-reply"):
        if name == "login":
            tok = JWT.encode()
            out.append(f"login | {login(1, 42, tok).hex()} | type=login request_id=1 user_id=42 token={tok.hex()}")
            tok0 = JWT.encode()
            out.append(f"login-any-user | {login(2, 0, tok0).hex()} | type=login request_id=2 user_id=0 token={tok0.hex()}")
        elif name == "login-empty-token":
            out.append(f"login-empty-token | {login(3, 0, b'').hex()} | type=login request_id=3 user_id=0 token=")
        # login-hex-token: gone (tokens are JWTs, sent as they are)
        continue
    if name == "invalid":
        kind = form
        if kind == "bad-version" and hexs == "00000006020200000001":
            out[-1] = "# version 3, one past the newest"
            out.append("invalid | 00000006030200000001 | bad-version")
            continue
        if len(b) > 4 and kind not in ("bad-version",):
            b[4] = 2
        if hexs.startswith("0000001901010000000e"):
            # login announcing a 32-byte token, 10 present (u16 length now)
            p = struct.pack(">QH", 42, 32) + bytes.fromhex("2093c121e7aa437a1e01")[:10]
            b = bytearray(frame(0x01, 14, p))
        if hexs.startswith("00000050010100000018"):
            out[-1] = "# login token of 2049 bytes, one over MAX_TOKEN_LEN"
            p = struct.pack(">QH", 42, 2049) + b"A" * 2049
            b = bytearray(frame(0x01, 24, p))
        if hexs == "0000000701850000001512":
            out[-1] = "# chat-reply result 19, one past the last code"
            b = bytearray(frame(0x85, 21, bytes([19])))
        if hexs == "00000009019300000000070000":
            out[-1] = "# kick reason 9, one past the last"
            b = bytearray(frame(0x93, 0, bytes([9]) + text("")))
        out.append(f"invalid | {bytes(b).hex()} | {kind}")
        continue
    b[4] = 2
    out.append(f"{name} | {bytes(b).hex()} | {form}")
    if name == "shake-reply-overloaded-retry":
        p = bytes([18]) + struct.pack(">QQI", 0, 0, 250)
        out.append(f"shake-reply-rate-limited | {frame(0x82, 4, p).hex()} | type=shake-reply request_id=4 result=rate-limited packet_id=0 amount_cents=0 retry_after_ms=250")
    if name == "error-unavailable":
        t = "over 1 send a second"
        p = bytes([18]) + text(t) + struct.pack(">I", 1500)
        out.append(f"error-rate-limited | {frame(0x87, 20, p).hex()} | type=error request_id=20 result=rate-limited text={pct(t)} retry_after_ms=1500")
    if name == "kick-shutdown":
        for code, reason, t in [(7, "expired", "the session's token expired"), (8, "revoked", "this user's sessions were revoked")]:
            p = bytes([code]) + text(t)
            out.append(f"kick-{reason} | {frame(0x93, 0, p).hex()} | type=kick request_id=0 reason={reason} text={pct(t)}")
        p = struct.pack(">Q", 1800000003600000)
        out.append(f"refresh | {frame(0x94, 0, p).hex()} | type=refresh request_id=0 expires_at_ms=1800000003600000")
        p = struct.pack(">Q", 0)
        out.append(f"refresh-zero | {frame(0x94, 0, p).hex()} | type=refresh request_id=0 expires_at_ms=0")

text_out = "\n".join(out) + "\n"
# the error's trailing field, and a refresh too short
text_out = text_out.replace(
    "# A shake reply's retry_after_ms written as 0 (it is left out instead).",
    "# An error's retry_after_ms written as 0 (it is left out instead).\n"
    "invalid | " + frame(0x87, 20, bytes([18]) + text("x") + struct.pack(">I", 0)).hex() + " | zero-retry-after\n"
    "# A refresh with 7 bytes of its 8-byte expires_at_ms.\n"
    "invalid | " + frame(0x94, 0, bytes(7)).hex() + " | short-payload\n"
    "# A version-2 login whose token length is one byte (a version-1 layout).\n"
    "invalid | " + frame(0x01, 25, struct.pack(">Q", 42) + bytes([1]) + b"A").hex() + " | short-payload\n"
    "# A shake reply's retry_after_ms written as 0 (it is left out instead).")
sys.stdout.write(text_out)
