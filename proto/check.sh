#!/usr/bin/env bash
# Checks the gRPC contract (proto/notify/v1) with buf: `buf lint` (STANDARD,
# with the exceptions commented in proto/buf.yaml) and `buf breaking` against
# the last released contract. Exits non-zero on any failure.
#
#   proto/check.sh                    # buf fetched on first use
#   BUF=/path/to/buf proto/check.sh   # one given buf binary instead
#   proto/check.sh --release 0.2.0    # at a release: the checks, then the new
#                                     # baseline released/notify-v0.2.0.json
#
# The baseline is committed, because CI's checkout has no tags and may have a
# shallow history: released/notify-v<version>.json is the buf image (JSON,
# without source info, so that a release's diff shows what changed) of the
# contract that <version> ships, and `buf breaking` runs against the newest
# one (by version). At each release, run `proto/check.sh --release <version>`
# on the released commit and commit the file it writes.
#
# buf comes from the npm package that ships its static binary for the
# machine (@bufbuild/buf-linux-x64, ...: what @bufbuild/buf installs), pinned
# below and checked against the sha256 sums below. It is unpacked into
# $NOTIFY_BUF_TOOLS (default: ${TMPDIR:-/tmp}/notify-buf-tools), never into
# the repository, which also holds buf's cache.
#
# Both checks are also shown to fail, on a scratch copy of the module: one
# with an RPC outside message.proto that returns a shared type (the lint
# exceptions must not cover it) and one with a field number changed.
set -euo pipefail
shopt -s inherit_errexit

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tools=${NOTIFY_BUF_TOOLS:-${TMPDIR:-/tmp}/notify-buf-tools}
buf_version=1.75.0
# uname -m | npm package | sha256 of its bin/buf
buf_sources=(
  "x86_64|@bufbuild/buf-linux-x64|fad1e38d6909bbb583a4da81d8c02a01046e2cd663bde7e337dd24277393764b"
  "aarch64|@bufbuild/buf-linux-aarch64|00eb190aa82df17f393e05b04889cc60a0b13b3259d336e21a87d5f23ab4fd26"
)

log() { printf '==> %s\n' "$*" >&2; }

usage() {
  echo "usage: proto/check.sh [--release X.Y.Z]" >&2
  exit 2
}

release=
case $# in
0) ;;
2)
  [[ $1 == --release && $2 =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || usage
  release=$2
  ;;
*) usage ;;
esac

# Prints the path of a verified buf binary, fetching it if missing.
fetch_buf() {
  local arch machine package sum source
  arch=$(uname -m)
  [[ $(uname -s) == Linux ]] || arch=unsupported
  for source in "${buf_sources[@]}"; do
    IFS='|' read -r machine package sum <<<"$source"
    [[ $machine == "$arch" ]] && break
    package=
  done
  [[ -n $package ]] || {
    echo "no pinned buf for $(uname -sm); set BUF=/path/to/buf ($buf_version)" >&2
    return 1
  }
  local bin="$tools/buf-$buf_version-$arch/buf"
  if [[ -x $bin ]] && echo "$sum  $bin" | sha256sum --check --status; then
    echo "$bin"
    return
  fi
  command -v npm >/dev/null || { echo "npm is needed to fetch buf (or set BUF)" >&2; return 1; }
  log "fetching buf from npm package $package@$buf_version"
  mkdir -p "$tools"
  local work
  work=$(mktemp -d "$tools/fetch.XXXXXX")
  # npm checks the tarball against the registry's integrity; the pinned sum
  # below checks the binary against what this script was written with.
  (cd "$work" && npm pack --silent "$package@$buf_version" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work" package/bin/buf
  echo "$sum  $work/package/bin/buf" | sha256sum --check --status || {
    echo "sha256 of bin/buf in $package@$buf_version does not match the pinned one" >&2
    rm -rf "$work"
    return 1
  }
  mkdir -p "$(dirname "$bin")"
  chmod 0755 "$work/package/bin/buf"
  mv "$work/package/bin/buf" "$bin"
  rm -rf "$work"
  echo "$bin"
}

if [[ -n ${BUF:-} ]]; then
  buf=$BUF
else
  buf=$(fetch_buf)
fi
# buf keeps a module cache (unused while the module has no dependencies).
export BUF_CACHE_DIR="$tools/cache"
log "buf $("$buf" --version) ($buf)"

shopt -s nullglob
baselines=("$here"/released/notify-v*.json)
shopt -u nullglob
[[ ${#baselines[@]} -gt 0 ]] || {
  echo "no released contract in $here/released (notify-v<version>.json)" >&2
  exit 1
}
baseline=$(printf '%s\n' "${baselines[@]}" | sort -V | tail -n 1)

# check, must_fail_with, $out, $passed, $failed
# shellcheck source=scripts/checks.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../scripts/checks.sh"


buf_in() { # module directory, buf args...
  local dir=$1
  shift
  (cd "$dir" && "$buf" "$@")
}

# A copy of the module in $out/<name> with one sed script applied to one file;
# fails when the script changes nothing (the check would prove nothing).
scratch_copy() { # name, file in the module, sed script
  local dir="$out/$1" file="$out/$1/$2" before
  rm -rf "$dir"
  mkdir -p "$dir"
  cp -R "$here/buf.yaml" "$here/notify" "$dir/"
  before=$(sha256sum <"$file")
  sed -i "$3" "$file"
  [[ $(sha256sum <"$file") != "$before" ]] || {
    echo "the sed script '$3' changed nothing in $2"
    return 1
  }
}

lint_catches() {
  scratch_copy bad-lint notify/v1/inbox.proto \
    '/rpc BatchGetUnreadCounts/a\  rpc GetInboxItem(GetUnreadCountRequest) returns (InboxItem);' &&
    must_fail_with 'RPC response type "InboxItem" should be named "GetInboxItemResponse"' \
      buf_in "$out/bad-lint" lint
}

breaking_catches() {
  scratch_copy bad-breaking notify/v1/message.proto 's/uint32 interval_ms = 2;/uint32 interval_ms = 3;/' &&
    must_fail_with 'Previously present field "2" with name "interval_ms" on message "WatchMessageRequest" was deleted' \
      buf_in "$out/bad-breaking" breaking --against "$baseline"
}

check "buf lint" buf_in "$here" lint
check "buf breaking against ${baseline#"$here"/}" buf_in "$here" breaking --against "$baseline"
check "a lint violation (an RPC returning a shared type in inbox.proto) is caught" lint_catches
check "a breaking change (a field number changed) is caught" breaking_catches

echo "buf: $passed passed, $failed failed"
[[ $failed -eq 0 ]]

if [[ -n $release ]]; then
  target="$here/released/notify-v$release.json"
  [[ ! -e $target ]] || { echo "$target exists already" >&2; exit 1; }
  newest=$(printf '%s\n' "${baseline##*/notify-v}" "$release.json" | sort -V | tail -n 1)
  [[ $newest == "$release.json" ]] || {
    echo "$release is not newer than ${baseline##*/}" >&2
    exit 1
  }
  command -v python3 >/dev/null || { echo "python3 is needed to indent the image" >&2; exit 1; }
  buf_in "$here" build --exclude-source-info -o '-#format=json' |
    python3 -c 'import json, sys; json.dump(json.load(sys.stdin), sys.stdout, indent=2); print()' \
      >"$out/image.json"
  mv "$out/image.json" "$target"
  echo "wrote ${target#"$here"/}: commit it"
fi
