#!/usr/bin/env bash
# build.sh builds etcd, kube-apiserver and kubectl from the Go module proxy into
# a cache folder outside the repository, and prints that folder. It is a no-op
# when the binaries are already there, so a kept machine pays once (about 5 to
# 8 minutes cold on 2 cores; seconds with a warm Go build cache).
#
#   hack/kube/build.sh            # build if missing, print the bin folder
#   hack/kube/build.sh --print    # print the bin folder only
#
# The folder is keyed by the versions pinned in ./k8s/go.mod and ./etcd/go.mod,
# so bumping either builds into a new folder.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
k8s_version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$here/k8s/go.mod")"
etcd_version="$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/server/v3" {print $3}' "$here/etcd/go.mod")"
cache="${SKIFF_CACHE:-$HOME/.cache/skiff}"
bin="$cache/kube/k8s-${k8s_version}_etcd-${etcd_version}/bin"

if [[ "${1:-}" == "--print" ]]; then
	echo "$bin"
	exit 0
fi

if [[ -x "$bin/etcd" && -x "$bin/kube-apiserver" && -x "$bin/kubectl" ]]; then
	echo "$bin"
	exit 0
fi

mkdir -p "$bin"
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=readonly

minor="${k8s_version#v1.}"
minor="${minor%%.*}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${k8s_version}"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"

echo "building etcd ${etcd_version} into $bin" >&2
(cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3)
mv "$bin/etcd.tmp" "$bin/etcd"

for cmd in kube-apiserver kubectl; do
	echo "building $cmd ${k8s_version} into $bin (kube-apiserver takes minutes cold)" >&2
	(cd "$here/k8s" && go build -trimpath -ldflags "$ldflags" -o "$bin/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
	mv "$bin/$cmd.tmp" "$bin/$cmd"
done

echo "$bin"
