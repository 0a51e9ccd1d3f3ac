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
// httpClient means http.DefaultClient.
func NewClients(token string, httpClient *http.Client) func(endpoint string) sandboxdv1connect.SandboxdServiceClient {
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	auth := connect.WithInterceptors(bearer("Bearer " + token))
	var (
		mu      sync.Mutex
		clients = make(map[string]sandboxdv1connect.SandboxdServiceClient)
	)
	return func(endpoint string) sandboxdv1connect.SandboxdServiceClient {
		mu.Lock()
		defer mu.Unlock()
		c, ok := clients[endpoint]
		if !ok {
			c = sandboxdv1connect.NewSandboxdServiceClient(httpClient, "http://"+endpoint, auth)
			clients[endpoint] = c
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
