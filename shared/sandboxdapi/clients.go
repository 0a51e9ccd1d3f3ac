package sandboxdapi

import (
	"context"
	"net/http"
	"sync"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

// NewClients returns a lookup that keeps one sandboxd client per
// endpoint (host:port, spoken to over http://), each sending token as
// "Authorization: Bearer <token>" on every call, streams included. A nil
// httpClient means http.DefaultClient. With tracing on (tracing.Enabled)
// every call but Watch is under a client span (SpanName) whose context
// goes out in traceparent.
func NewClients(token string, httpClient *http.Client) func(endpoint string) sandboxdv1connect.SandboxdServiceClient {
	clients := NewNodeClients(func(string) string { return token }, httpClient)
	return func(endpoint string) sandboxdv1connect.SandboxdServiceClient { return clients("", endpoint) }
}

// NewNodeClients is NewClients with a token per node: the lookup keeps one
// client per node and endpoint (the node's NodeInventory names both), which
// sends token(node) (nodetoken.Tokens.For). A node whose inventory moves to
// another endpoint gets a client there.
func NewNodeClients(token func(node string) string, httpClient *http.Client) func(node, endpoint string) sandboxdv1connect.SandboxdServiceClient {
	httpClient = traced(httpClient)
	type key struct{ node, endpoint string }
	var (
		mu      sync.Mutex
		clients = make(map[key]sandboxdv1connect.SandboxdServiceClient)
	)
	return func(node, endpoint string) sandboxdv1connect.SandboxdServiceClient {
		mu.Lock()
		defer mu.Unlock()
		k := key{node, endpoint}
		c, ok := clients[k]
		if !ok {
			auth := connect.WithInterceptors(bearer("Bearer " + token(node)))
			c = sandboxdv1connect.NewSandboxdServiceClient(httpClient, "http://"+endpoint, auth)
			clients[k] = c
		}
		return c
	}
}

// bearer is an interceptor that sets the Authorization header to itself.
type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", string(b))
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", string(b))
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
