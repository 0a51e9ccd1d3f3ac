package hostinventory

import (
	"context"
	"time"

	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

// Follow mirrors each sandboxd at endpoints (host:port) into src until ctx
// ends: the single-host mode of every reader of the fleet. clients returns
// the client for an endpoint (sandboxdapi.NewClients builds one).
func Follow(ctx context.Context, endpoints []string, clients func(endpoint string) sandboxdv1connect.SandboxdServiceClient, src *inventory.StaticSource, opts Options) {
	for _, addr := range endpoints {
		h := New(clients(addr), addr, opts)
		go func() { _ = h.Run(ctx) }()
		go Feed(ctx, h, src, time.Now)
	}
}
