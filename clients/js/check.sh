#!/usr/bin/env bash
# Checks the browser SDK is commit-ready: a clean install of the pinned
# devDependencies; a fresh build, with the API types generated from the
# edge's OpenAPI document (so the SDK cannot drift from the edge); the
# TypeScript typechecks against them; the committed bundle and declarations
# equal the fresh build; the bundle is under 20 KB gzipped; the vendored
# axe-core is the installed one; the unit tests pass.
set -euo pipefail
cd "$(dirname "$0")"

fail() {
  echo "check.sh: FAILED: $*" >&2
  exit 1
}
step() { echo "==> $*"; }

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

step "npm ci"
npm ci --quiet --no-audit --no-fund >"$scratch/npm.log" 2>&1 || { cat "$scratch/npm.log" >&2; fail "npm ci"; }

step "a fresh build, its types generated from docs/edge-openapi.json"
node build.mjs "$scratch/dist"

step "typecheck (against those types)"
npx --no-install tsc --noEmit -p tsconfig.json || fail "tsc found type errors"

step "committed dist/ equals the fresh build"
diff -r dist "$scratch/dist" >/dev/null || {
  diff -rq dist "$scratch/dist" >&2 || true
  fail "dist/ differs from a fresh build: run 'npm run build' and commit dist/"
}
cmp dist/notify-inbox.js "$scratch/dist/notify-inbox.js" || fail "dist/notify-inbox.js differs"

step "bundle size"
raw=$(wc -c <dist/notify-inbox.js)
gzipped=$(gzip -9 -c dist/notify-inbox.js | wc -c)
echo "    dist/notify-inbox.js: $raw bytes, $gzipped bytes gzipped (limit 20480)"
[ "$gzipped" -lt 20480 ] || fail "the bundle is $gzipped bytes gzipped, over 20 KB"

step "vendored axe-core equals node_modules'"
cmp vendor/axe.min.js node_modules/axe-core/axe.min.js \
  || fail "vendor/axe.min.js is not node_modules/axe-core/axe.min.js: copy it again (vendor/README.md)"
cmp vendor/axe-core.LICENSE.txt node_modules/axe-core/LICENSE || fail "vendor/axe-core.LICENSE.txt differs from the package's"
version=$(node -p 'require("./node_modules/axe-core/package.json").version')
grep -q "axe-core) $version" vendor/README.md || fail "vendor/README.md does not name axe-core $version"

step "unit tests"
node build.mjs --tests "$scratch/tests"
node --test "$scratch"/tests/*.test.mjs >"$scratch/tests.log" 2>&1 || { cat "$scratch/tests.log" >&2; fail "unit tests"; }
grep -E '^# (tests|pass|fail)' "$scratch/tests.log" | sed 's/^#/   /'

echo "check.sh: all checks passed"
