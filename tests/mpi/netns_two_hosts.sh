#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by a veth pair (each with its own
# loopback), made by this test and removed afterwards. mpirun runs in the first; Open MPI starts
# the second host's daemon through an rsh agent that enters the second namespace, and the ranks
# talk over TCP across the veth link only, as between two machines.
# Needs root (CAP_NET_ADMIN) and iproute2; otherwise it says why and exits 77 (skipped).
# Usage: netns_two_hosts.sh MPIRUN PROGRAM [ARG...]
set -euo pipefail
mpirun="$1"
shift
skip() { echo "netns_two_hosts: SKIPPED: $*"; exit 77; }
command -v ip > /dev/null || skip "no 'ip' command (iproute2)"
[[ $(id -u) == 0 ]] || skip "making network namespaces needs root"

id=$$
a="mwA$id" b="mwB$id"
net="10.213.$((id % 250)).0"
ip_a="${net%.0}.1" ip_b="${net%.0}.2"
dir=$(mktemp -d)
cleanup() {
    ip netns del "$a" 2> /dev/null || true
    ip netns del "$b" 2> /dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
ip netns add "$a" 2> "$dir/err" || skip "ip netns add is not permitted here: $(cat "$dir/err")"
ip netns add "$b"
ip link add "va$id" type veth peer name "vb$id"
ip link set "va$id" netns "$a"
ip link set "vb$id" netns "$b"
ip -n "$a" addr add "$ip_a/24" dev "va$id"
ip -n "$b" addr add "$ip_b/24" dev "vb$id"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "va$id" up
ip -n "$b" link set "vb$id" up

# The rsh agent: "agent HOST COMMAND..." runs COMMAND (a shell line, as ssh would) in HOST's
# namespace, and notes where it went.
cat > "$dir/agent" << AGENT
#!/bin/sh
host=\$1
shift
case "\$host" in
$ip_a) ns=$a ;;
$ip_b) ns=$b ;;
*) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
echo "\$host \$ns" >> "$dir/launched"
exec ip netns exec "\$ns" sh -c "\$*"
AGENT
chmod +x "$dir/agent"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rc=0
timeout 120 ip netns exec "$a" "$mpirun" --oversubscribe --mca plm_rsh_agent "$dir/agent" \
    --mca plm_rsh_no_tree_spawn 1 --host "$ip_a:1,$ip_b:1" -n 2 \
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$net/24" \
    --mca oob_tcp_if_include "$net/24" "$@" || rc=$?
grep -q "^$ip_b $b\$" "$dir/launched" 2> /dev/null \
    || { echo "netns_two_hosts: the second host was never entered" >&2; exit 1; }
[[ $rc == 0 ]] || { echo "netns_two_hosts: the job failed ($rc)" >&2; exit 1; }
echo "netns_two_hosts: 2 ranks on 2 network namespaces over TCP ($net/24): passed"
