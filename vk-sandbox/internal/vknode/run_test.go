package vknode

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/testing/kubetest"
)

// noPods is a provider without pods: this test is about the node.
type noPods struct{}

func (noPods) CreatePod(context.Context, *corev1.Pod) error { return nil }
func (noPods) UpdatePod(context.Context, *corev1.Pod) error { return nil }
func (noPods) DeletePod(context.Context, *corev1.Pod) error { return nil }
func (noPods) GetPod(context.Context, string, string) (*corev1.Pod, error) {
	return nil, errdefs.NotFound("no pods")
}
func (noPods) GetPodStatus(context.Context, string, string) (*corev1.PodStatus, error) {
	return nil, errdefs.NotFound("no pods")
}
func (noPods) GetPods(context.Context) ([]*corev1.Pod, error) { return nil, nil }
func (noPods) NotifyPods(context.Context, func(*corev1.Pod))  {}
func (noPods) Run(ctx context.Context, _ <-chan struct{})     { <-ctx.Done() }
func (noPods) GetContainerLogs(context.Context, string, string, string, api.ContainerLogOpts) (io.ReadCloser, error) {
	return nil, errdefs.NotFound("no pods")
}

// The node registers on a real kube-apiserver, follows sandboxd's health
// (Ready, NotReady with the lease stopped, Ready again) and Run returns,
// every goroutine done, when its context ends.
func TestNodeFollowsSandboxdOnAControlPlane(t *testing.T) {
	env := kubetest.Start(t)
	kube := kubernetes.NewForConfigOrDie(env.Config)
	h := &health{inv: &v1beta1.NodeInventory{Spec: v1beta1.NodeInventorySpec{Capacity: v1beta1.NodeCapacity{CPUMilli: 4000, MemoryMiB: 8192, Sandboxes: 16}}}}
	h.set(true)
	changes := make(chan struct{}, 1)
	signal := func() {
		select {
		case changes <- struct{}{}:
		default:
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := KubeletTLS{InsecureNoAuth: true}.Config("host-n", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(Config{
		Client: kube, Spec: Spec{Name: "host-n", HostIP: "127.0.0.1", KubeletPort: int32(ln.Addr().(*net.TCPAddr).Port)},
		Health: h, Subscribe: func() <-chan struct{} { return changes },
		NewProvider:   func(corev1listers.PodLister, func() (*corev1.Node, error)) Provider { return noPods{} },
		LeaseDuration: 4 * time.Second, Workers: 1, KubeletListener: ln, KubeletTLS: tlsCfg,
		CacheSyncTimeout: time.Minute, Log: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return within 30s of its context's end")
		}
	}()
	ready := func(want corev1.ConditionStatus) *corev1.Node {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			node, err := kube.CoreV1().Nodes().Get(t.Context(), "host-n", metav1.GetOptions{})
			if err == nil {
				if st, _ := nodeReady(node); st == want {
					return node
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("node not Ready=%s within 60s (%v)", want, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	renewed := func() time.Time {
		t.Helper()
		l, err := kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(t.Context(), "host-n", metav1.GetOptions{})
		if err != nil || l.Spec.RenewTime == nil {
			return time.Time{}
		}
		return l.Spec.RenewTime.Time
	}

	node := ready(corev1.ConditionTrue)
	if cpu := node.Status.Capacity[corev1.ResourceCPU]; cpu.MilliValue() != 4000 {
		t.Errorf("capacity %v", node.Status.Capacity)
	}
	select {
	case <-n.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("Ready not closed")
	}

	h.set(false)
	signal()
	ready(corev1.ConditionFalse)
	time.Sleep(2 * time.Second) // a renewal under way lands
	before := renewed()
	time.Sleep(3 * time.Second) // three renew intervals
	if after := renewed(); !after.Equal(before) {
		t.Errorf("the lease was renewed with sandboxd unheard: %s -> %s", before, after)
	}

	h.set(true)
	signal()
	ready(corev1.ConditionTrue)
	deadline := time.Now().Add(30 * time.Second)
	for !renewed().After(before) {
		if time.Now().After(deadline) {
			t.Fatal("the lease is not renewed again")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		t.Fatal("canceled early")
	}
}
