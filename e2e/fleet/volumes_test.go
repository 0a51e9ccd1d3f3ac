package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// createMounting creates a sandbox of team-a that mounts volume at
// /home/user/vol, through replica r.
func (f *fleet) createMounting(r *replica, volume string) (code int, id, node, token string, body []byte) {
	req := map[string]any{"templateID": "base", "timeout": 600, "volumeMounts": []map[string]string{{"name": volume, "path": "/home/user/vol"}}}
	code, body = f.call(r, http.MethodPost, "/v2/sandboxes", req)
	for i := 0; code == http.StatusTooManyRequests && i < 20; i++ {
		time.Sleep(500 * time.Millisecond)
		code, body = f.call(r, http.MethodPost, "/v2/sandboxes", req)
	}
	var out struct{ SandboxID, ClientID, EnvdAccessToken string }
	_ = json.Unmarshal(body, &out)
	return code, out.SandboxID, out.ClientID, out.EnvdAccessToken, body
}

// volumeFile reads a file of a volume through replica r's content API,
// with the volume's token.
func (f *fleet) volumeFile(r *replica, id, token, path string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.api+"/volumecontent/"+id+"/file?"+url.Values{"path": {path}}.Encode(), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// volumes: a volume lives on one host, and every sandbox that mounts it is
// placed there, whichever replica is asked; two of them share its files,
// which the content API (on the other replica) reads too; it is not
// deleted while mounted; with its host dead a create that mounts it
// answers 503 naming the host; then the fleet is whole again and the
// volume goes.
func (l *lanes) volumes(t *testing.T) {
	f := l.f
	r0, r1 := f.replicas[0], f.replicas[1]
	code, body := f.call(r0, http.MethodPost, "/volumes", map[string]any{"name": "lane-vol"})
	if code != http.StatusCreated {
		t.Fatalf("create volume: %d %s", code, body)
	}
	var vol struct{ VolumeID, Name, Token string }
	if err := json.Unmarshal(body, &vol); err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			f.call(r0, http.MethodDelete, "/volumes/"+vol.VolumeID, nil)
		}
	})
	code, body = f.call(r1, http.MethodPost, "/volumes", map[string]any{"name": "lane-vol"})
	lineOK(t, code == http.StatusBadRequest && strings.Contains(string(body), "already exists"), "a second volume of the name, through the other replica: %d %s", code, body)

	var ids []string
	nodes := map[string]int{}
	tokens := map[string]string{}
	for i := range 4 {
		code, id, node, tok, body := f.createMounting(f.replicas[i%2], "lane-vol")
		if code != http.StatusCreated {
			t.Fatalf("create mounting the volume: %d %s", code, body)
		}
		ids = append(ids, id)
		nodes[node]++
		tokens[id] = tok
	}
	defer func() {
		for _, id := range ids {
			f.call(r0, http.MethodDelete, "/sandboxes/"+id, nil)
		}
	}()
	var home string
	for n := range nodes {
		home = n
	}
	lineOK(t, len(nodes) == 1, "4 creates mounting the volume, through both replicas, all on its host: %v", nodes)

	_, err := f.file(ids[0], tokens[ids[0]], "/home/user/vol/shared.txt", []byte("written in one sandbox"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.file(ids[1], tokens[ids[1]], "/home/user/vol/shared.txt", nil)
	lineOK(t, err == nil && got == "written in one sandbox", "another sandbox reads it: %q %v", got, err)
	code, content := f.volumeFile(r1, vol.VolumeID, vol.Token, "/shared.txt")
	lineOK(t, code == http.StatusOK && content == "written in one sandbox", "the content API reads it through the other replica: %d %q", code, content)

	code, body = f.call(r1, http.MethodGet, "/volumes/"+vol.VolumeID, nil)
	var info struct{ SizeBytes, UsedBytes int64 }
	_ = json.Unmarshal(body, &info)
	lineOK(t, code == http.StatusOK && info.SizeBytes == 10240<<20 && info.UsedBytes > 0 && info.UsedBytes < info.SizeBytes,
		"its size and what it uses, through the other replica: %d %s", code, body)

	code, body = f.call(r1, http.MethodDelete, "/volumes/"+vol.VolumeID, nil)
	lineOK(t, code == http.StatusConflict, "delete while mounted: %d %s", code, body)

	// Its host dead: a create that mounts it says so.
	l.killHost(home)
	f.eventually(f.cfg.window+3*f.cfg.interval, home+" to leave the fleet", func() string {
		listed, err := f.e2bList(r0)
		if err != nil {
			return err.Error()
		}
		if listed[ids[0]] {
			return "its sandboxes are still listed"
		}
		return ""
	})
	code, _, _, _, body = f.createMounting(r0, "lane-vol")
	lineOK(t, code == http.StatusServiceUnavailable && strings.Contains(string(body), home), "with %s dead, a create mounting its volume: %d %s", home, code, body)
	l.restartHost(t, home)
	f.eventually(f.cfg.window+3*f.cfg.interval, home+" back in the fleet", func() string {
		if code, _ := f.call(r0, http.MethodGet, "/sandboxes/"+ids[0], nil); code != http.StatusOK {
			return fmt.Sprintf("its sandbox: %d", code)
		}
		return ""
	})
	got, err = f.file(ids[2], tokens[ids[2]], "/home/user/vol/shared.txt", nil)
	lineOK(t, err == nil && got == "written in one sandbox", "after its host's sandboxd was killed and started, the files are there: %q %v", got, err)

	for _, id := range ids {
		f.call(r0, http.MethodDelete, "/sandboxes/"+id, nil)
	}
	code, body = f.call(r1, http.MethodDelete, "/volumes/"+vol.VolumeID, nil)
	lineOK(t, code == http.StatusNoContent, "delete once no sandbox mounts it: %d %s", code, body)
	deleted = code == http.StatusNoContent
	code, body = f.call(r0, http.MethodGet, "/volumes", nil)
	lineOK(t, code == http.StatusOK && string(body) == "[]\n", "then the team has no volume: %d %s", code, body)
}

// TestSharedVolumes: both hosts keep their volumes in one shared store (a
// folder both mount, as an NFS export would be): they publish the same
// store and no volumes of their own, sandboxes that mount a volume go to
// either host and see each other's writes, and with one host dead the
// volume is still mounted, read and written through the other.
func TestSharedVolumes(t *testing.T) {
	cfg := configFromEnv(t)
	cfg.sharedVolumes = t.TempDir()
	f := newFleet(t, cfg)
	l := &lanes{f: f}
	r0, r1 := f.replicas[0], f.replicas[1]
	code, body := f.call(r0, http.MethodPost, "/volumes", map[string]any{"name": "shared-vol"})
	if code != http.StatusCreated {
		t.Fatalf("create volume: %d %s", code, body)
	}
	var vol struct{ VolumeID, Token string }
	if err := json.Unmarshal(body, &vol); err != nil {
		t.Fatal(err)
	}
	f.eventually(3*f.cfg.interval, "both hosts to publish the shared store", func() string {
		a, b := f.inventory(hostA), f.inventory(hostB)
		switch {
		case a == nil || b == nil:
			return "no inventory yet"
		case a.Spec.SharedVolumeStore == "" || a.Spec.SharedVolumeStore != b.Spec.SharedVolumeStore:
			return fmt.Sprintf("stores %q and %q", a.Spec.SharedVolumeStore, b.Spec.SharedVolumeStore)
		case len(a.Spec.Volumes)+len(b.Spec.Volumes) != 0:
			return fmt.Sprintf("they list volumes: %v %v", a.Spec.Volumes, b.Spec.Volumes)
		}
		return ""
	})
	code, body = f.call(r1, http.MethodPost, "/volumes", map[string]any{"name": "shared-vol"})
	lineOK(t, code == http.StatusBadRequest && strings.Contains(string(body), "already exists"), "the name is taken in the store, through the other replica: %d %s", code, body)

	// Creates until one sandbox is on each host.
	on := map[string][2]string{} // node → id, token
	var ids []string
	defer func() {
		for _, id := range ids {
			f.call(r0, http.MethodDelete, "/sandboxes/"+id, nil)
		}
	}()
	for i := 0; len(on) < 2; i++ {
		if i == 12 {
			t.Fatalf("12 creates mounting the volume all went to %v", on)
		}
		code, id, node, tok, body := f.createMounting(f.replicas[i%2], "shared-vol")
		if code != http.StatusCreated {
			t.Fatalf("create mounting the volume: %d %s", code, body)
		}
		ids = append(ids, id)
		if _, ok := on[node]; !ok {
			on[node] = [2]string{id, tok}
		}
		// Placement weighs what the inventories say: let the host publish
		// its new sandbox before the next create.
		time.Sleep(f.cfg.interval + 500*time.Millisecond)
	}
	a, b := on[hostA], on[hostB]
	if _, err := f.file(a[0], a[1], "/home/user/vol/from-a.txt", []byte("written on "+hostA)); err != nil {
		t.Fatal(err)
	}
	got, err := f.file(b[0], b[1], "/home/user/vol/from-a.txt", nil)
	lineOK(t, err == nil && got == "written on "+hostA, "a sandbox on %s reads what one on %s wrote: %q %v", hostB, hostA, got, err)

	// One host dead: the other serves the volume.
	l.killHost(hostB)
	f.eventually(f.cfg.window+3*f.cfg.interval, hostB+" to leave the fleet", func() string {
		listed, err := f.e2bList(r0)
		if err != nil {
			return err.Error()
		}
		if listed[b[0]] {
			return "its sandbox is still listed"
		}
		return ""
	})
	code, id, node, tok, body := f.createMounting(r1, "shared-vol")
	lineOK(t, code == http.StatusCreated && node == hostA, "with %s dead, a create mounting the volume: %d on %q %s", hostB, code, node, body)
	if code == http.StatusCreated {
		ids = append(ids, id)
		got, err = f.file(id, tok, "/home/user/vol/from-a.txt", nil)
		lineOK(t, err == nil && got == "written on "+hostA, "and it reads the volume: %q %v", got, err)
	}
	code, content := f.volumeFile(r0, vol.VolumeID, vol.Token, "/from-a.txt")
	lineOK(t, code == http.StatusOK && content == "written on "+hostA, "the content API reads it with %s dead: %d %q", hostB, code, content)
	l.restartHost(t, hostB)

	for _, id := range ids {
		f.call(r0, http.MethodDelete, "/sandboxes/"+id, nil)
	}
	ids = nil
	code, body = f.call(r1, http.MethodDelete, "/volumes/"+vol.VolumeID, nil)
	lineOK(t, code == http.StatusNoContent, "delete once no sandbox mounts it: %d %s", code, body)
}
