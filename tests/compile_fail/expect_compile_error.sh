#!/usr/bin/env bash
# expect_compile_error.sh EXPECT(fail|pass) SOURCE "WORDS" -- COMPILER ARGS...
# Compiles SOURCE; with EXPECT=fail, succeeds only if compilation fails AND the diagnostics contain WORDS.
set -u
expect=$1 source=$2 words=$3
shift 4
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if "$@" -fsyntax-only "$source" >"$log" 2>&1; then compiled=yes; else compiled=no; fi
if [ "$expect" = pass ]; then
  [ "$compiled" = yes ] && exit 0
  echo "expected $source to compile:"; cat "$log"; exit 1
fi
if [ "$compiled" = yes ]; then echo "expected $source NOT to compile, but it did"; exit 1; fi
if ! grep -qF -- "$words" "$log"; then echo "diagnostics for $source lack '$words':"; cat "$log"; exit 1; fi
echo "$source: fails to compile with: $words"
