#!/usr/bin/env bash
# build.sh builds gVisor's runsc from the Go module proxy into a cache folder
# outside the repository, and prints the binary's path. It is a no-op when
# the binary is already there, so a kept machine pays once (about 2 minutes
# cold on 2 cores; seconds with a warm Go build cache).
#
#   hack/runsc/build.sh            # build if missing, print the path of runsc
#   hack/runsc/build.sh --print    # print the path only
#
# The folder is keyed by the gVisor version pinned in ./go.mod, so bumping it
# builds into a new folder. runsc must be static (CGO_ENABLED=0): a dynamic one
# dies in the empty chroot runsc puts its own processes in.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="$(awk '$1 == "require" && $2 == "gvisor.dev/gvisor" {print $3}' "$here/go.mod")"
cache="${SKIFF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skiff}"
bin="$cache/runsc/$version/runsc"

if [[ "${1:-}" == "--print" ]]; then
	echo "$bin"
	exit 0
fi

if [[ -x "$bin" ]]; then
	echo "$bin"
	exit 0
fi

mkdir -p "$(dirname "$bin")"
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=readonly

echo "building runsc ${version} into $bin (about 2 minutes cold)" >&2
(cd "$here" && go build -trimpath -ldflags "-s -w" -o "$bin.tmp" gvisor.dev/gvisor/runsc)
mv "$bin.tmp" "$bin"

echo "$bin"
