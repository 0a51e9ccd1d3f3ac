// Package kubeclient is the part of the daemon kit for binaries that talk
// to Kubernetes: the --kubeconfig flag, the REST config it names, and
// client-go's logs sent to the daemon's logger. It is apart from package
// daemon so that a binary that does not talk to Kubernetes (sandboxd) does
// not link client-go, and it links no controller-runtime (vk-sandbox
// carries none; the readers' cache sends its logs with
// fleetsource.SendCacheLogs).
package kubeclient

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// KubeconfigHelp is the help of a --kubeconfig flag: where RESTConfig looks.
const KubeconfigHelp = "The kubeconfig file; empty: $KUBECONFIG, else the pod's service account, else ~/.kube/config."

// AddKubeconfigFlag registers --kubeconfig into path; when, if not empty,
// says when the flag is read ("With --inventory kube").
func AddKubeconfigFlag(fs *pflag.FlagSet, path *string, when string) {
	help := KubeconfigHelp
	if when != "" {
		help = when + ": t" + help[1:]
	}
	fs.StringVar(path, "kubeconfig", *path, help)
}

// RESTConfig finds the cluster: the kubeconfig file at path; with an empty
// path, $KUBECONFIG, else the pod's service account, else ~/.kube/config.
// Its requests carry userAgent.
func RESTConfig(path, userAgent string) (*rest.Config, error) {
	cfg, err := restConfig(path)
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = userAgent
	return cfg, nil
}

func restConfig(path string) (*rest.Config, error) {
	if path == "" && os.Getenv(clientcmd.RecommendedConfigPathEnvVar) == "" {
		cfg, err := rest.InClusterConfig()
		if err == nil {
			return cfg, nil
		}
		if !errors.Is(err, rest.ErrNotInCluster) {
			return nil, fmt.Errorf("load the pod's service account: %w", err)
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("find the cluster (pass --kubeconfig, set $KUBECONFIG, or run in a pod): %w", err)
	}
	return cfg, nil
}

var kubeLogOnce sync.Once

// SendLogs sends client-go's logs (klog) to log. The first call wins:
// klog keeps one process-wide logger.
func SendLogs(log *slog.Logger) {
	kubeLogOnce.Do(func() { klog.SetLogger(logr.FromSlogHandler(log.Handler())) })
}
