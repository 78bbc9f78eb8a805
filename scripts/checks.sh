# shellcheck shell=bash
# Counted checks for the lint scripts (helm/lint.sh, proto/check.sh), sourced
# by them: `check "what" command...` prints `ok` or `FAIL` (with the command's
# output indented) and counts into $passed and $failed; `must_fail_with
# message command...` succeeds when the command fails saying `message`.
# Sets $out, a scratch directory removed at exit.

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
passed=0
failed=0

check() { # description, command...
  local what=$1
  shift
  if "$@" >"$out/log" 2>&1; then
    passed=$((passed + 1))
    printf 'ok    %s\n' "$what"
  else
    failed=$((failed + 1))
    printf 'FAIL  %s\n' "$what"
    sed 's/^/      /' "$out/log"
  fi
}

# Succeeds when the command fails and its output says why (the message).
must_fail_with() { # message, command...
  local message=$1 output
  shift
  if output=$("$@" 2>&1); then
    echo "succeeded, expected a failure saying: $message"
    return 1
  fi
  grep -qF -- "$message" <<<"$output" || {
    echo "failed, but without saying: $message"
    echo "$output"
    return 1
  }
}
