// Package deploy builds the Kubernetes objects that install
// sandbox-apiserver's aggregated API (sandbox.skiff.dev/v1beta1) beside a
// kube-apiserver: the APIService, the Service it points at, the serving
// certificate the aggregator verifies, and RBAC, both the server's own
// (delegated authentication and authorization, the fleet it reads, the
// warm-pool lease) and the roles that let users see and delete sandboxes.
//
// The tests install these objects into a real control plane; the Helm
// chart renders the same ones, and its golden test compares the two.
package deploy

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	"github.com/skiff-dev/skiff/api/v1beta1"
)

// Defaults of Config.
const (
	DefaultNamespace  = "skiff-system"
	DefaultName       = "sandbox-apiserver"
	DefaultTargetPort = 8443
)

// Config says where sandbox-apiserver runs.
type Config struct {
	// Namespace of its Deployment, Service, ServiceAccount and Lease;
	// "" is DefaultNamespace.
	Namespace string
	// Name of its Service and ServiceAccount, and the prefix of its RBAC
	// objects; "" is DefaultName.
	Name string
	// TargetPort is its --secure-port; 0 is DefaultTargetPort.
	TargetPort int32
	// CABundle is the PEM CA that signed its serving certificate (see
	// ServingCert); the aggregator checks the server against it.
	CABundle []byte
	// ExternalName, if set, makes the Service an ExternalName one for that
	// host, and the APIService reach TargetPort there: a replica run
	// outside the cluster (on a developer's machine, or in the tests,
	// "localhost"), which Endpoints cannot name.
	ExternalName string
	// Selector selects the replicas' pods (a Service with a selector); nil
	// is app.kubernetes.io/name=Name. Unused with ExternalName.
	Selector map[string]string
	// Endpoints, if set, are the replicas' IPv4 addresses: the Service has
	// no selector and an EndpointSlice (see EndpointSlice) lists them at
	// TargetPort, for replicas outside any pod network behind a
	// kube-apiserver run with --enable-aggregator-routing (the local
	// fleet). Unused with ExternalName.
	Endpoints []string
}

func (c Config) withDefaults() Config {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.TargetPort == 0 {
		c.TargetPort = DefaultTargetPort
	}
	if c.Selector == nil {
		c.Selector = map[string]string{"app.kubernetes.io/name": c.Name}
	}
	return c
}

// APIServiceName is the APIService of sandbox.skiff.dev/v1beta1.
var APIServiceName = sbv1.GroupVersion.Version + "." + sbv1.Group

// Objects returns every object, in an order they can be created in.
func Objects(c Config) []client.Object {
	out := []client.Object{ServiceAccount(c), Service(c)}
	if len(c.Endpoints) > 0 && c.ExternalName == "" {
		out = append(out, EndpointSlice(c))
	}
	out = append(out, RBAC(c)...)
	out = append(out, UserRoles()...)
	return append(out, APIService(c))
}

// ServiceAccount is the identity the replicas run as.
func ServiceAccount(c Config) *corev1.ServiceAccount {
	c = c.withDefaults()
	return &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, Labels: labels(c)},
	}
}

func labels(c Config) map[string]string {
	return map[string]string{"app.kubernetes.io/name": c.Name, "app.kubernetes.io/part-of": "skiff"}
}

// Service is what the APIService points at.
func Service(c Config) *corev1.Service {
	c = c.withDefaults()
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, Labels: labels(c)},
	}
	if c.ExternalName != "" {
		svc.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: c.ExternalName}
		return svc
	}
	svc.Spec = corev1.ServiceSpec{
		Selector: c.Selector,
		Ports: []corev1.ServicePort{{
			Name: servicePortName, Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(c.TargetPort),
		}},
	}
	if len(c.Endpoints) > 0 {
		svc.Spec.Selector = nil
	}
	return svc
}

// servicePortName names the Service's port, which an EndpointSlice's port
// must match.
const servicePortName = "kube-api"

// EndpointSlice lists c.Endpoints at TargetPort for the selector-less
// Service, as the EndpointSlice controller would for pods.
func EndpointSlice(c Config) *discoveryv1.EndpointSlice {
	c = c.withDefaults()
	l := labels(c)
	l[discoveryv1.LabelServiceName] = c.Name
	l[discoveryv1.LabelManagedBy] = "skiff.dev"
	ready := true
	eps := make([]discoveryv1.Endpoint, 0, len(c.Endpoints))
	for _, addr := range c.Endpoints {
		eps = append(eps, discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	name, proto := servicePortName, corev1.ProtocolTCP
	return &discoveryv1.EndpointSlice{
		TypeMeta:    metav1.TypeMeta{APIVersion: discoveryv1.SchemeGroupVersion.String(), Kind: "EndpointSlice"},
		ObjectMeta:  metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, Labels: l},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &c.TargetPort, Protocol: &proto}},
	}
}

// APIService registers sandbox.skiff.dev/v1beta1 with the aggregator.
func APIService(c Config) *apiregistrationv1.APIService {
	c = c.withDefaults()
	port := int32(443)
	if c.ExternalName != "" {
		port = c.TargetPort
	}
	return &apiregistrationv1.APIService{
		TypeMeta:   metav1.TypeMeta{APIVersion: apiregistrationv1.SchemeGroupVersion.String(), Kind: "APIService"},
		ObjectMeta: metav1.ObjectMeta{Name: APIServiceName, Labels: labels(c)},
		Spec: apiregistrationv1.APIServiceSpec{
			Service:              &apiregistrationv1.ServiceReference{Namespace: c.Namespace, Name: c.Name, Port: &port},
			Group:                sbv1.Group,
			Version:              sbv1.GroupVersion.Version,
			CABundle:             c.CABundle,
			GroupPriorityMinimum: 1000,
			VersionPriority:      15,
		},
	}
}

// RBAC is what the replicas may do: delegate authentication and
// authorization to the kube-apiserver, read the fleet (inventories,
// templates, warm pools), the API keys (Secrets) and write warm pools'
// status, and hold the warm-pool driver's Lease in their namespace.
func RBAC(c Config) []client.Object {
	c = c.withDefaults()
	sa := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: c.Name, Namespace: c.Namespace}}
	rbac := metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String()}
	typed := func(kind string) metav1.TypeMeta { t := rbac; t.Kind = kind; return t }
	read := []string{"get", "list", "watch"}
	return []client.Object{
		&rbacv1.ClusterRole{
			TypeMeta:   typed("ClusterRole"),
			ObjectMeta: metav1.ObjectMeta{Name: "skiff:" + c.Name, Labels: labels(c)},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{v1beta1.Group}, Resources: []string{"nodeinventories", "nodeinventoryshards", "sandboxtemplates", "sandboxwarmpools"}, Verbs: read},
				{APIGroups: []string{v1beta1.Group}, Resources: []string{"sandboxwarmpools/status"}, Verbs: []string{"get", "update", "patch"}},
				// RBAC cannot select by label; the informer selects the
				// skiff.dev/api-key Secrets.
				{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: read},
				{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
			},
		},
		&rbacv1.ClusterRoleBinding{
			TypeMeta:   typed("ClusterRoleBinding"),
			ObjectMeta: metav1.ObjectMeta{Name: "skiff:" + c.Name, Labels: labels(c)},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "skiff:" + c.Name},
			Subjects:   sa,
		},
		// TokenReview and SubjectAccessReview, for delegated authentication
		// and authorization.
		&rbacv1.ClusterRoleBinding{
			TypeMeta:   typed("ClusterRoleBinding"),
			ObjectMeta: metav1.ObjectMeta{Name: "skiff:" + c.Name + ":auth-delegator", Labels: labels(c)},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"},
			Subjects:   sa,
		},
		// The front-proxy's client CA and header names, which the
		// kube-apiserver publishes in kube-system.
		&rbacv1.RoleBinding{
			TypeMeta:   typed("RoleBinding"),
			ObjectMeta: metav1.ObjectMeta{Name: "skiff:" + c.Name + ":auth-reader", Namespace: "kube-system", Labels: labels(c)},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "extension-apiserver-authentication-reader"},
			Subjects:   sa,
		},
		&rbacv1.Role{
			TypeMeta:   typed("Role"),
			ObjectMeta: metav1.ObjectMeta{Name: "skiff:" + c.Name + ":leader-election", Namespace: c.Namespace, Labels: labels(c)},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
			},
		},
		&rbacv1.RoleBinding{
			TypeMeta:   typed("RoleBinding"),
			ObjectMeta: metav1.ObjectMeta{Name: "skiff:" + c.Name + ":leader-election", Namespace: c.Namespace, Labels: labels(c)},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "skiff:" + c.Name + ":leader-election"},
			Subjects:   sa,
		},
	}
}

// Names of the user-facing ClusterRoles.
const (
	ViewerRole = "skiff:sandboxes:view"
	EditorRole = "skiff:sandboxes:edit"
)

// UserRoles are the ClusterRoles to bind users to: ViewerRole sees
// sandboxes (get, list, watch) and EditorRole also deletes them. Both
// aggregate into Kubernetes' own roles (view; edit and admin), so that a
// team bound to "edit" in its namespace sees and kills its sandboxes there
// with kubectl.
func UserRoles() []client.Object {
	typed := metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRole"}
	read := []string{"get", "list", "watch"}
	return []client.Object{
		&rbacv1.ClusterRole{
			TypeMeta: typed,
			ObjectMeta: metav1.ObjectMeta{Name: ViewerRole, Labels: map[string]string{
				"app.kubernetes.io/part-of":                    "skiff",
				"rbac.authorization.k8s.io/aggregate-to-view":  "true",
				"rbac.authorization.k8s.io/aggregate-to-edit":  "true",
				"rbac.authorization.k8s.io/aggregate-to-admin": "true",
			}},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{sbv1.Group}, Resources: []string{"sandboxes"}, Verbs: read}},
		},
		&rbacv1.ClusterRole{
			TypeMeta: typed,
			ObjectMeta: metav1.ObjectMeta{Name: EditorRole, Labels: map[string]string{
				"app.kubernetes.io/part-of":                    "skiff",
				"rbac.authorization.k8s.io/aggregate-to-edit":  "true",
				"rbac.authorization.k8s.io/aggregate-to-admin": "true",
			}},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{sbv1.Group}, Resources: []string{"sandboxes"}, Verbs: append(read, "delete")}},
		},
	}
}

// WaitAvailable waits until the aggregator reports the APIService
// Available (it reaches a replica and trusts its certificate), or ctx ends;
// the error then says what the APIService's condition last said.
func WaitAvailable(ctx context.Context, c client.Reader) error {
	var last string
	for {
		var svc apiregistrationv1.APIService
		if err := c.Get(ctx, client.ObjectKey{Name: APIServiceName}, &svc); err != nil {
			last = err.Error()
		}
		for _, cond := range svc.Status.Conditions {
			if cond.Type == apiregistrationv1.Available {
				if cond.Status == apiregistrationv1.ConditionTrue {
					return nil
				}
				last = cond.Reason + ": " + cond.Message
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("APIService %s is not Available: %s: %w", APIServiceName, last, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// NewScheme returns a scheme that knows every kind Objects returns (core,
// discovery, RBAC, apiregistration), for a client that creates them or
// waits on the APIService.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(s))
	utilruntime.Must(discoveryv1.AddToScheme(s))
	utilruntime.Must(rbacv1.AddToScheme(s))
	utilruntime.Must(apiregistrationv1.AddToScheme(s))
	return s
}
