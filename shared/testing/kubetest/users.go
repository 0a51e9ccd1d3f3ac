package kubetest

import (
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/skiff-dev/skiff/api/policies"
)

// User reaches the control plane as one user, authenticated by a client
// certificate that the control plane's CA signed (CN the name, O each
// group), as a production host is.
type User struct {
	// Config carries the certificate; Kubeconfig writes it for a binary.
	Config *rest.Config
	// Client is a direct client with the Env's scheme.
	Client client.Client
}

// AddUser returns a new user name in groups. What the user may do is up to
// RBAC and the policies, as in production: nothing until a role is bound.
func (e *Env) AddUser(t testing.TB, name string, groups ...string) User {
	t.Helper()
	u, err := e.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		t.Fatalf("kubetest: add user %s: %v", name, err)
	}
	cfg := u.Config()
	c, err := client.New(cfg, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatalf("kubetest: client for %s: %v", name, err)
	}
	return User{Config: cfg, Client: c}
}

// NodeUser returns the identity of the sandbox host whose node is named
// node, as its client certificate gives it: user skiff:node:<node> in group
// skiff:nodes.
func (e *Env) NodeUser(t testing.TB, node string) User {
	t.Helper()
	return e.AddUser(t, policies.NodeUser(node), policies.NodesGroup)
}
