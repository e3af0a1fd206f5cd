#!/usr/bin/env bash
# Expert parallelism across hosts, on one machine: three network namespaces joined by veth pairs
# to a bridge (its own namespace), one rank per namespace, OpenMPI over TCP between them (no
# shared memory: btl tcp,self), its daemons started in each namespace by an rsh agent that runs
# `ip netns exec` instead of ssh. Runs the dist tests (forward bit for bit, errors) and
# `moekit forward --expert-parallel` against one process across the namespaces.
# Exits 77 (skipped, with a message) where the machine does not allow namespaces (not root, no
# iproute2, no veth). Usage: netns.sh DIST_TESTS_BIN MOEKIT_BIN MPIEXEC GOLDENS_DIR [-- CMD...]
# With `-- CMD...` it runs CMD under the same three-host mpirun instead (benchmarks).
set -euo pipefail
tests="$1" bin="$2" mpiexec="$3" goldens="$4"
shift 4
[[ "${1:-}" == "--" ]] && shift
tag="mk$$"
hub="${tag}hub"
work="$(mktemp -d)"
cleanup() {
  for i in 0 1 2; do ip netns del "${tag}n$i" 2>/dev/null || true; done
  ip netns del "$hub" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
skip() { echo "SKIPPED: $1 — the multi-host test did not run" >&2; exit 77; }
[[ "$(id -u)" -eq 0 ]] || skip "not root (network namespaces need CAP_SYS_ADMIN)"
command -v ip >/dev/null || skip "no 'ip' (iproute2)"
ip netns add "$hub" 2>/dev/null || skip "'ip netns add' is not allowed here"
ip -n "$hub" link add br0 type bridge 2>/dev/null || skip "no bridge device"
ip -n "$hub" link set br0 up
hosts=()
for i in 0 1 2; do
  ns="${tag}n$i" addr="10.77.$(( $$ % 200 )).$((i + 1))"
  ip netns add "$ns"
  ip link add "${tag}v$i" netns "$hub" type veth peer name eth0 netns "$ns" 2>/dev/null || skip "no veth pairs"
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$hub" link set "${tag}v$i" master br0
  ip -n "$hub" link set "${tag}v$i" up
  hosts+=("$addr")
  # Each namespace's daemon gets its own TMPDIR: they share /tmp and the host name, and OpenMPI's
  # session directories (/tmp/ompi.<host>.<uid>/jf.<job>) collided ("File exists") when two made
  # theirs at once.
  mkdir -p "$work/tmp$i"
  echo "$addr) exec ip netns exec $ns env TMPDIR=$work/tmp$i sh -c \"\$*\" ;;" >>"$work/cases"
done
subnet="10.77.$(( $$ % 200 )).0/24"
{
  echo '#!/bin/sh'
  echo '# OpenMPI rsh agent: "agent HOST CMD..." runs CMD in the namespace that has address HOST.'
  echo 'host="$1"; shift'
  echo 'case "$host" in'
  cat "$work/cases"
  echo '*) echo "agent: unknown host $host" >&2; exit 1 ;;'
  echo 'esac'
} >"$work/agent"
chmod +x "$work/agent"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run3() {
  timeout 300 ip netns exec "${tag}n0" "$mpiexec" --host "$(IFS=,; echo "${hosts[*]}")" -np 3 \
    --mca plm_rsh_agent "$work/agent" --mca btl tcp,self --mca btl_tcp_if_include "$subnet" \
    --mca oob_tcp_if_include "$subnet" --mca mpi_yield_when_idle 1 --mca rtc ^hwloc -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
    -x OMP_NUM_THREADS "$@"
}
export OMP_NUM_THREADS=1
if [[ $# -gt 0 ]]; then run3 "$@"; exit; fi

# Each rank really is in its own namespace, with its own address.
run3 sh -c 'ip -4 -o addr show eth0 | grep -o "10\.77\.[0-9]*\.[0-9]*"' | sort >"$work/addrs"
[[ "$(wc -l <"$work/addrs")" -eq 3 && "$(sort -u "$work/addrs" | wc -l)" -eq 3 ]] ||
  { echo "FAIL: the ranks did not land in three namespaces:" >&2; cat "$work/addrs" >&2; exit 1; }
echo "ranks on $(tr '\n' ' ' <"$work/addrs")(one namespace each, TCP between them)"
run3 "$tests" --gtest_color=no
dir="$goldens/deepseek_v3"
"$bin" forward --model "$dir" --layer 1 --input "$dir/input.npy" --output "$work/y1.npy" --ids-out "$work/i1.npy"
run3 "$bin" forward --expert-parallel --model "$dir" --layer 1 --input "$dir/input.npy" --output "$work/y.npy" \
  --ids-out "$work/i.npy"
cmp "$work/y1.npy" "$work/y.npy" && cmp "$work/i1.npy" "$work/i.npy"
echo "ok: moekit forward --expert-parallel over 3 namespaces equals one process byte for byte"
