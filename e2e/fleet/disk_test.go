package fleet

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestFullDisk: one host's disk is below its reserve (sandboxd
// --disk-reserve). The fleet goes on without it: every create and every
// volume lands on the other host, through either replica, and none is
// refused; a sandbox that mounts the volume goes there too.
func TestFullDisk(t *testing.T) {
	cfg := configFromEnv(t)
	cfg.fullHost = hostB
	f := newFleet(t, cfg)
	var ids, vols []string
	defer func() {
		for _, id := range ids {
			f.call(f.replicas[0], http.MethodDelete, "/sandboxes/"+id, nil)
		}
		// A volume's mount goes with it; the host's cleanup needs that.
		for _, id := range vols {
			if code, body := f.call(f.replicas[0], http.MethodDelete, "/volumes/"+id, nil); code != http.StatusNoContent {
				t.Errorf("delete volume %s: %d %s", id, code, body)
			}
		}
	}()
	on := map[string]int{}
	for i := range 6 {
		id, node, _, err := f.create(f.replicas[i%2])
		if err != nil {
			t.Fatalf("create %d with %s's disk full: %v", i, hostB, err)
		}
		ids = append(ids, id)
		on[node]++
	}
	lineOK(t, on[hostA] == 6, "6 creates with %s's disk full all land on %s: %v", hostB, hostA, on)

	// Volumes go where a rendezvous of the team and name says; with that
	// host full, to the next. Several names: some would go to hostB.
	for _, name := range []string{"full-1", "full-2", "full-3", "full-4"} {
		code, body := f.call(f.replicas[0], http.MethodPost, "/volumes", map[string]any{"name": name})
		if code != http.StatusCreated {
			t.Fatalf("create volume %s with %s's disk full: %d %s", name, hostB, code, body)
		}
		var vol struct{ VolumeID string }
		if err := json.Unmarshal(body, &vol); err != nil {
			t.Fatal(err)
		}
		vols = append(vols, vol.VolumeID)
		code, id, node, _, body := f.createMounting(f.replicas[1], name)
		if code == http.StatusCreated {
			ids = append(ids, id)
		}
		lineOK(t, code == http.StatusCreated && node == hostA, "volume %s and a sandbox mounting it on %s: %d on %q %s", name, hostA, code, node, body)
	}
	// A name is still taken: the full host, which has it not, passes it
	// on, and the one that has it says so.
	code, body := f.call(f.replicas[0], http.MethodPost, "/volumes", map[string]any{"name": "full-1"})
	lineOK(t, code == http.StatusBadRequest && strings.Contains(string(body), "already exists"), "a taken name is still taken, with %s full: %d %s", hostB, code, body)
}
