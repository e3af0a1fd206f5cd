#!/usr/bin/env bash
# The format check of CI: every C++ line changed since BASE (default: the commit in
# .ci/format-base, where the check was adopted) is as clang-format (.clang-format) writes it.
# Lines nobody touched since keep their hand layout. Prints the needed diff and exits 1 if any.
# Fix with: git clang-format BASE
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-$(cat .ci/format-base)}"
if ! git rev-parse -q --verify "$base^{commit}" >/dev/null; then
  echo "format check: SKIPPED: base commit $base is not in this clone (a shallow clone?); fetch full history to run it" >&2
  exit 0
fi
out="$(git clang-format --diff --extensions cpp,hpp,h,cc "$base" -- src cli include tests bench python/src fuzz 2>&1 || true)"
if grep -q '^diff --git\|^@@' <<<"$out"; then
  printf '%s\n' "$out"
  echo "format check: the lines above, changed since $base, are not as clang-format writes them (git clang-format $base)" >&2
  exit 1
fi
echo "format check: every C++ line changed since ${base:0:12} is formatted"
