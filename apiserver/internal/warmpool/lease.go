package warmpool

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Defaults of LeaseOptions: client-go's (and kube-controller-manager's).
const (
	DefaultLeaseName     = "sandbox-apiserver-warm-pools"
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
	// DefaultLeaseNamespace is the Lease's namespace outside a pod.
	DefaultLeaseNamespace = "skiff-system"
)

// LeaseOptions are the --leader-elect flags.
type LeaseOptions struct {
	Enabled       bool
	Namespace     string
	Name          string
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
}

// NewLeaseOptions returns the defaults: on.
func NewLeaseOptions() LeaseOptions {
	return LeaseOptions{Enabled: true, Name: DefaultLeaseName, LeaseDuration: DefaultLeaseDuration,
		RenewDeadline: DefaultRenewDeadline, RetryPeriod: DefaultRetryPeriod}
}

// AddFlags registers the flags.
func (o *LeaseOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.Enabled, "leader-elect", o.Enabled, "With --inventory kube: drive the warm pools only while holding a coordination.k8s.io Lease, so that one replica of several does; "+
		"losing it (the kube-apiserver out of reach past --leader-elect-renew-deadline) stops the driver, which campaigns again, and never the process. "+
		"false: this replica drives the pools alone.")
	fs.StringVar(&o.Namespace, "leader-elect-namespace", o.Namespace, "Namespace of the Lease; empty: the pod's own (POD_NAMESPACE, or its service account's), else "+DefaultLeaseNamespace+".")
	fs.StringVar(&o.Name, "leader-elect-lease-name", o.Name, "Name of the Lease the replicas campaign for.")
	fs.DurationVar(&o.LeaseDuration, "leader-elect-lease-duration", o.LeaseDuration, "How long a replica that is not the leader waits after the last renewal before it takes the Lease.")
	fs.DurationVar(&o.RenewDeadline, "leader-elect-renew-deadline", o.RenewDeadline, "How long the leader keeps trying to renew before it steps down; less than --leader-elect-lease-duration.")
	fs.DurationVar(&o.RetryPeriod, "leader-elect-retry-period", o.RetryPeriod, "How often replicas try to take or renew the Lease.")
}

// serviceAccountNamespace is where a pod finds its namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// Complete fills the namespace.
func (o *LeaseOptions) Complete() {
	if o.Namespace != "" {
		return
	}
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		o.Namespace = ns
	} else if b, err := os.ReadFile(serviceAccountNamespace); err == nil && strings.TrimSpace(string(b)) != "" {
		o.Namespace = strings.TrimSpace(string(b))
	} else {
		o.Namespace = DefaultLeaseNamespace
	}
}

// Validate checks the durations.
func (o *LeaseOptions) Validate() error {
	switch {
	case !o.Enabled:
		return nil
	case o.Name == "":
		return fmt.Errorf("--leader-elect-lease-name is required with --leader-elect")
	case o.RetryPeriod <= 0:
		return fmt.Errorf("--leader-elect-retry-period must be greater than 0, got %s", o.RetryPeriod)
	case o.RenewDeadline <= o.RetryPeriod:
		return fmt.Errorf("--leader-elect-renew-deadline (%s) must be greater than --leader-elect-retry-period (%s)", o.RenewDeadline, o.RetryPeriod)
	case o.LeaseDuration <= o.RenewDeadline:
		return fmt.Errorf("--leader-elect-lease-duration (%s) must be greater than --leader-elect-renew-deadline (%s)", o.LeaseDuration, o.RenewDeadline)
	}
	return nil
}

// Leader says whether this replica leads now.
type Leader struct{ leading atomic.Bool }

// Unleased marks a replica that drives the pools without a Lease
// (--leader-elect=false) as leading.
func (l *Leader) Unleased() { l.leading.Store(true) }

// Leading reports whether this replica holds the Lease now.
func (l *Leader) Leading() bool { return l != nil && l.leading.Load() }

// Campaign campaigns for the Lease until ctx ends and runs lead while it
// holds it; lead's context ends when the Lease is lost (or ctx ends), and
// then Campaign campaigns again. It never exits the process: losing the
// Lease to an outage of the kube-apiserver only pauses the work. On the
// end of ctx the Lease is released, so that another replica takes over at
// once.
func Campaign(ctx context.Context, cs kubernetes.Interface, o LeaseOptions, identity string, log *slog.Logger, l *Leader, lead func(context.Context)) error {
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, o.Namespace, o.Name, cs.CoreV1(), cs.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: identity})
	if err != nil {
		return fmt.Errorf("lease %s/%s: %w", o.Namespace, o.Name, err)
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   o.LeaseDuration,
			RenewDeadline:   o.RenewDeadline,
			RetryPeriod:     o.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            "warm-pools",
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					l.leading.Store(true)
					log.InfoContext(ctx, "holding the warm-pool lease: driving the warm pools", "lease", o.Namespace+"/"+o.Name, "identity", identity)
					lead(ctx)
				},
				OnStoppedLeading: func() {
					if l.leading.Swap(false) {
						log.Warn("lost the warm-pool lease: the warm-pool driver stopped; campaigning again (the e2b API serves on)", "lease", o.Namespace+"/"+o.Name)
					}
				},
				OnNewLeader: func(id string) {
					if id != identity {
						log.Info("another replica holds the warm-pool lease", "leader", id)
					}
				},
			},
		})
		if err != nil {
			return fmt.Errorf("lease %s/%s: %w", o.Namespace, o.Name, err)
		}
		le.Run(ctx)
	}
	return nil
}

// Identity is a replica's name in the Lease: the host name and a random
// suffix, so that a restarted replica is a new holder.
func Identity() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "sandbox-apiserver"
	}
	return h + "_" + rand.String(8)
}
