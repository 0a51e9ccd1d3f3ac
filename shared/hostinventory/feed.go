package hostinventory

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/shared/inventory"
)

// Feed keeps host's inventory in src until ctx ends: applied, stamped with
// now, on every change, and removed as soon as the mirror loses sync, so a
// reader of src never routes to a host it cannot hear. It is the
// single-host mode's publisher; Run must be running for host to change.
func Feed(ctx context.Context, host *Host, src *inventory.StaticSource, now func() time.Time) {
	var name string // the node last applied
	for {
		if inv, err := host.Inventory(); err == nil {
			stamp := metav1.NewTime(now())
			inv.PublishedAt = &stamp
			if name != "" && name != inv.Name {
				src.Remove(name) // the host was renamed
			}
			name = inv.Name
			src.Apply(inv)
		} else if name != "" {
			src.Remove(name)
			name = ""
		}
		select {
		case <-ctx.Done():
			if name != "" {
				src.Remove(name)
			}
			return
		case <-host.Changed():
		}
	}
}
