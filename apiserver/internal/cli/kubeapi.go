package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	sbv1 "github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/aggregated"
	"github.com/skiff-dev/skiff/apiserver/internal/aggregated/registry"
	"github.com/skiff-dev/skiff/apiserver/internal/aggregated/view"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/apiserver/internal/fleet"
)

// kubeAPI is the aggregated API (sandbox.skiff.dev) of serve --inventory
// kube: the view of the fleet it serves, kept current by the informer's
// NodeInventory events, and its server.
type kubeAPI struct {
	server *aggregated.Server
	stop   func()
}

// newKubeAPI builds the view over k's fleet source and the aggregated
// server over it; kills go through backend. The view runs until stop (or
// the end of ctx); the server serves once run.
func newKubeAPI(ctx context.Context, o *serveOptions, k *kubeParts, backend *fleet.Backend, log *slog.Logger) (*kubeAPI, error) {
	v := view.New(k.source, view.Options{History: o.watchHistory, Logger: log})
	if err := k.fleet.OnInventoryChange(ctx, v.Notify); err != nil {
		return nil, err
	}
	// The first rebuild, before the server answers anything.
	if err := v.Rebuild(ctx); err != nil {
		return nil, fmt.Errorf("build the sandbox view: %w", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { v.Run(runCtx) })
	srv, err := o.kubeAPI.New(registry.New(v, killer{backend}, o.bookmarkInterval), nil)
	if err != nil {
		cancel()
		wg.Wait()
		return nil, err
	}
	return &kubeAPI{server: srv, stop: func() { cancel(); wg.Wait() }}, nil
}

// killer kills for the aggregated API's delete: a team's sandbox through
// the backend, as the e2b API's kill does (its host checks the team), a
// warm one on its node.
type killer struct{ b *fleet.Backend }

func (k killer) Kill(ctx context.Context, sb *sbv1.Sandbox) error {
	var err error
	if sb.Status.State == sbv1.SandboxWarm {
		err = k.b.KillOnNode(ctx, sb.Spec.NodeName, sb.Name)
	} else {
		err = k.b.Kill(ctx, sb.Namespace, sb.Name)
	}
	if errors.Is(err, e2bapi.ErrNotFound) {
		return apierrors.NewNotFound(sbv1.Resource("sandboxes"), sb.Name)
	}
	return err
}
