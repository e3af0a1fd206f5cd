# Shared by cli_forward.sh and cli_backward.sh (sourced; they set bin, mpiexec, goldens, work).

# The MoE layer index of the golden checkpoint folder `$1` (manifest.json).
layer_of() { python3 -c "import json,sys; m=json.load(open('$goldens/manifest.json')); print([c['layer'] for c in m['cases'] if c['dir']=='$1'][0])"; }

# The number of routed experts of the golden `$1` (its config.json names it one of three ways).
experts_of() {
  python3 -c "import json; c=json.load(open('$goldens/$1/config.json')); print(next(c[k] for k in ('n_routed_experts', 'num_local_experts', 'num_experts') if c.get(k)))"
}

# A placement of E=$1 experts on N=$2 ranks that is neither contiguous nor ascending: expert e
# on rank (E - 1 - e) mod N.
scattered_placement() { python3 -c "print(','.join(str(($1 - 1 - e) % $2) for e in range($1)))"; }

# expect_failure NAME PATTERN COMMAND ARGS...: `mpirun -np 3 moekit COMMAND --expert-parallel
# ARGS...` must end every rank within the timeout, exit non-zero and print exactly one
# "moekit: error:" line containing PATTERN.
expect_failure() {
  local name="$1" pattern="$2" command="$3"
  shift 3
  local start=$SECONDS rc=0
  timeout 60 "$mpiexec" -np 3 --oversubscribe "$bin" "$command" --expert-parallel "$@" >"$work/out" 2>"$work/err" ||
    rc=$?
  local took=$((SECONDS - start))
  [[ $rc -ne 0 && $rc -ne 124 ]] || { echo "FAIL: $name: exit $rc (124: timed out)" >&2; cat "$work/err" >&2; exit 1; }
  local n
  n=$(grep -c "moekit: error:" "$work/err" || true)
  [[ $n -eq 1 ]] || { echo "FAIL: $name: the error was printed $n times" >&2; cat "$work/err" >&2; exit 1; }
  grep -q -- "$pattern" "$work/err" || { echo "FAIL: $name: no '$pattern' in the message" >&2; cat "$work/err" >&2; exit 1; }
  echo "ok: $name ended in ${took}s with one message: $(grep 'moekit: error:' "$work/err")"
}
