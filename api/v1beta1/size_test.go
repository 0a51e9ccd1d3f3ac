package v1beta1_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// An inventory of 2,000 sandboxes, each with names of a realistic length,
// metadata filled to its bound and the largest disk, takes about 1 MiB,
// well inside etcd's 1.5 MiB request limit: 1,050,350 bytes, 28,000 of them
// the microseconds of the sandboxes' times, which took this worst case
// past 1 MiB. (TestInventoryOf2000SandboxesStoredUnder1MiB, in
// shared/publish, stores one with a smaller disk on a real kube-apiserver:
// under 1 MiB, managed fields included.)
func TestInventoryOf2000SandboxesSize(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	// An entry's times are written with their microseconds, six digits
	// whatever they are.
	started := v1beta1.NewMicroTime(now.Add(123456 * time.Microsecond))
	end := v1beta1.NewMicroTime(started.Add(time.Hour))
	// 8 keys of 8 bytes and values of 16: 192 bytes, the bound.
	meta := map[string]string{}
	for i := range 8 {
		meta[fmt.Sprintf("key-%04d", i)] = strings.Repeat("v", 16)
	}
	total := 0
	for k, v := range meta {
		total += len(k) + len(v)
	}
	if total != v1beta1.MaxSandboxMetadataBytes {
		t.Fatalf("test metadata is %d bytes, want the bound %d", total, v1beta1.MaxSandboxMetadataBytes)
	}
	inv := v1beta1.NodeInventory{
		TypeMeta:    metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "NodeInventory"},
		ObjectMeta:  metav1.ObjectMeta{Name: "sandbox-host-0001.example.internal"},
		PublishedAt: &now,
		Spec: v1beta1.NodeInventorySpec{
			Endpoint: "10.20.30.40:27777",
			Capacity: v1beta1.NodeCapacity{CPUMilli: 256000, MemoryMiB: 1 << 20, Sandboxes: 2000}, EnvdVersion: "0.6.4",
		},
	}
	for i := range 2000 {
		inv.Spec.Sandboxes = append(inv.Spec.Sandboxes, v1beta1.SandboxEntry{
			ID: fmt.Sprintf("i%019d", i), Template: "code-interpreter-v1", State: v1beta1.SandboxRunning,
			Pool: "team-analytics/code-interp", Team: "team-analytics", StartedAt: started, EndAt: &end,
			CPUMilli: 2000, MemoryMiB: 2048, DiskMiB: 1048576, Metadata: meta, // the largest disk
		})
	}
	data, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("2,000 sandboxes: %d bytes (%.0f per sandbox)", len(data), float64(len(data))/2000)
	if limit := 11 << 20 / 10; len(data) >= limit {
		t.Fatalf("inventory is %d bytes, want under 1.1 MiB (%d)", len(data), limit)
	}
}
