// Package aggregated is sandbox-apiserver's Kubernetes face: the
// sandbox.skiff.dev/v1beta1 API, served through the kube-apiserver's
// aggregation layer (an APIService), so that `kubectl get sandboxes`,
// client-go and RBAC work on sandboxes as on any resource.
//
// It is laid out as k8s.io/sample-apiserver is (Options, then Complete,
// Validate, Config and Run) on k8s.io/apiserver's recommended options, less
// the parts a server without etcd has no use for: no etcd (sandboxes come
// from the fresh NodeInventories, package view), no admission (nothing is
// created or updated here) and no priority-and-fairness (the kube-apiserver
// in front applies its own). Authentication and authorization are delegated
// to the kube-apiserver: front-proxy request headers, TokenReview and
// SubjectAccessReview.
package aggregated

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/util/compatibility"
	netutils "k8s.io/utils/net"

	"github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	generatedopenapi "github.com/skiff-dev/skiff/apiserver/internal/aggregated/openapi"
	"github.com/skiff-dev/skiff/apiserver/internal/aggregated/registry"
)

// DefaultSecurePort is where the API is served unless --secure-port says
// otherwise; the APIService's Service points at it.
const DefaultSecurePort = 8443

var (
	// Scheme holds the group's types, registered as v1beta1 and as the
	// internal version (there is one version, so the two are one type).
	Scheme = runtime.NewScheme()
	// Codecs are the scheme's serializers.
	Codecs = serializer.NewCodecFactory(Scheme)
)

func init() {
	utilruntime.Must(v1beta1.AddToScheme(Scheme))
	Scheme.AddKnownTypes(schema.GroupVersion{Group: v1beta1.Group, Version: runtime.APIVersionInternal}, &v1beta1.Sandbox{}, &v1beta1.SandboxList{})
	utilruntime.Must(Scheme.AddFieldLabelConversionFunc(v1beta1.GroupVersion.WithKind("Sandbox"), registry.FieldLabelConversion))
	// What every API server registers: the unversioned meta types.
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	unversioned := schema.GroupVersion{Group: "", Version: "v1"}
	Scheme.AddUnversionedTypes(unversioned, &metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
}

// Options are the aggregated API's flags: k8s.io/apiserver's recommended
// serving, delegated authentication and authorization, and features.
type Options struct {
	Recommended *genericoptions.RecommendedOptions
}

// NewOptions returns the defaults: serving on DefaultSecurePort, a
// self-signed certificate (in memory) unless --tls-cert-file is given.
func NewOptions() *Options {
	ro := genericoptions.NewRecommendedOptions("", nil)
	ro.Etcd = nil
	ro.Admission = nil
	ro.CoreAPI = nil
	ro.Audit = nil
	ro.EgressSelector = nil
	ro.Traces = nil // Skiff's tracing is OTEL_EXPORTER_OTLP_ENDPOINT's (docs/operations.md)
	ro.Features.EnablePriorityAndFairness = false
	ro.Features.EnableProfiling = false // as --enable-pprof: off unless asked
	ro.SecureServing.BindPort = DefaultSecurePort
	ro.SecureServing.ServerCert.CertDirectory = ""
	ro.SecureServing.ServerCert.PairName = ""
	return &Options{Recommended: ro}
}

// AddFlags adds the flags to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Recommended.AddFlags(fs)
}

// Enabled reports whether the API is served (--secure-port is not 0).
func (o *Options) Enabled() bool { return o.Recommended.SecureServing.BindPort > 0 }

// Complete fills what the flags left unset: the kubeconfig the delegated
// authentication and authorization reach the kube-apiserver with defaults
// to the process's own (--kubeconfig; "" is in-cluster).
func (o *Options) Complete(kubeconfig string) {
	if o.Recommended.Authentication.RemoteKubeConfigFile == "" {
		o.Recommended.Authentication.RemoteKubeConfigFile = kubeconfig
	}
	if o.Recommended.Authorization.RemoteKubeConfigFile == "" {
		o.Recommended.Authorization.RemoteKubeConfigFile = kubeconfig
	}
}

// Validate checks the options.
func (o *Options) Validate() error {
	return errors.Join(o.Recommended.Validate()...)
}

// Server is the aggregated API over one storage.
type Server struct {
	generic *genericapiserver.GenericAPIServer
}

// New builds the server of o over storage. ln, if not nil, is where it
// serves (tests); else it listens on --bind-address:--secure-port.
func (o *Options) New(storage rest.Storage, ln net.Listener) (*Server, error) {
	ss := o.Recommended.SecureServing
	if ln != nil {
		ss.Listener = ln
		ss.BindPort = ln.Addr().(*net.TCPAddr).Port
	}
	if err := ss.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{netutils.ParseIPSloppy("127.0.0.1")}); err != nil {
		return nil, fmt.Errorf("create a self-signed serving certificate: %w", err)
	}
	cfg := genericapiserver.NewRecommendedConfig(Codecs)
	cfg.EffectiveVersion = compatibility.DefaultBuildEffectiveVersion()
	namer := openapi.NewDefinitionNamer(Scheme)
	cfg.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(generatedopenapi.GetOpenAPIDefinitions, namer)
	cfg.OpenAPIConfig.Info.Title = "Skiff sandboxes"
	cfg.OpenAPIConfig.Info.Version = v1beta1.GroupVersion.Version
	cfg.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(generatedopenapi.GetOpenAPIDefinitions, namer)
	cfg.OpenAPIV3Config.Info.Title = "Skiff sandboxes"
	cfg.OpenAPIV3Config.Info.Version = v1beta1.GroupVersion.Version
	if err := o.Recommended.ApplyTo(cfg); err != nil {
		return nil, fmt.Errorf("configure the aggregated API: %w", err)
	}
	generic, err := cfg.Complete().New("sandbox-apiserver", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, fmt.Errorf("build the aggregated API: %w", err)
	}
	info := genericapiserver.NewDefaultAPIGroupInfo(v1beta1.Group, Scheme, metav1.ParameterCodec, Codecs)
	info.VersionedResourcesStorageMap[v1beta1.GroupVersion.Version] = map[string]rest.Storage{"sandboxes": storage}
	if err := generic.InstallAPIGroup(&info); err != nil {
		return nil, fmt.Errorf("install %s: %w", v1beta1.GroupVersion, err)
	}
	return &Server{generic: generic}, nil
}

// Run serves until ctx ends, then shuts down (k8s.io/apiserver's own drain).
func (s *Server) Run(ctx context.Context) error {
	return s.generic.PrepareRun().RunWithContext(ctx)
}
