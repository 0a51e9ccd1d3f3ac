package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/skiff-dev/skiff/shared/hostinventory"
	"github.com/skiff-dev/skiff/shared/logflags"
	"github.com/skiff-dev/skiff/shared/sandboxdapi"
	"github.com/skiff-dev/skiff/vk-sandbox/internal/hostwatch"
	"github.com/skiff-dev/skiff/vk-sandbox/internal/provider"
	"github.com/skiff-dev/skiff/vk-sandbox/internal/publish"
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
	if err := o.Validate(); err != nil {
		return err
	}
	log, err := newLogger(&o.Log)
	if err != nil {
		return err
	}
	ip, err := o.nodeIP()
	if err != nil {
		return err
	}
	token, err := os.ReadFile(o.SandboxdTokenFile)
	if err != nil {
		return fmt.Errorf("read --sandboxd-token-file: %w", err)
	}
	cfg, err := restConfig(o.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = "vk-sandbox/" + o.NodeName
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}

	sbd := sandboxdapi.NewClients(strings.TrimSpace(string(token)), nil)(o.Sandboxd)
	endpoint := o.endpoint(ip)
	host := hostinventory.New(sbd, endpoint, hostinventory.Options{})
	fan := hostwatch.NewFanout(host.Changed())

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	applier := publish.New(publish.Config{
		Source: host, Writer: publish.NewKubeWriter(dyn), Changes: fan.Subscribe(), NodeName: o.NodeName,
		Options: o.Publish, Log: log.With("component", "publisher"), Metrics: publish.NewMetrics(reg),
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

	adminLn, err := net.Listen("tcp", o.AdminListen)
	if err != nil {
		return fmt.Errorf("listen on --admin-listen %s: %w", o.AdminListen, err)
	}
	admin := &http.Server{Handler: adminHandler(reg, node.Ready()), ReadHeaderTimeout: 10 * time.Second}
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
	wg.Go(func() {
		if err := admin.Serve(adminLn); !errors.Is(err, http.ErrServerClosed) {
			fail(fmt.Errorf("serve --admin-listen: %w", err))
		}
	})
	<-ctx.Done()
	shutdown, stop := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer stop()
	_ = admin.Shutdown(shutdown)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	log.Info("vk-sandbox stopped: the node, its pods and the inventory are left as they are")
	return nil
}

// adminHandler serves /metrics, /healthz (200 while the process serves)
// and /readyz (200 once the node is registered and its pod controller
// runs).
func adminHandler(reg *prometheus.Registry, ready <-chan struct{}) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-ready:
			_, _ = w.Write([]byte("ok\n"))
		default:
			http.Error(w, "the node is not registered yet", http.StatusServiceUnavailable)
		}
	})
	return mux
}

// restConfig reaches the cluster: --kubeconfig, else $KUBECONFIG, else
// ~/.kube/config, else the pod's service account.
func restConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load the kubeconfig: %w", err)
	}
	return cfg, nil
}

var loggerOnce sync.Once

// newLogger returns the logger of --log-level and --log-format on stderr,
// and sends client-go's and virtual-kubelet's logs to it.
func newLogger(o *logflags.Options) (*slog.Logger, error) {
	log, err := o.Logger(os.Stderr)
	if err != nil {
		return nil, err
	}
	loggerOnce.Do(func() {
		slog.SetDefault(log)
		klog.SetLogger(logr.FromSlogHandler(log.Handler()))
		vknode.SetVKLogger(log.With("component", "virtual-kubelet"))
	})
	return log, nil
}
