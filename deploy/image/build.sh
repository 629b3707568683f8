#!/usr/bin/env bash
# Builds hongbao's OCI image from a built binary, with podman or buildah and no registry
# (FROM scratch: nothing is pulled). The context is staged in a temporary directory:
#   rootfs/usr/local/bin/hongbao   the binary, its debug info stripped (KEEP_DEBUG=1 keeps it)
#   rootfs/<path>                  every shared library ldd names, and the dynamic loader,
#                                  at the path the binary finds it
#   rootfs/etc/passwd, etc/group   root and the user the image runs as, hongbao (10001)
#   rootfs/tmp                     mode 1777
#   state/                         an empty /var/lib/hongbao, owned by hongbao
#
# usage: deploy/image/build.sh [BINARY] [TAG]
#   BINARY  default target/release/hongbao (cargo build --release)
#   TAG     default localhost/hongbao:latest
# BUILDER=podman|buildah picks the tool (default: podman if installed, else buildah).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
binary=${1:-$repo/target/release/hongbao}
tag=${2:-localhost/hongbao:latest}
uid=10001

die() { echo "build.sh: $*" >&2; exit 1; }

[ -x "$binary" ] || die "no executable at $binary (cargo build --release first, or name one)"
builder=${BUILDER:-}
if [ -z "$builder" ]; then
  if command -v podman >/dev/null; then builder=podman
  elif command -v buildah >/dev/null; then builder=buildah
  else die "neither podman nor buildah is installed (apt-get install podman buildah)"
  fi
fi

ctx=$(mktemp -d "${TMPDIR:-/tmp}/hongbao-image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
rootfs=$ctx/rootfs
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/tmp" "$ctx/state"
chmod 1777 "$rootfs/tmp"

# The binary: debug info out (the release profile keeps line tables: 153 MB → 25.5 MB),
# symbols kept, so a backtrace still names functions.
if [ "${KEEP_DEBUG:-0}" != 1 ] && command -v strip >/dev/null; then
  strip --strip-debug -o "$rootfs/usr/local/bin/hongbao" "$binary"
else
  cp "$binary" "$rootfs/usr/local/bin/hongbao"
fi
chmod 0755 "$rootfs/usr/local/bin/hongbao"

# Exactly what it links: each "name => /path (addr)" and the loader's "/path (addr)";
# the vDSO has no file. A library not found stops the build.
libs=$(ldd "$binary" 2>&1) || true
if grep -q 'not found' <<<"$libs"; then
  die "a library the binary links is missing here: $(grep 'not found' <<<"$libs")"
fi
count=0
while read -r path; do
  [ -n "$path" ] || continue
  install -D -m 0755 "$(readlink -f "$path")" "$rootfs$path"
  count=$((count + 1))
done < <(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$libs" | sort -u)
if [ "$count" -eq 0 ] && ! grep -qE 'statically linked|not a dynamic executable' <<<"$libs"; then
  die "ldd named no library and did not say the binary is static: $libs"
fi

# Who the image runs as; the names make ps and ls readable, nothing logs in.
cat >"$rootfs/etc/passwd" <<EOF
root:x:0:0:root:/root:/sbin/nologin
hongbao:x:$uid:$uid:hongbao:/var/lib/hongbao:/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<EOF
root:x:0:
hongbao:x:$uid:
EOF

cp "$here/Containerfile" "$ctx/Containerfile"
version=$("$binary" --version 2>/dev/null | awk '{ print $2 }') || version=unknown
revision=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null) || revision=unknown
labels=(
  --label "org.opencontainers.image.title=hongbao"
  --label "org.opencontainers.image.version=$version"
  --label "org.opencontainers.image.revision=$revision"
  --label "org.opencontainers.image.licenses=MIT"
)
# --timestamp 0: the same binary gives the same image, whenever it is built.
case "$builder" in
  podman) podman build --quiet --timestamp 0 "${labels[@]}" -t "$tag" -f "$ctx/Containerfile" "$ctx" >/dev/null ;;
  buildah) buildah build --quiet --timestamp 0 "${labels[@]}" -t "$tag" -f "$ctx/Containerfile" "$ctx" >/dev/null ;;
  *) die "BUILDER must be podman or buildah, not $builder" ;;
esac

size=$("$builder" images --format '{{.Size}}' "$tag" 2>/dev/null | head -1) || size=unknown
echo "built $tag with $builder: hongbao $version ($revision), $count shared libraries, $size"
