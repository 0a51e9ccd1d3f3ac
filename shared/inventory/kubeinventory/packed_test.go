package kubeinventory_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// A packed entry is checked by the readers (SandboxEntry.Validate), not
// by the apiserver: for every rule of the schema, an entry that breaks it
// is refused by a real kube-apiserver in spec.sandboxes and by Validate,
// and one at the rule's edge is taken by both.
func TestValidateAgreesWithTheSchema(t *testing.T) {
	env := controlPlane(t)
	valid := func() v1beta1.SandboxEntry {
		return v1beta1.SandboxEntry{
			ID: "abcdefghij0123456789", Template: "base", State: v1beta1.SandboxRunning, Team: "team-a",
			StartedAt: v1beta1.NewMicroTime(time.Now()), CPUMilli: 2000, MemoryMiB: 512, DiskMiB: 1024,
			Metadata: map[string]string{"user": "u-1"},
		}
	}
	for _, tc := range []struct {
		name   string
		change func(e *v1beta1.SandboxEntry)
		ok     bool
	}{
		{"valid", func(*v1beta1.SandboxEntry) {}, true},
		{"warm without a team", func(e *v1beta1.SandboxEntry) { e.State, e.Team = v1beta1.SandboxWarm, "" }, true},
		{"running without a team", func(e *v1beta1.SandboxEntry) { e.Team = "" }, false},
		{"paused without a team", func(e *v1beta1.SandboxEntry) { e.State, e.Team = v1beta1.SandboxPaused, "" }, false},
		{"unknown state", func(e *v1beta1.SandboxEntry) { e.State = "sleeping" }, false},
		{"id too short", func(e *v1beta1.SandboxEntry) { e.ID = "abc" }, false},
		{"id with a capital", func(e *v1beta1.SandboxEntry) { e.ID = "Abcdefghij0123456789" }, false},
		{"no template", func(e *v1beta1.SandboxEntry) { e.Template = "" }, false},
		{"template of 63", func(e *v1beta1.SandboxEntry) { e.Template = strings.Repeat("t", 63) }, true},
		{"template of 64", func(e *v1beta1.SandboxEntry) { e.Template = strings.Repeat("t", 64) }, false},
		{"team of 64", func(e *v1beta1.SandboxEntry) { e.Team = strings.Repeat("t", 64) }, false},
		{"pool of 317", func(e *v1beta1.SandboxEntry) { e.Pool = strings.Repeat("p", 317) }, true},
		{"pool of 318", func(e *v1beta1.SandboxEntry) { e.Pool = strings.Repeat("p", 318) }, false},
		{"envd version of 33", func(e *v1beta1.SandboxEntry) { e.EnvdVersion = strings.Repeat("1", 33) }, false},
		{"no start", func(e *v1beta1.SandboxEntry) { e.StartedAt = v1beta1.MicroTime{} }, false},
		{"negative memory", func(e *v1beta1.SandboxEntry) { e.MemoryMiB = -1 }, false},
		{"9 metadata entries", func(e *v1beta1.SandboxEntry) {
			for i := range 9 {
				e.Metadata[fmt.Sprint(i)] = ""
			}
		}, false},
		{"metadata key of 65", func(e *v1beta1.SandboxEntry) { e.Metadata = map[string]string{strings.Repeat("k", 65): ""} }, false},
		{"metadata of 192 together", func(e *v1beta1.SandboxEntry) {
			e.Metadata = map[string]string{strings.Repeat("k", 64): strings.Repeat("v", 128)}
		}, true},
		{"metadata of 193 together", func(e *v1beta1.SandboxEntry) {
			e.Metadata = map[string]string{strings.Repeat("k", 64): strings.Repeat("v", 129)}
		}, false},
		{"metadata in characters, not bytes", func(e *v1beta1.SandboxEntry) {
			e.Metadata = map[string]string{"k": strings.Repeat("é", 191)}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := valid()
			tc.change(&e)
			sh := &v1beta1.NodeInventoryShard{
				ObjectMeta: metav1.ObjectMeta{Name: "n-s0"},
				Spec:       v1beta1.NodeInventoryShardSpec{Node: "n", Index: 0, Sandboxes: []v1beta1.SandboxEntry{e}},
			}
			err := env.Client.Create(t.Context(), sh)
			if err == nil {
				if derr := env.Client.Delete(t.Context(), sh); derr != nil {
					t.Fatal(derr)
				}
			}
			verr := e.Validate()
			if (err == nil) != tc.ok || (verr == nil) != tc.ok {
				t.Errorf("the apiserver: %v; Validate: %v; want both to %s it", err, verr, map[bool]string{true: "take", false: "refuse"}[tc.ok])
			}
		})
	}
}
