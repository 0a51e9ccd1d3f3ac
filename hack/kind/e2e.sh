#!/usr/bin/env bash
# make e2e-kind: a kind cluster (hack/kind/cluster.yaml: a control plane and
# two sandbox hosts), the chart's image loaded into it (make image), the
# chart installed with short freshness values and NodePorts on loopback,
# then the lanes (e2e/kind) with their failures made by docker on kind's
# node containers. The cluster is deleted at the end, also on failure or
# Ctrl-C. Needs a running Docker daemon and Docker Hub (kind's node image).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BIN=${BIN:-$PWD/bin}
CLUSTER=${KIND_CLUSTER:-skiff-e2e}
IMAGE=${IMAGE:?set IMAGE to the image of the chart as repository:tag}
INTERVAL=${SKIFF_FLEET_INTERVAL:-2s}
WINDOW=${SKIFF_FLEET_WINDOW:-6s}

if ! docker info >/dev/null 2>&1; then
	echo "make e2e-kind needs a running Docker daemon (kind runs the cluster's nodes as containers) and Docker Hub for kind's node image; 'docker info' fails here" >&2
	exit 2
fi
work=$(mktemp -d)
kc=$work/kubeconfig
cleanup() {
	echo "deleting kind cluster $CLUSTER" >&2
	"$BIN/kind" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

echo "creating kind cluster $CLUSTER" >&2
"$BIN/kind" create cluster --name "$CLUSTER" --config hack/kind/cluster.yaml --kubeconfig "$kc" --wait 2m
echo "loading $IMAGE" >&2
"$BIN/kind" load image-archive "$BIN/skiff-image.tar" --name "$CLUSTER"
echo "installing charts/skiff (the hosts build the base template first: minutes)" >&2
"$BIN/helm" install skiff charts/skiff --kubeconfig "$kc" --namespace skiff-system --create-namespace \
	--wait --timeout 15m \
	--set "image.repository=${IMAGE%:*},image.tag=${IMAGE##*:},image.pullPolicy=Never" \
	--set "freshness.publishInterval=$INTERVAL,freshness.staleAfter=$WINDOW" \
	--set "apiserver.service.type=NodePort,apiserver.service.nodePort=30080" \
	--set "proxy.service.type=NodePort,proxy.service.nodePort=30082" \
	--set-json 'hosts.sandboxdExtraArgs=["--default-disk=0"]'

cd e2e
SKIFF_KIND_KUBECONFIG=$kc SKIFF_KIND_DOCKER=1 \
	SKIFF_KIND_HOSTS="$CLUSTER-worker,$CLUSTER-worker2" SKIFF_KIND_CONTROL_PLANE="$CLUSTER-control-plane" \
	SKIFF_FLEET_INTERVAL=$INTERVAL SKIFF_FLEET_WINDOW=$WINDOW SKIFF_BIN=$BIN \
	go test -count=1 -timeout 40m -run '^TestKindLanes$' -v ./kind/
