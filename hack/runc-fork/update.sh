#!/bin/sh
# Rebuilds third_party/runc: runc's libcontainer (with the internal and
# types packages it imports) at the version in ./VERSION, from the Go module
# proxy, with the patches in ./patches applied in order. sandboxd's go.mod
# replaces github.com/opencontainers/runc with it.
#
# Why a fork, and what each patch does: README.md here (copied into the
# fork as SKIFF.md).
#
# To move to a newer runc: change VERSION, run this script, fix what no
# longer applies, and run sandboxd's tests.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(cat "$here/VERSION")
dst="$root/third_party/runc"

src=$(cd "$root/sandboxd" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "github.com/opencontainers/runc@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$src" ] || { echo "update.sh: runc $version not downloaded" >&2; exit 1; }

rm -rf "$dst"
mkdir -p "$dst"
cd "$src"
cp LICENSE NOTICE go.mod go.sum "$dst/"
# Sources only: no tests, test data or integration suites.
find libcontainer internal types -type f \( -name '*.go' -o -name '*.c' -o -name '*.h' \) \
	! -name '*_test.go' ! -path '*/integration/*' ! -path '*/test/*' ! -path '*/testdata/*' |
	while read -r f; do
		mkdir -p "$dst/$(dirname "$f")"
		cp "$f" "$dst/$f"
	done
chmod -R u+w "$dst"
cp "$here/README.md" "$dst/SKIFF.md"
for p in "$here"/patches/*.patch; do
	[ -e "$p" ] || continue
	echo "applying $(basename "$p")"
	patch -s -p1 -d "$dst" < "$p"
done
echo "third_party/runc: runc $version with $(ls "$here"/patches/*.patch 2>/dev/null | wc -l) patches"
