# Sourced by the benchmarks' --verify tests (tutti_bench_verify_test.sh, uring_vs_fio_verify_test.sh) after
# they set `bench` (the program under test) and `dir` (a scratch folder): one definition of run().
#   run EXPECTED_EXIT PATTERN ARGS...: runs "$bench" ARGS (at most 60 s) and checks its exit status and that
#   a line of its output matches the extended regular expression PATTERN; counts failures in $failures.
# The caller ends with [ "$failures" -eq 0 ].
failures=0
run() {
  local want=$1 pattern=$2
  shift 2
  set +e
  timeout 60 "$bench" "$@" >"$dir/out.txt" 2>&1
  local rc=$?
  set -e
  if [ "$rc" -ne "$want" ] || ! grep -Eq -- "$pattern" "$dir/out.txt"; then
    echo "FAIL: $* -> exit $rc (want $want, output with '$pattern'):"
    cat "$dir/out.txt"
    failures=$((failures + 1))
  else
    echo "ok: $* -> exit $rc"
  fi
}
