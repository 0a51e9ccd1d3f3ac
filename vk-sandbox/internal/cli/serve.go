package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"

	"github.com/skiff-dev/skiff/shared/daemon"
	"github.com/skiff-dev/skiff/shared/daemon/kubeclient"
	"github.com/skiff-dev/skiff/shared/hostinventory"
	"github.com/skiff-dev/skiff/shared/logflags"
	"github.com/skiff-dev/skiff/shared/nodetoken"
	"github.com/skiff-dev/skiff/shared/publish"
	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	"github.com/skiff-dev/skiff/shared/serverclock"
	"github.com/skiff-dev/skiff/vk-sandbox/internal/hostwatch"
	"github.com/skiff-dev/skiff/vk-sandbox/internal/provider"
	"github.com/skiff-dev/skiff/vk-sandbox/internal/vknode"
)

func serveCommand() *cobra.Command {
	o := NewOptions()
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the node and the NodeInventory publisher until SIGTERM",
		Long: `Run this host as a virtual-kubelet node beside its sandboxd: register the
node (Ready while sandboxd is heard), turn the pods scheduled to it into
sandboxes, and publish the host's NodeInventory by server-side apply every
--publish-interval (stamped publishedAt = now) and soon after each change.

On SIGTERM it stops: no final write, no delete. The node, its pods, their
sandboxes and the inventory stay as they are, so a restart within the
readers' stale window changes nothing they can see.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return serve(cmd.Context(), o) },
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func serve(ctx context.Context, o *Options) error {
	if err := o.Complete(); err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return err
	}
	log, err := newLogger(&o.Log)
	if err != nil {
		return err
	}
	// Its calls of sandboxd (sandboxdapi's clients) are client spans.
	stopTracing, err := daemon.Tracing(ctx, log, "vk-sandbox")
	if err != nil {
		return err
	}
	defer stopTracing()
	ip, err := o.nodeIP()
	if err != nil {
		return err
	}
	token, err := nodetoken.ReadTokenFile("--sandboxd-token-file", o.SandboxdTokenFile)
	if err != nil {
		return err
	}
	cfg, err := kubeclient.RESTConfig(o.Kubeconfig, "vk-sandbox/"+o.NodeName)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	pubMetrics := publish.NewMetrics(reg)
	var clock *serverclock.Clock
	if o.Publish.ServerTime {
		// Every response of the kube-apiserver (the lease's renewals, the
		// inventory's writes) tells the publisher its time.
		clock = serverclock.New(serverclock.Config{Log: log.With("component", "publisher")})
		cfg.Wrap(clock.Wrap)
		pubMetrics.ShowClock(clock)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}

	sbd := sandboxdapi.NewClients(token, nil)(o.Sandboxd)
	endpoint := o.endpoint(ip)
	host := hostinventory.New(sbd, endpoint, hostinventory.Options{})
	fan := hostwatch.NewFanout(host.Changed())

	pubLog := log.With("component", "publisher")
	applier := publish.New(publish.Config{
		Source: host, Writer: publish.NewKubeWriter(dyn, o.Publish).WithMetrics(pubMetrics).WithLogger(pubLog), Changes: fan.Subscribe(), NodeName: o.NodeName,
		Options: o.Publish, Log: pubLog, Metrics: pubMetrics, ServerClock: clock,
		// Asked (with a ServerClock) before the first stamp, so that even
		// that one is in the kube-apiserver's time.
		LearnServerTime: func(ctx context.Context) error {
			return kube.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Error()
		},
	})
	podMetrics := provider.NewMetrics(reg)

	var kubeletLn net.Listener
	var kubeletTLS *tls.Config
	port := int32(0)
	if o.KubeletListen != "" {
		kt := vknode.KubeletTLS{CertFile: o.KubeletCertFile, KeyFile: o.KubeletKeyFile, ClientCAFile: o.KubeletClientCA, InsecureNoAuth: o.KubeletNoAuth}
		if kubeletTLS, err = kt.Config(o.NodeName, ip); err != nil {
			return err
		}
		if kubeletLn, err = net.Listen("tcp", o.KubeletListen); err != nil {
			return fmt.Errorf("listen on --kubelet-listen %s: %w", o.KubeletListen, err)
		}
		defer kubeletLn.Close()
		port = int32(kubeletLn.Addr().(*net.TCPAddr).Port)
	}
	node, err := vknode.New(vknode.Config{
		Client:    kube,
		Spec:      vknode.Spec{Name: o.NodeName, HostIP: ip, KubeletPort: port},
		Health:    host,
		Subscribe: fan.Subscribe,
		NewProvider: func(pods corev1listers.PodLister, self func() (*corev1.Node, error)) vknode.Provider {
			return provider.New(provider.Config{
				Sandboxd: sbd, Mirror: host, Pods: pods, Node: self, Config: kube.CoreV1(), HostIP: ip,
				DefaultTimeout: o.DefaultTimeout, Log: log.With("component", "pods"), Metrics: podMetrics,
			})
		},
		LeaseDuration:    o.LeaseDuration,
		Workers:          o.PodWorkers,
		KubeletListener:  kubeletLn,
		KubeletTLS:       kubeletTLS,
		CacheSyncTimeout: o.CacheSyncTimeout,
		Log:              log.With("component", "node"),
	})
	if err != nil {
		return err
	}

	adminLn, err := net.Listen("tcp", o.Admin.Listen)
	if err != nil {
		return fmt.Errorf("listen on --admin-listen %s: %w", o.Admin.Listen, err)
	}
	group := daemon.NewGroup(log, o.Shutdown.Timeout)
	group.ServeAdmin(daemon.AdminConfig{
		Gatherer: reg,
		Ready:    readyOnce(node.Ready()),
		Pprof:    o.Admin.EnablePprof,
	}, adminLn)
	log.Info("vk-sandbox starts", "node", o.NodeName, "node_ip", ip, "sandboxd", o.Sandboxd, "endpoint", endpoint,
		"admin", adminLn.Addr().String(), "publish_interval", o.Publish.Interval, "publish_min_interval", o.Publish.MinInterval)

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	fail := func(err error) {
		if err != nil && !errors.Is(err, context.Canceled) {
			cancel(err)
		}
	}
	wg.Go(func() { _ = host.Run(ctx) })
	wg.Go(func() { fan.Run(ctx) })
	wg.Go(func() { fail(applier.Run(ctx)) })
	wg.Go(func() { fail(node.Run(ctx)) })
	serveErr := group.Wait(ctx)
	cancel(serveErr)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	log.Info("vk-sandbox stopped: the node, its pods and the inventory are left as they are")
	return nil
}

// errNotRegistered is /readyz's answer until the node is registered and
// its pod controller runs.
var errNotRegistered = errors.New("the node is not registered yet")

// readyOnce is /readyz's check: ready once registered is closed.
func readyOnce(registered <-chan struct{}) func() error {
	return func() error {
		select {
		case <-registered:
			return nil
		default:
			return errNotRegistered
		}
	}
}

var loggerOnce sync.Once

// newLogger returns the logger of --log-level and --log-format on stderr,
// and sends client-go's and virtual-kubelet's logs to it.
func newLogger(o *logflags.Options) (*slog.Logger, error) {
	log, err := daemon.Logger(o)
	if err != nil {
		return nil, err
	}
	kubeclient.SendLogs(log)
	loggerOnce.Do(func() { vknode.SetVKLogger(log.With("component", "virtual-kubelet")) })
	return log, nil
}
