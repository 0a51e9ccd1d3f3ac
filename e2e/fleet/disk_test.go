package fleet

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestFullDisk: one host's disk is below its reserve (sandboxd
// --disk-reserve). Its inventory and its Node say so (diskPressure, the
// DiskPressure condition), and the fleet goes on without it: every create
// and every volume lands on the other host, through either replica, and
// none is refused; a sandbox that mounts the volume goes there too.
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
	// The full host says so: in its inventory, which placement reads, and
	// as its Node's DiskPressure condition.
	f.eventually(30*time.Second, "the full host's inventory and Node show its disk pressure", func() string {
		a, b := f.inventory(hostA), f.inventory(hostB)
		if a == nil || b == nil || a.Spec.DiskPressure || !b.Spec.DiskPressure || !b.Spec.VolumeDiskPressure {
			return fmt.Sprintf("diskPressure: %s %v, %s %v", hostA, a != nil && a.Spec.DiskPressure, hostB, b != nil && b.Spec.DiskPressure)
		}
		node := &corev1.Node{}
		if err := f.admin.Get(t.Context(), client.ObjectKey{Name: hostB}, node); err != nil {
			return err.Error()
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeDiskPressure {
				if c.Status != corev1.ConditionTrue || !strings.Contains(c.Message, "--disk-reserve") {
					return fmt.Sprintf("%s's DiskPressure: %s %q", hostB, c.Status, c.Message)
				}
				return ""
			}
		}
		return hostB + " has no DiskPressure condition"
	})
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

	// Placement never tried the full host: its sandboxd was asked for no
	// create, no warm sandbox and no volume (its vk-sandbox's Info calls
	// show the count is read).
	calls := f.sandboxdCalls(hostB)
	lineOK(t, calls["Info"] > 0 && calls["Create"]+calls["Warm"]+calls["CreateVolume"] == 0,
		"%s's sandboxd was not asked for a sandbox or a volume: %v", hostB, calls)
}

// sandboxdCalls counts the calls a host's sandboxd answered, by method
// (its rpc_requests_total, read from its admin endpoint inside the host's
// namespace).
func (f *fleet) sandboxdCalls(name string) map[string]int {
	h := f.hosts[name]
	tr := &http.Transport{DialContext: h.ns.Dial}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: tr}
	resp, err := hc.Get("http://" + h.h.Admin + "/metrics")
	if err != nil {
		f.t.Fatalf("%s's sandboxd metrics: %v", name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	calls := map[string]int{}
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "skiff_sandboxd_rpc_requests_total{")
		if !ok {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		for l := range strings.SplitSeq(labels, ",") {
			if m, ok := strings.CutPrefix(l, `method="`); ok {
				n, _ := strconv.ParseFloat(strings.TrimSpace(value), 64)
				calls[strings.TrimSuffix(m, `"`)] += int(n)
			}
		}
	}
	return calls
}
