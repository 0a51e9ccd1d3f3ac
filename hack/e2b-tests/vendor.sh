#!/usr/bin/env bash
# Copies e2b's own JS SDK tests (the e2b-dev/E2B repository, packages/js-sdk/
# tests) that run against a live API and envd into e2e/upstream/js/tests,
# with their imports of the SDK's source ('../../src', '../../src/errors', …)
# turned into imports of the published package ('e2b'), which
# e2e/upstream/js/package.json pins to the version of that commit. And the
# e2b CLI's tests that run against a live API (packages/cli/tests, with the
# CLI's src/user.ts they import) into e2e/upstream/js/cli, run with the
# published CLI (@e2b/cli in package.json) in place of the one they build.
#
#   hack/e2b-tests/vendor.sh <E2B checkout or bare repository> <commit>
#
# Left out: tests of the SDK alone (mocked servers with msw, internal
# modules), template builds, volumes (mocked), and the runtimes. Which of
# the copied tests Skiff does not run, and why, is in e2e/upstream/js/skip.mjs.
set -euo pipefail
repo=${1:?usage: vendor.sh <E2B repository> <commit>}
commit=${2:?usage: vendor.sh <E2B repository> <commit>}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/e2e/upstream/js
src=packages/js-sdk

files=(
  tests/setup.ts tests/template.ts tests/cmdHelper.ts
  tests/api/info.test.ts tests/api/kill.test.ts tests/api/list.test.ts tests/api/snapshot.test.ts
)
while IFS= read -r f; do
  files+=("${f#"$src"/}")
done < <(git -C "$repo" ls-tree -r --name-only "$commit" "$src/tests/sandbox" | grep -E '\.test\.ts$|/helpers\.ts$')

rm -rf "$out/tests"
kept=0
for f in "${files[@]}"; do
  body=$(git -C "$repo" show "$commit:$src/$f")
  # Tests of the SDK alone: they mock the servers or reach its internals.
  if grep -qE "from 'msw|vi\.mock\(|src/(envd|api|sandbox/(commands|filesystem/watchHandle|sandboxApi|iam))" <<<"$body"; then
    echo "left out (tests the SDK alone): $f"
    continue
  fi
  mkdir -p "$out/$(dirname "$f")"
  sed -E "s#from '(\.\./)+src(/index\.js|/errors\.js|/errors|/sandbox/filesystem)?'#from 'e2b'#" <<<"$body" >"$out/$f"
  kept=$((kept + 1))
done
# An import of the SDK's source the rewriting above did not turn into 'e2b'
# (a new internal path) would be run against nothing: stop instead.
if grep -rnE "['\"](\.\./)+src(['/\"])" "$out/tests"; then
  echo "vendor.sh: the imports above still name the SDK's source; extend the rewriting or leave those files out" >&2
  exit 1
fi
# The CLI's tests against a live backend; the others mock it or test the
# CLI's own modules.
rm -rf "$out/cli"
for f in tests/setup.ts tests/commands/sandbox/backend_integration.test.ts tests/commands/sandbox/exec_pipe.test.ts src/user.ts; do
  mkdir -p "$out/cli/$(dirname "$f")"
  git -C "$repo" show "$commit:packages/cli/$f" >"$out/cli/$f"
  kept=$((kept + 1))
done
# setup.ts runs the CLI it builds (dist/index.js); here, the published one.
sed -i "s#path.join(process.cwd(), 'dist', 'index.js')#path.join(process.cwd(), 'node_modules', '@e2b', 'cli', 'dist', 'index.js')#" "$out/cli/tests/setup.ts"
if ! grep -q "'node_modules', '@e2b', 'cli'" "$out/cli/tests/setup.ts"; then
  echo "vendor.sh: the CLI's tests/setup.ts no longer names dist/index.js as it did; point it at the published CLI another way" >&2
  exit 1
fi
git -C "$repo" show "$commit:LICENSE" >"$out/LICENSE"
git -C "$repo" rev-parse "$commit" >"$out/COMMIT"
echo "copied $kept files of $commit into $out/tests"
