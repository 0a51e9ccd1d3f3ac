package placement_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/inventory"
	"github.com/skiff-dev/skiff/shared/placement"
)

// benchFleet returns n nodes, each with 8 templates (base among them) and
// sandboxes sandboxes, of which every tenth is warm, at various allocations.
func benchFleet(n, sandboxes int) *inventory.StaticSource {
	src := inventory.NewStaticSource()
	for i := range n {
		inv := node(fmt.Sprintf("node-%03d", i), res(64_000, 256<<10, 256), res(int64(i%50)*1000, int64(i%30)*4096, int32(sandboxes)),
			"python", "node", "go", "rust", "java", "ruby", "dotnet", "base")
		for j := range sandboxes {
			state := v1beta1.SandboxRunning
			if j%10 == 0 {
				state = v1beta1.SandboxWarm
			}
			inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, v1beta1.SandboxEntry{
				ID: fmt.Sprintf("%s%08d", inv.Name, j), Template: "base", State: state, Pool: "team/base", Team: "team",
				CPUMilli: 1000, MemoryMiB: 512,
			})
		}
		src.Apply(inv)
	}
	return src
}

// BenchmarkPlace measures one cold placement on 200 nodes, create doing
// nothing:
//
//   - static: through a StaticSource, whose listing deep-copies the fleet (as
//     the production source's does), 10 sandboxes a node;
//   - placer: through a listing without copies, the cost of placement alone;
//   - parallel: the same, from every P at once, contending for the Placer.
func BenchmarkPlace(b *testing.B) {
	const nodes = 200
	req := placement.Request{Template: "base", CPUMilli: 1000, MemoryMiB: 512}
	create := func(context.Context, *v1beta1.NodeInventory) (placement.Created, error) {
		return placement.Created{}, nil
	}

	b.Run(fmt.Sprintf("static/%d", nodes), func(b *testing.B) {
		p := placement.New(benchFleet(nodes, 10), placement.Options{})
		b.ReportAllocs()
		for b.Loop() {
			if _, err := p.Place(b.Context(), req, create); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run(fmt.Sprintf("placer/%d", nodes), func(b *testing.B) {
		p := placement.New(listed(b, benchFleet(nodes, 10)), placement.Options{})
		b.ReportAllocs()
		for b.Loop() {
			if _, err := p.Place(b.Context(), req, create); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run(fmt.Sprintf("parallel/%d", nodes), func(b *testing.B) {
		p := placement.New(listed(b, benchFleet(nodes, 10)), placement.Options{})
		ctx := b.Context()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := p.Place(ctx, req, create); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkClaim measures one warm claim on 200 nodes of 100 sandboxes (10
// warm), through a StaticSource, the first candidate's claim succeeding.
func BenchmarkClaim(b *testing.B) {
	p := placement.New(benchFleet(200, 100), placement.Options{})
	claim := func(context.Context, inventory.Candidate) error { return nil }
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Claim(b.Context(), "base", 0, claim); err != nil {
			b.Fatal(err)
		}
	}
}
