package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/api/v1beta1"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// createFrom creates a sandbox of team-a from template (a template or a
// snapshot) and returns its ID, node and envd token.
// A create the team's rate refuses (the lanes before created many) waits
// and tries again, as an SDK user would.
func (f *fleet) createFrom(r *replica, template string) (id, node, token string, err error) {
	code, body := f.call(r, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": template, "timeout": 600})
	for i := 0; code == http.StatusTooManyRequests && i < 20; i++ {
		time.Sleep(500 * time.Millisecond)
		code, body = f.call(r, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": template, "timeout": 600})
	}
	if code != http.StatusCreated {
		return "", "", "", fmt.Errorf("create from %s on %s: %d %s", template, r.name, code, body)
	}
	var out struct{ SandboxID, ClientID, EnvdAccessToken string }
	if err := json.Unmarshal(body, &out); err != nil {
		return "", "", "", err
	}
	return out.SandboxID, out.ClientID, out.EnvdAccessToken, nil
}

// file writes (content non-nil) or reads a file of sandbox id as user,
// through the proxy and envd's /files.
func (f *fleet) file(id, token, path string, content []byte) (string, error) {
	method, body := http.MethodGet, io.Reader(http.NoBody)
	if content != nil {
		method, body = http.MethodPost, bytes.NewReader(content)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, f.proxyURL+"/files?"+url.Values{"path": {path}, "username": {"user"}}.Encode(), body)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", token)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s %s in %s: %d %s", method, path, id, resp.StatusCode, b)
	}
	return string(b), nil
}

// snapshots: a snapshot taken on host A starts sandboxes on A; with A full
// a create from it lands on B, which pulls it from A; with A dead, B's
// copy still lists and starts. Then the fleet is whole again.
func (l *lanes) snapshots(t *testing.T) {
	f := l.f
	r := f.replicas[0]
	// A sandbox on A with a file of its own.
	var id, token string
	for i := 0; ; i++ {
		sid, node, tok, err := f.createFrom(r, "base")
		if err != nil {
			t.Fatal(err)
		}
		if node == hostA {
			id, token = sid, tok
			break
		}
		f.call(r, http.MethodDelete, "/sandboxes/"+sid, nil)
		if i > 20 {
			t.Fatal("20 creates and none on " + hostA)
		}
	}
	if _, err := f.file(id, token, "/home/user/lane.txt", []byte("from host A")); err != nil {
		t.Fatal(err)
	}
	code, body := f.call(r, http.MethodPost, "/sandboxes/"+id+"/snapshots", map[string]any{"name": "lane"})
	if code != http.StatusCreated {
		t.Fatalf("snapshot: %d %s", code, body)
	}
	var snap struct{ SnapshotID string }
	if err := json.Unmarshal(body, &snap); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.call(r, http.MethodDelete, "/templates/"+url.PathEscape(snap.SnapshotID), nil) })
	f.eventually(3*f.cfg.interval+5*time.Second, "A's inventory lists the snapshot", func() string {
		if inv := f.inventory(hostA); inv == nil || len(inv.Spec.Snapshots) == 0 {
			return "not yet"
		}
		return ""
	})
	check := func(wantNode string) string {
		t.Helper()
		sid, node, tok, err := f.createFrom(f.replicas[1], snap.SnapshotID)
		if err != nil {
			t.Fatal(err)
		}
		got, err := f.file(sid, tok, "/home/user/lane.txt", nil)
		lineOK(t, node == wantNode && err == nil && got == "from host A", "a create from the snapshot lands on %s (want %s) with its file: %q %v", node, wantNode, got, err)
		return sid
	}
	made := []string{check(hostA)}

	// A full: a filler takes all the memory A has left (its CPU is
	// shared, not admitted).
	a := f.hosts[hostA].h
	ctx := context.Background()
	info, err := a.Client.Info(ctx, connect.NewRequest(&sandboxdv1.InfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	free := info.Msg.GetCapacity().GetMemoryMib() - info.Msg.GetAllocated().GetMemoryMib()
	filler, err := a.Client.Create(ctx, connect.NewRequest(&sandboxdv1.CreateRequest{
		Template: "base", Team: "filler", Timeout: durationpb.New(10 * time.Minute), Resources: &sandboxdv1.Resources{MemoryMib: free},
	}))
	if err != nil {
		t.Fatalf("filler of %d MiB on A: %v", free, err)
	}
	made = append(made, check(hostB))
	if _, err := a.Client.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: filler.Msg.GetSandbox().GetId()})); err != nil {
		t.Fatal(err)
	}
	f.eventually(3*f.cfg.interval+5*time.Second, "B's inventory lists the pulled copy", func() string {
		inv := f.inventory(hostB)
		if inv == nil || !slices.ContainsFunc(inv.Spec.Snapshots, func(e v1beta1.SnapshotEntry) bool { return e.PulledFrom == hostA }) {
			return "not yet"
		}
		return ""
	})

	// A dead: B's copy is listed, and starts.
	l.killHost(hostA)
	f.eventually(f.cfg.window+3*f.cfg.interval, "A's sandboxes to leave the list", func() string {
		ids, err := f.e2bList(r)
		if err != nil {
			return err.Error()
		}
		if ids[id] {
			return "A's sandbox is still listed"
		}
		return ""
	})
	code, body = f.call(r, http.MethodGet, "/snapshots?name=lane", nil)
	lineOK(t, code == http.StatusOK && bytes.Contains(body, []byte(`/lane:default`)), "with A dead, the snapshot is listed (B's copy): %d %s", code, body)
	made = append(made, check(hostB))
	l.restartHost(t, hostA)
	f.eventually(f.cfg.window+3*f.cfg.interval, "A back in the fleet", func() string {
		if code, _ := f.call(r, http.MethodGet, "/sandboxes/"+id, nil); code != http.StatusOK {
			return fmt.Sprintf("A's sandbox: %d", code)
		}
		return ""
	})
	for _, sid := range append(made, id) {
		f.call(r, http.MethodDelete, "/sandboxes/"+sid, nil)
	}
	// The delete reaches every copy.
	code, body = f.call(r, http.MethodDelete, "/templates/"+url.PathEscape(snap.SnapshotID), nil)
	lineOK(t, code == http.StatusNoContent, "delete the snapshot: %d %s", code, body)
	code, body = f.call(r, http.MethodGet, "/snapshots?name=lane", nil)
	lineOK(t, code == http.StatusOK && string(bytes.TrimSpace(body)) == "[]", "after the delete, no host lists it: %s", body)
}
