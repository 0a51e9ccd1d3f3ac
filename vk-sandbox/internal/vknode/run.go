package vknode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
)

// pingGrace bounds how long Ping keeps succeeding after sandboxd stopped
// being heard, waiting for the NotReady status to reach the API.
const pingGrace = 10 * time.Second

// startupGrace bounds how long Run waits for sandboxd before it starts the
// controllers, so that the node's first status and the adoption of its
// pods after a restart reflect sandboxd rather than a guess.
const startupGrace = 15 * time.Second

// Provider is what the pod controller drives (provider.Provider).
type Provider interface {
	node.PodLifecycleHandler
	node.PodNotifier
	GetContainerLogs(ctx context.Context, namespace, podName, containerName string, opts api.ContainerLogOpts) (io.ReadCloser, error)
	Run(ctx context.Context, changes <-chan struct{})
}

// Config wires a Node.
type Config struct {
	Client kubernetes.Interface
	Spec   Spec
	Health Health
	// Subscribe returns a new channel that receives after each change of
	// sandboxd's mirror (hostwatch.Fanout.Subscribe).
	Subscribe func() <-chan struct{}
	// NewProvider builds the provider over the pod informer's lister and
	// the node informer's view of this node.
	NewProvider func(pods corev1listers.PodLister, node func() (*corev1.Node, error)) Provider
	// LeaseDuration is the node lease's duration; it is renewed every
	// quarter of it while sandboxd is heard.
	LeaseDuration time.Duration
	// Workers is how many pods the pod controller works on at once.
	Workers int
	// KubeletListener, with KubeletTLS, serves the kubelet API (kubectl
	// logs); nil serves none.
	KubeletListener net.Listener
	KubeletTLS      *tls.Config
	// CacheSyncTimeout bounds the wait for the informers' first list.
	CacheSyncTimeout time.Duration
	Log              *slog.Logger
}

// Node is this host as a virtual-kubelet node.
type Node struct {
	cfg       Config
	podInf    informers.SharedInformerFactory
	nodeInf   informers.SharedInformerFactory
	nodes     corev1listers.NodeLister
	pods      corev1listers.PodLister
	provider  Provider
	nodeProv  *nodeProvider
	base      *corev1.Node // the node the node controller registers
	nc        *node.NodeController
	pc        *node.PodController
	events    record.EventBroadcaster
	ready     chan struct{}
	readyOnce sync.Once
}

// New builds the node; Run runs it.
func New(cfg Config) (*Node, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	name := cfg.Spec.Name
	// Informers for this node's pods and this node only: every later read
	// is from their caches (the first list is an informer's, by field
	// selector, then a watch).
	podInf := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", name).String()
	}))
	nodeInf := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
	}))
	podInformer := podInf.Core().V1().Pods()
	nodes := nodeInf.Core().V1().Nodes().Lister()
	n := &Node{cfg: cfg, podInf: podInf, nodeInf: nodeInf, nodes: nodes, pods: podInformer.Lister(), ready: make(chan struct{})}
	self := func() (*corev1.Node, error) { return nodes.Get(name) }
	n.provider = cfg.NewProvider(podInformer.Lister(), self)

	// The pod controller wants informers for ConfigMaps, Secrets and
	// Services to resolve environments; this factory is never started (no
	// cluster-wide watch of Secrets from every host): the provider resolves
	// a pod's environment itself with one GET per reference.
	unused := informers.NewSharedInformerFactory(cfg.Client, 0)
	n.events = record.NewBroadcaster()
	recorder := n.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "vk-sandbox", Host: name})
	retryForever := func(context.Context, string, int, time.Time, error) (*time.Duration, error) { return nil, nil }
	pc, err := node.NewPodController(node.PodControllerConfig{
		PodClient:                             cfg.Client.CoreV1(),
		PodInformer:                           podInformer,
		EventRecorder:                         recorder,
		Provider:                              n.provider,
		ConfigMapInformer:                     unused.Core().V1().ConfigMaps(),
		SecretInformer:                        unused.Core().V1().Secrets(),
		ServiceInformer:                       unused.Core().V1().Services(),
		SkipDownwardAPIResolution:             true,
		SyncPodsFromKubernetesRateLimiter:     workqueue.NewTypedItemExponentialFailureRateLimiter[any](100*time.Millisecond, 30*time.Second),
		SyncPodsFromKubernetesShouldRetryFunc: retryForever,
	})
	if err != nil {
		return nil, fmt.Errorf("create the pod controller: %w", err)
	}
	n.pc = pc

	base := newNode(cfg.Spec)
	n.base = base
	n.nodeProv = newNodeProvider(cfg.Health, self, base, pingGrace, cfg.Log)
	lease := int32(cfg.LeaseDuration / time.Second)
	nc, err := node.NewNodeController(n.nodeProv, base, cfg.Client.CoreV1().Nodes(),
		node.WithNodeEnableLeaseV1WithRenewInterval(cfg.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease), lease, cfg.LeaseDuration/4),
		node.WithNodePingInterval(time.Second),
		node.WithNodePingTimeout(5*time.Second),
		node.WithNodeStatusUpdateInterval(time.Minute),
		// A node deleted from under a running vk-sandbox is registered again.
		node.WithNodeStatusUpdateErrorHandler(func(ctx context.Context, err error) error {
			if !apierrors.IsNotFound(err) {
				return err
			}
			again := n.nodeProv.current()
			again.ResourceVersion, again.UID = "", ""
			if _, err := cfg.Client.CoreV1().Nodes().Create(ctx, again, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("register the node again: %w", err)
			}
			cfg.Log.Warn("the node was deleted: registered it again", "node", name)
			return nil
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("create the node controller: %w", err)
	}
	n.nc = nc
	return n, nil
}

// Ready is closed once the node is registered and its pod controller
// runs.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// Run runs the node until ctx ends or a controller fails. It leaves the
// node object and its pods in place: a restart of vk-sandbox picks them up.
func (n *Node) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	log := n.cfg.Log
	var wg sync.WaitGroup
	n.podInf.Start(ctx.Done())
	n.nodeInf.Start(ctx.Done())
	defer func() {
		cancel() // first: the informers' Shutdown waits for their stop
		n.podInf.Shutdown()
		n.nodeInf.Shutdown()
		wg.Wait()
	}()
	if err := n.waitForCaches(ctx); err != nil {
		return err
	}

	n.events.StartStructuredLogging(4)
	n.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: n.cfg.Client.CoreV1().Events("")})
	defer n.events.Shutdown()

	n.awaitSandboxd(ctx)
	n.nodeProv.initial(n.base)
	wg.Go(func() { n.provider.Run(ctx, n.cfg.Subscribe()) })
	pcErr := make(chan error, 1)
	wg.Go(func() { pcErr <- n.pc.Run(ctx, max(1, n.cfg.Workers)) })
	select {
	case <-n.pc.Ready():
	case err := <-pcErr:
		return fmt.Errorf("run the pod controller: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	log.Info("the pod controller runs", "node", n.cfg.Spec.Name)

	wg.Go(func() { n.nodeProv.run(ctx, n.cfg.Subscribe()) })
	ncErr := make(chan error, 1)
	wg.Go(func() { ncErr <- n.nc.Run(ctx) })
	select {
	case <-n.nc.Ready():
	case err := <-ncErr:
		return fmt.Errorf("register the node: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	log.Info("the node is registered", "node", n.cfg.Spec.Name)

	srvErr := make(chan error, 1)
	if n.cfg.KubeletListener != nil {
		srv := n.kubeletServer()
		ln := tls.NewListener(n.cfg.KubeletListener, n.cfg.KubeletTLS)
		wg.Go(func() {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				srvErr <- err
			}
		})
		defer srv.Close() // the process is stopping: open log streams are cut
		log.Info("serving the kubelet API", "listen", n.cfg.KubeletListener.Addr().String())
	}
	n.readyOnce.Do(func() { close(n.ready) })

	select {
	case <-ctx.Done():
		return nil
	case err := <-pcErr:
		return fmt.Errorf("the pod controller stopped: %w", err)
	case err := <-ncErr:
		return fmt.Errorf("the node controller stopped: %w", err)
	case err := <-srvErr:
		return fmt.Errorf("serve the kubelet API: %w", err)
	}
}

// awaitSandboxd waits until sandboxd is heard, ctx ends or startupGrace
// passes.
func (n *Node) awaitSandboxd(ctx context.Context) {
	changes := n.cfg.Subscribe()
	t := time.NewTimer(startupGrace)
	defer t.Stop()
	for {
		if ok, _ := n.cfg.Health.Synced(); ok {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.cfg.Log.Warn("sandboxd is not heard yet: the node starts NotReady", "waited", startupGrace)
			return
		case <-changes:
		}
	}
}

// kubeletServer is the kubelet API: container logs, and this node's pods.
func (n *Node) kubeletServer() *http.Server {
	return &http.Server{
		Handler: api.PodHandler(api.PodHandlerConfig{
			GetContainerLogs: n.provider.GetContainerLogs,
			GetPods:          n.provider.GetPods,
			GetPodsFromKubernetes: func(context.Context) ([]*corev1.Pod, error) {
				return n.pods.List(labels.Everything())
			},
		}, false),
		ReadHeaderTimeout: 30 * time.Second,
	}
}

// waitForCaches waits, at most CacheSyncTimeout, for the first list of the
// pod and node informers.
func (n *Node) waitForCaches(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.CacheSyncTimeout)
	defer cancel()
	for _, f := range []informers.SharedInformerFactory{n.podInf, n.nodeInf} {
		for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return fmt.Errorf("sync the informer of %v: %w", typ, context.Cause(ctx))
			}
		}
	}
	return nil
}
