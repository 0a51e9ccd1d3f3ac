package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/skiff-dev/skiff/sandboxd/internal/service"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// volumeContent calls sandboxd's volume content API (e2b's, which the
// apiserver forwards) on volume id of team-a.
func (h *host) volumeContent(t *testing.T, method, id, kind string, q url.Values, body string) (int, string) {
	t.Helper()
	u := "http://" + h.listen + service.VolumeContentPrefix + id + "/content/" + kind + "?" + q.Encode()
	req, err := http.NewRequestWithContext(context.Background(), method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+h.token)
	req.Header.Set(service.VolumeTeamHeader, "team-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestVolumes: e2b's volumes on both runtimes. A volume made empty, filled
// through the content API without a sandbox, mounted read-write by two
// sandboxes at once that see each other's writes with their owners (a
// file `user` writes is 1000's inside both and through the API), its size
// enforced (ENOSPC), refused deletion while mounted, kept with its files
// across kill -9 of sandboxd, deleted once its sandboxes are gone.
func TestVolumes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the base template")
	}
	for _, rt := range []string{"native", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			testVolumes(t, baseHost(t, rt, "--volume-size", "64"))
		})
	}
}

func testVolumes(t *testing.T, h *host) {
	ctx := context.Background()
	created, err := h.api.CreateVolume(ctx, connect.NewRequest(&sandboxdv1.CreateVolumeRequest{Team: "team-a", Name: "work"}))
	if err != nil {
		t.Fatal(err)
	}
	vol := created.Msg.GetVolume()
	if vol.GetSizeBytes() != 64<<20 {
		t.Errorf("size = %d, want 64 MiB", vol.GetSizeBytes())
	}
	if _, err := h.api.CreateVolume(ctx, connect.NewRequest(&sandboxdv1.CreateVolumeRequest{Team: "team-a", Name: "work"})); code(err) != connect.CodeAlreadyExists {
		t.Errorf("a second volume named work: %v", err)
	}
	info, err := h.api.Info(ctx, connect.NewRequest(&sandboxdv1.InfoRequest{}))
	if err != nil || len(info.Msg.GetVolumes()) != 1 || info.Msg.GetVolumes()[0].GetId() != vol.GetId() {
		t.Fatalf("Info lists %v, %v", info.Msg.GetVolumes(), err)
	}

	// Files put in without a sandbox.
	if st, b := h.volumeContent(t, "PUT", vol.GetId(), "file", url.Values{"path": {"/seed/hello.txt"}, "force": {"true"}}, "from the API\n"); st != http.StatusCreated {
		t.Fatalf("write through the content API: %d %s", st, b)
	}

	mount := func(r *sandboxdv1.CreateRequest) {
		r.VolumeMounts = []*sandboxdv1.VolumeMount{{Name: "work", Path: "/home/user/vol"}}
	}
	a := h.create(mount)
	aID, aTok := a.GetSandbox().GetId(), a.GetEnvdAccessToken()
	if ms := a.GetSandbox().GetVolumeMounts(); len(ms) != 1 || ms[0].GetVolumeId() != vol.GetId() || ms[0].GetPath() != "/home/user/vol" {
		t.Errorf("the sandbox's mounts: %v", ms)
	}
	if got := h.mustRun(aID, aTok, "user", "cat /home/user/vol/seed/hello.txt"); got.Stdout != "from the API\n" {
		t.Errorf("the API's file inside: %+v", got)
	}
	h.mustRun(aID, aTok, "user", "echo from-a > /home/user/vol/a.txt && mkdir /home/user/vol/dir")
	b := h.create(mount)
	bID, bTok := b.GetSandbox().GetId(), b.GetEnvdAccessToken()
	if got := h.mustRun(bID, bTok, "user", "cat /home/user/vol/a.txt && stat -c '%u %U' /home/user/vol/a.txt"); got.Stdout != "from-a\n1000 user\n" {
		t.Errorf("A's file in B: %+v", got)
	}
	h.mustRun(bID, bTok, "user", "echo from-b > /home/user/vol/dir/b.txt")
	if got := h.mustRun(aID, aTok, "user", "cat /home/user/vol/dir/b.txt"); got.Stdout != "from-b\n" {
		t.Errorf("B's file in A: %+v", got)
	}
	st, body := h.volumeContent(t, "GET", vol.GetId(), "path", url.Values{"path": {"/dir/b.txt"}}, "")
	var e struct{ UID, GID uint32 }
	if st != http.StatusOK || json.Unmarshal([]byte(body), &e) != nil || e.UID != 1000 || e.GID != 1000 {
		t.Errorf("B's file through the API: %d %s, want uid and gid 1000", st, body)
	}
	// Its size holds inside.
	if got, _ := h.run(aID, aTok, "user", "dd if=/dev/zero of=/home/user/vol/big bs=1M count=100 2>&1; rm -f /home/user/vol/big"); !strings.Contains(got.Stdout, "No space left") {
		t.Errorf("100 MiB into a 64 MiB volume: %+v", got)
	}
	got, err := h.api.GetVolume(ctx, connect.NewRequest(&sandboxdv1.GetVolumeRequest{Team: "team-a", Name: "work", Usage: true}))
	if err != nil || got.Msg.GetVolume().GetUsedBytes() <= 0 || got.Msg.GetVolume().GetUsedBytes() > 64<<20 {
		t.Errorf("GetVolume: %v, %v", got, err)
	}

	// Mounted: not deleted.
	del := func() error {
		_, err := h.api.DeleteVolume(ctx, connect.NewRequest(&sandboxdv1.DeleteVolumeRequest{Team: "team-a", VolumeId: vol.GetId()}))
		return err
	}
	if err := del(); code(err) != connect.CodeFailedPrecondition {
		t.Errorf("delete of a mounted volume: %v", err)
	}
	// kill -9 of sandboxd: the volume, its files and its mounts stay.
	h.kill9()
	h.start()
	if got := h.mustRun(aID, aTok, "user", "cat /home/user/vol/a.txt /home/user/vol/dir/b.txt"); got.Stdout != "from-a\nfrom-b\n" {
		t.Errorf("after kill -9: %+v", got)
	}
	if err := del(); code(err) != connect.CodeFailedPrecondition {
		t.Errorf("after kill -9, delete of a mounted volume: %v", err)
	}
	// A paused sandbox still mounts it; a resumed one sees it.
	if _, err := h.api.Pause(ctx, connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: bID})); err != nil {
		t.Fatal(err)
	}
	if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: aID})); err != nil {
		t.Fatal(err)
	}
	if err := del(); code(err) != connect.CodeFailedPrecondition {
		t.Errorf("delete of a volume a paused sandbox mounts: %v", err)
	}
	if _, err := h.api.Resume(ctx, connect.NewRequest(&sandboxdv1.ResumeRequest{SandboxId: bID})); err != nil {
		t.Fatal(err)
	}
	if got := h.mustRun(bID, bTok, "user", "cat /home/user/vol/a.txt"); got.Stdout != "from-a\n" {
		t.Errorf("after resume: %+v", got)
	}
	if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: bID})); err != nil {
		t.Fatal(err)
	}
	// A volume nobody mounts: its files are still there for the next one,
	// and then it goes.
	c := h.create(mount)
	if got := h.mustRun(c.GetSandbox().GetId(), c.GetEnvdAccessToken(), "user", "cat /home/user/vol/dir/b.txt"); got.Stdout != "from-b\n" {
		t.Errorf("a new sandbox on the volume: %+v", got)
	}
	if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: c.GetSandbox().GetId()})); err != nil {
		t.Fatal(err)
	}
	if err := del(); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := h.api.GetVolume(ctx, connect.NewRequest(&sandboxdv1.GetVolumeRequest{Team: "team-a", VolumeId: vol.GetId()})); code(err) != connect.CodeNotFound {
		t.Errorf("after delete: %v", err)
	}
	// Mounts of what the team lacks, and bad paths, are refused.
	for _, m := range []*sandboxdv1.VolumeMount{{Name: "work", Path: "/home/user/vol"}, {Name: "x", Path: "relative"}, {Name: "x", Path: "/proc/x"}, {Name: "x", Path: "/usr/bin"}} {
		_, err := h.api.Create(ctx, connect.NewRequest(&sandboxdv1.CreateRequest{Template: h.template, Team: "team-a", Timeout: durationpbMinute(), VolumeMounts: []*sandboxdv1.VolumeMount{m}}))
		if code(err) != connect.CodeInvalidArgument {
			t.Errorf("mount %v: %v", m, err)
		}
	}
}

func durationpbMinute() *durationpb.Duration { return durationpb.New(time.Minute) }

// TestVolumeAcrossHostReboot: a volume's image is mounted again after a
// reboot of the host; its files are there through the content API and in
// a new sandbox, and in the paused sandbox that mounted it once resumed.
// The lease of a sandbox the reboot ended goes; the paused one's holds
// until it is killed.
func TestVolumeAcrossHostReboot(t *testing.T) {
	ctx := context.Background()
	h := newHost(t, "--volume-size", "64")
	created, err := h.api.CreateVolume(ctx, connect.NewRequest(&sandboxdv1.CreateVolumeRequest{Team: "team-a", Name: "keep"}))
	if err != nil {
		t.Fatal(err)
	}
	vol := created.Msg.GetVolume()
	mount := func(r *sandboxdv1.CreateRequest) {
		r.VolumeMounts = []*sandboxdv1.VolumeMount{{Name: "keep", Path: "/vol"}}
	}
	paused, running := h.create(mount), h.create(mount)
	pID, pTok := paused.GetSandbox().GetId(), paused.GetEnvdAccessToken()
	h.mustRun(pID, pTok, "root", "echo kept > /vol/f && mkdir /vol/d && sync")
	if _, err := h.api.Pause(ctx, connect.NewRequest(&sandboxdv1.PauseRequest{SandboxId: pID})); err != nil {
		t.Fatal(err)
	}

	h.simulateReboot(t)

	if _, err := h.api.Get(ctx, connect.NewRequest(&sandboxdv1.GetRequest{SandboxId: running.GetSandbox().GetId()})); code(err) != connect.CodeNotFound {
		t.Errorf("the running sandbox after the reboot: %v", err)
	}
	if st, body := h.volumeContent(t, "GET", vol.GetId(), "file", url.Values{"path": {"/f"}}, ""); st != http.StatusOK || body != "kept\n" {
		t.Errorf("its file through the content API after the reboot: %d %q", st, body)
	}
	c := h.create(mount)
	cID := c.GetSandbox().GetId()
	if got := h.mustRun(cID, c.GetEnvdAccessToken(), "root", "cat /vol/f && ls /vol"); got.Stdout != "kept\nd\nf\n" {
		t.Errorf("a new sandbox after the reboot: %+v", got)
	}
	if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: cID})); err != nil {
		t.Fatal(err)
	}
	del := func() error {
		_, err := h.api.DeleteVolume(ctx, connect.NewRequest(&sandboxdv1.DeleteVolumeRequest{Team: "team-a", VolumeId: vol.GetId()}))
		return err
	}
	if err := del(); code(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), pID) || strings.Contains(err.Error(), running.GetSandbox().GetId()) {
		t.Errorf("delete with only the paused sandbox holding it: %v", err)
	}
	if _, err := h.api.Resume(ctx, connect.NewRequest(&sandboxdv1.ResumeRequest{SandboxId: pID})); err != nil {
		t.Fatalf("resume after the reboot: %v\n%s", err, h.logTail())
	}
	if got := h.mustRun(pID, pTok, "root", "cat /vol/f"); got.Stdout != "kept\n" {
		t.Errorf("the resumed sandbox's volume: %+v", got)
	}
	if _, err := h.api.Kill(ctx, connect.NewRequest(&sandboxdv1.KillRequest{SandboxId: pID})); err != nil {
		t.Fatal(err)
	}
	if err := del(); err != nil {
		t.Errorf("delete once no sandbox holds it: %v", err)
	}
}
