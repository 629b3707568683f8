#!/usr/bin/env bash
# Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/ (ignored by git):
# every vector of crates/proto/testdata/golden.txt as a binary frame (frame), its JSON
# form (json), both inside WebSocket frames (ws_frame) and inside an HTTP POST (http),
# plus the hand-written requests and handshakes committed in fuzz/seeds/. Existing corpus
# files are kept (libFuzzer adds what it finds there); seeds are overwritten in place.
#
# Needs python3 for the golden vectors; without it only fuzz/seeds/ is copied.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
corpus=${1:-$here/corpus}
golden=$here/../crates/proto/testdata/golden.txt
for t in frame ws_frame ws_handshake json http; do mkdir -p "$corpus/$t"; done
cp "$here"/seeds/http/* "$corpus/http/"
cp "$here"/seeds/ws_handshake/* "$corpus/ws_handshake/"
if ! command -v python3 >/dev/null; then
  echo "seeds: no python3; seeded from fuzz/seeds only" >&2
  exit 0
fi
python3 - "$golden" "$corpus" <<'PY'
import json, os, re, sys, urllib.parse

golden, corpus = sys.argv[1], sys.argv[2]
written = {}


def put(target, name, data):
    name = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    with open(os.path.join(corpus, target, name), "wb") as f:
        f.write(data)
    written[target] = written.get(target, 0) + 1


def json_form(form):
    """golden.txt's decoded form -> the JSON form (docs/protocol.md, json.rs)."""
    out = {}
    for pair in form.split(" "):
        key, _, value = pair.partition("=")
        if key == "type":
            out["type"] = value.replace("-", "_")
        elif key == "request_id":
            out["id"] = int(value)
        elif key == "recipients":
            out[key] = [int(v) for v in value.split(",") if v]
        elif key == "text":
            out[key] = urllib.parse.unquote_to_bytes(value).decode("utf-8")
        elif key in ("token", "result", "reason", "idempotency_key"):
            out[key] = value
        else:
            out[key] = int(value)
    return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()


def ws_frame(opcode, payload, fin=True, mask=None):
    """One RFC 6455 frame; masked when `mask` (4 bytes) is given."""
    head = bytes([(0x80 if fin else 0) | opcode])
    m = 0x80 if mask else 0
    n = len(payload)
    if n < 126:
        head += bytes([m | n])
    elif n < 1 << 16:
        head += bytes([m | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([m | 127]) + n.to_bytes(8, "big")
    if mask:
        head += mask
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + payload


MASK = bytes.fromhex("37fa213d")
# ws_frame's first two bytes: mode (bit 0: client role, bit 1: small limits), read seed.
SERVER, CLIENT, SERVER_SMALL = 0, 1, 2

frames = []
counts = {}
for line in open(golden, encoding="utf-8"):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    name, hexed, form = (f.strip() for f in line.split(" | "))
    counts[name] = counts.get(name, 0) + 1
    if counts[name] > 1:
        name = f"{name}-{counts[name]}"
    raw = bytes.fromhex(hexed)
    put("frame", f"golden-{name}", raw)
    if name.startswith("invalid"):
        continue
    frames.append(raw)
    js = json_form(form)
    put("json", f"golden-{name}.json", js)
    put("ws_frame", f"golden-{name}-binary", bytes([SERVER, 7]) + ws_frame(2, raw, mask=MASK))
    put("ws_frame", f"golden-{name}-text", bytes([SERVER, 0]) + ws_frame(1, js, mask=MASK))
    put("ws_frame", f"golden-{name}-server", bytes([CLIENT, 3]) + ws_frame(2, raw))
    if len(js) < 300:
        put(
            "http",
            f"golden-{name}",
            b"POST /v1/messages HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\n\r\n" % len(js)
            + js,
        )

# A connection's worth of small frames back to back.
small = [f for f in frames if len(f) < 64]
put("frame", "stream-small-frames", b"".join(small))

# WebSocket: fragments with control frames between them, closes, a 64-bit length.
text = "新年快乐 🧧".encode()
put(
    "ws_frame",
    "fragmented-text-with-ping",
    bytes([SERVER, 1])
    + ws_frame(1, text[:5], fin=False, mask=MASK)
    + ws_frame(9, b"p1", mask=MASK)
    + ws_frame(0, text[5:9], fin=False, mask=MASK)
    + ws_frame(0xA, b"p2", mask=MASK)
    + ws_frame(0, text[9:], mask=MASK)
    + ws_frame(8, (1000).to_bytes(2, "big") + b"bye", mask=MASK),
)
put(
    "ws_frame",
    "fragmented-binary-small-limits",
    bytes([SERVER_SMALL, 2])
    + ws_frame(2, frames[0][:30], fin=False, mask=MASK)
    + ws_frame(0, frames[0][30:], mask=MASK)
    + ws_frame(2, b"x" * 120, mask=MASK),
)
put("ws_frame", "close-empty", bytes([SERVER, 0]) + ws_frame(8, b"", mask=MASK))
put("ws_frame", "close-1008-kick", bytes([CLIENT, 0]) + ws_frame(8, (1008).to_bytes(2, "big") + b"kick: replaced"))
# Only the header of a 64 KiB frame: refused from the header alone.
put("ws_frame", "binary-64bit-length-header", bytes([CLIENT, 200]) + ws_frame(2, bytes(65536))[:14])
put("ws_frame", "ping-max", bytes([SERVER, 9]) + ws_frame(9, b"p" * 125, mask=MASK))

# JSON that is not quite a message.
for name, js in {
    "unknown-type": '{"type":"hongbao","id":3}',
    "negative-id": '{"type":"shake","id":-1}',
    "float-amount": '{"type":"open","id":1,"packet_id":1.5}',
    "escaped-text": '{"type":"chat","id":9,"to_user":2,"text":"\\u0000\\ud83e\\udde7\\"\\\\"}',
    "null-key": '{"type":"send","id":1,"amount_cents":1,"shares":1,"recipients":[2],"idempotency_key":null}',
    "array": "[1,2,3]",
}.items():
    put("json", f"extra-{name}.json", js.encode())

print("seeds: " + " ".join(f"{t}={n}" for t, n in sorted(written.items())), file=sys.stderr)
PY
