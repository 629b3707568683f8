#!/usr/bin/env bash
# Runs a command in a network namespace of its own whose established-socket hash is sized
# for CONNS connections (as `hongbao bench --netns` does for itself), with loopback up and
# doctor's per-namespace sysctls applied there; removes the namespace afterwards. For the
# same-client sittings at the seed's million (issue 28 item 5): the host's first
# namespace has a hash sized at boot (262,144 buckets, ~8 sockets a bucket at a million
# connections, 10% of the machine in the lookup), so the floor and hongbao are measured
# in the same sized namespace, one after the other.
#
#   scripts/in-sized-netns.sh CONNS COMMAND [ARG...]   (root; kernel >= 6.1)
#
# e.g. scripts/in-sized-netns.sh 1000000 env CAMPAIGNS=none \
#        scripts/same-client.sh 1000000 30000 300 3 target/release/hongbao
set -euo pipefail
cd "$(dirname "$0")/.."
conns=$1; shift
bin=${HONGBAO:-$PWD/target/release/hongbao}
ns=hb-sized-$$
child=/proc/sys/net/ipv4/tcp_child_ehash_entries
# doctor's size (ehash_buckets_wanted): 2·CONNS up to a power of two, 2^16..2^24
buckets=1; while [ $buckets -lt $(( 2 * conns )) ]; do buckets=$(( buckets * 2 )); done
[ $buckets -ge 65536 ] || buckets=65536
[ $buckets -le 16777216 ] || buckets=16777216
before=$(cat $child)
# The host's value comes back whatever happens; only the new namespace gets the size.
trap 'echo "$before" > $child; ip netns delete $ns 2>/dev/null || true' EXIT
echo $buckets > $child
ip netns add $ns
echo "$before" > $child
ip netns exec $ns ip link set lo up
ip netns exec $ns "$bin" doctor --apply --connections "$conns" > /dev/null
echo "in-sized-netns: namespace $ns, established hash $(ip netns exec $ns cat /proc/sys/net/ipv4/tcp_ehash_entries) buckets (the host's: $(cat /proc/sys/net/ipv4/tcp_ehash_entries))"
ip netns exec $ns "$@"
