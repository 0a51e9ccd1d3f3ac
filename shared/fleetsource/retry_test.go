package fleetsource

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
)

func TestTransient(t *testing.T) {
	gr := schema.GroupResource{Group: "skiff.dev", Resource: "nodeinventories"}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", refused, true},
		{"403 of a kube-apiserver without its RBAC yet", apierrors.NewForbidden(gr, "", errors.New("rbac")), true},
		{"401", apierrors.NewUnauthorized("no authenticator yet"), true},
		{"429", apierrors.NewTooManyRequests("slow down", 1), true},
		{"503", apierrors.NewServiceUnavailable("starting"), true},
		{"410: the reflector lists again", apierrors.NewResourceExpired("too old resource version"), false},
		{"400", apierrors.NewBadRequest("bad"), false},
		{"the informer stopping", context.Canceled, false},
	} {
		if got := transient(c.err); got != c.want {
			t.Errorf("%s: transient(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// A watch that a kube-apiserver out of reach refuses is retried until it
// serves; one it refuses otherwise reaches the reflector at once.
func TestRetryLWRetriesOnlyTransientFailures(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	calls := 0
	fails := []error{refused, refused, apierrors.NewForbidden(schema.GroupResource{}, "", errors.New("rbac")), nil}
	w := watch.NewEmptyWatch()
	r := &retryLW{kind: "NodeInventory", log: logr.Discard(), lw: &toolscache.ListWatch{
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			err := fails[calls]
			calls++
			if err != nil {
				return nil, err
			}
			return w, nil
		},
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			calls++
			return nil, apierrors.NewResourceExpired("too old")
		},
	}}
	got, err := r.WatchWithContext(t.Context(), metav1.ListOptions{})
	if err != nil || got != w || calls != len(fails) {
		t.Fatalf("watch after %d transient failures: %v, %v after %d calls; want the watch after %d", len(fails)-1, got, err, calls, len(fails))
	}
	calls = 0
	if _, err := r.ListWithContext(t.Context(), metav1.ListOptions{}); !apierrors.IsResourceExpired(err) || calls != 1 {
		t.Fatalf("a 410 list: %v after %d calls, want the 410 after 1", err, calls)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	calls, fails = 0, []error{refused, refused}
	if _, err := r.WatchWithContext(ctx, metav1.ListOptions{}); !errors.Is(err, syscall.ECONNREFUSED) || calls != 1 {
		t.Fatalf("a refused watch after the informer stopped: %v after %d calls, want the refusal after 1", err, calls)
	}
	if r.failures != 0 {
		t.Errorf("a failure after the informer stopped counted as the kube-apiserver's (%d)", r.failures)
	}
}
