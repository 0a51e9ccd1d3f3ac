package service

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	"github.com/skiff-dev/skiff/sandboxd/internal/volume"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// Volumes (package volume): a team's files that outlive its sandboxes. A
// sandbox created with volume mounts holds a lease on each volume from its
// start to its end (across pauses, restarts of sandboxd and reboots), and
// its runtime mounts each read-write at its path; a volume is not deleted
// while a live sandbox holds it.

// VolumeContentPrefix is where this sandboxd serves e2b's volume content
// API (volume.ContentHandler), behind the node token:
// VolumeContentPrefix<id>/content/{dir,path,file}, with the volume's team
// in the VolumeTeamHeader.
const (
	VolumeContentPrefix = "/skiff/v1/volumes/"
	VolumeTeamHeader    = "Skiff-Volume-Team"
)

// errNoVolumes answers the volume calls of a sandboxd without a store.
var errNoVolumes = connect.NewError(connect.CodeUnimplemented, errors.New("this sandboxd keeps no volumes"))

func volumeError(err error) error {
	switch {
	case errors.Is(err, volume.ErrNotFound):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, volume.ErrExists):
		return connect.NewError(connect.CodeAlreadyExists, err)
	case errors.Is(err, volume.ErrInUse):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case errors.Is(err, volume.ErrInvalid):
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	return toConnect(err)
}

func toVolume(v *volume.Volume, used int64) *pb.Volume {
	return &pb.Volume{Id: v.ID, Team: v.Team, Name: v.Name, CreatedAt: timestamppb.New(v.CreatedAt), SizeBytes: v.SizeMiB << 20, UsedBytes: used}
}

// CreateVolume makes an empty volume of a team.
func (s *Service) CreateVolume(ctx context.Context, req *connect.Request[pb.CreateVolumeRequest]) (*connect.Response[pb.CreateVolumeResponse], error) {
	if s.volumes == nil {
		return nil, errNoVolumes
	}
	m := req.Msg
	var f fieldErrors
	if m.GetTeam() == "" {
		f.add("team", "required")
	}
	checkTeam(&f, m.GetTeam())
	if !volume.ValidName(m.GetName()) {
		f.add("name", "%q: letters, digits, '_' and '-', 1 to %d of them", truncate(m.GetName()), volume.MaxNameBytes)
	}
	if err := f.err(); err != nil {
		return nil, err
	}
	// A taken name is answered as such before a full disk: the apiserver
	// tries another host only for the latter.
	if _, err := s.volumes.Get(m.GetTeam(), "", m.GetName()); err == nil {
		return nil, volumeError(fmt.Errorf("%w: %s", volume.ErrExists, m.GetName()))
	}
	if err := s.checkDisk("create volume", s.volumes.Dir()); err != nil {
		return nil, toConnect(err)
	}
	v, err := s.volumes.Create(m.GetTeam(), m.GetName())
	if err != nil {
		return nil, volumeError(err)
	}
	s.hostChanged.notify()
	s.log.InfoContext(ctx, "volume created", "volume", v.ID, "name", v.Name, "team", v.Team, "size_mib", v.SizeMiB)
	return connect.NewResponse(&pb.CreateVolumeResponse{Volume: toVolume(v, -1)}), nil
}

// usageBudget bounds the walk that measures a directory volume's use.
const usageBudget = 2 * time.Second

// GetVolume returns a team's volume by ID or name, with what it uses.
func (s *Service) GetVolume(ctx context.Context, req *connect.Request[pb.GetVolumeRequest]) (*connect.Response[pb.GetVolumeResponse], error) {
	if s.volumes == nil {
		return nil, errNoVolumes
	}
	m := req.Msg
	v, err := s.volumes.Get(m.GetTeam(), m.GetVolumeId(), m.GetName())
	if err != nil {
		return nil, volumeError(err)
	}
	used := int64(-1)
	if req.Msg.GetUsage() {
		// A walk of a directory volume of millions of files, or on a
		// slow shared store, is cut short: its use is then unknown
		// (omitted), and the answer (a volume's connect) comes at once.
		uctx, cancel := context.WithTimeout(ctx, usageBudget)
		used = s.volumes.Used(uctx, v)
		cancel()
	}
	return connect.NewResponse(&pb.GetVolumeResponse{Volume: toVolume(v, used)}), nil
}

// ListVolumes lists a team's volumes.
func (s *Service) ListVolumes(_ context.Context, req *connect.Request[pb.ListVolumesRequest]) (*connect.Response[pb.ListVolumesResponse], error) {
	if s.volumes == nil {
		return nil, errNoVolumes
	}
	var f fieldErrors
	if req.Msg.GetTeam() == "" {
		f.add("team", "required")
	}
	checkTeam(&f, req.Msg.GetTeam())
	if err := f.err(); err != nil {
		return nil, err
	}
	vs, err := s.volumes.List(req.Msg.GetTeam())
	if err != nil {
		return nil, volumeError(err)
	}
	out := &pb.ListVolumesResponse{}
	for _, v := range vs {
		out.Volumes = append(out.Volumes, toVolume(v, -1))
	}
	return connect.NewResponse(out), nil
}

// DeleteVolume removes a volume no live sandbox mounts: a sandbox of this
// host while it has a record, one of another host (a shared store) while
// its node is among the caller's live nodes, or always when the caller
// does not know them.
func (s *Service) DeleteVolume(ctx context.Context, req *connect.Request[pb.DeleteVolumeRequest]) (*connect.Response[pb.DeleteVolumeResponse], error) {
	if s.volumes == nil {
		return nil, errNoVolumes
	}
	m := req.Msg
	live := func(l volume.Lease) bool {
		if l.Node == s.cfg.NodeName {
			_, err := s.reg.Get(l.Sandbox)
			return err == nil || s.holding.has(l.Sandbox)
		}
		return !m.GetLiveNodesKnown() || slices.Contains(m.GetLiveNodes(), l.Node)
	}
	if err := s.volumes.Delete(m.GetTeam(), m.GetVolumeId(), live); err != nil {
		return nil, volumeError(err)
	}
	s.hostChanged.notify()
	s.log.InfoContext(ctx, "volume deleted", "volume", m.GetVolumeId(), "team", m.GetTeam())
	return connect.NewResponse(&pb.DeleteVolumeResponse{}), nil
}

// serveVolumeContent serves VolumeContentPrefix (see there).
func (s *Service) serveVolumeContent(w http.ResponseWriter, r *http.Request) {
	id, kind := r.PathValue("id"), r.PathValue("kind")
	team := r.Header.Get(VolumeTeamHeader)
	if s.volumes == nil {
		volume.WriteContentError(w, http.StatusNotImplemented, "this sandboxd keeps no volumes")
		return
	}
	if kind != "dir" && kind != "path" && kind != "file" {
		volume.WriteContentError(w, http.StatusNotFound, "no such route: dir, path or file")
		return
	}
	v, err := s.volumes.Get(team, id, "")
	if err != nil {
		// The SDK takes any 404 for a missing path; the apiserver has
		// checked the volume's token, so this is a volume deleted since.
		volume.WriteContentError(w, http.StatusGone, "the volume was deleted")
		return
	}
	root, err := s.volumes.Root(v)
	if err != nil {
		s.log.ErrorContext(r.Context(), "open a volume for its content API", "volume", v.ID, "error", err)
		volume.WriteContentError(w, http.StatusInternalServerError, "the volume cannot be opened")
		return
	}
	volume.ContentHandler(w, r, root, kind)
}

// checkVolumeMounts checks a create's volume mounts as e2b does (each
// path absolute and clean, each used once), and refuses paths that would
// hide what a sandbox needs to run (envd among it, at sandboxrt.EnvdPath:
// a volume mounted over it or a folder above it would hide it).
func checkVolumeMounts(f *fieldErrors, mounts []*pb.VolumeMount) {
	seen := map[string]bool{}
	for i, m := range mounts {
		p := m.GetPath()
		var why string
		switch {
		case !volume.ValidName(m.GetName()):
			why = fmt.Sprintf("volume name %q is not a volume name", truncate(m.GetName()))
		case p == "":
			why = "path cannot be empty"
		case !filepath.IsAbs(p):
			why = "path must be absolute"
		case filepath.Clean(p) != p:
			why = "path must not contain any '.' or '..' components"
		case p == "/" || under(p, "/proc") || under(p, "/sys") || under(p, "/dev") || under(sandboxrt.EnvdPath, p):
			why = fmt.Sprintf("path %s would hide what the sandbox runs on", p)
		case seen[p]:
			why = fmt.Sprintf("path '%s' is already used", p)
		}
		seen[p] = true
		if why != "" {
			f.add("volume_mounts", "volume mount #%d: %s", i, why)
		}
	}
}

func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// resolveVolumeMounts finds team's volumes by the names of mounts.
func (s *Service) resolveVolumeMounts(team string, mounts []*pb.VolumeMount) ([]store.VolumeMount, error) {
	if len(mounts) == 0 {
		return nil, nil
	}
	if s.volumes == nil {
		return nil, errNoVolumes
	}
	var out []store.VolumeMount
	var missing []string
	for i, m := range mounts {
		v, err := s.volumes.Get(team, "", m.GetName())
		if errors.Is(err, volume.ErrNotFound) {
			missing = append(missing, fmt.Sprintf("volume mount #%d: volume '%s' not found", i, m.GetName()))
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, store.VolumeMount{ID: v.ID, Name: v.Name, Path: m.GetPath()})
	}
	if len(missing) > 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("volume_mounts: "+strings.Join(missing, "; ")))
	}
	return out, nil
}

// holdingSet is a set of sandbox IDs, safe for concurrent use.
type holdingSet struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (h *holdingSet) set(id string, on bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ids == nil {
		h.ids = map[string]bool{}
	}
	if on {
		h.ids[id] = true
	} else {
		delete(h.ids, id)
	}
}

func (h *holdingSet) has(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ids[id]
}

// holdVolumes takes sandbox id's leases on its volumes (of team) and
// returns their directories for the runtime, mounting image volumes that
// are not (after a reboot). A new sandbox (fresh) holds none on failure;
// a paused one booting or resuming keeps the leases its record holds,
// whatever happens here.
func (s *Service) holdVolumes(id, team string, mounts []store.VolumeMount, fresh bool) ([]sandboxrt.Volume, error) {
	// Before the first lease: a delete must see it live at once.
	s.holding.set(id, true)
	var out []sandboxrt.Volume
	for i, m := range mounts {
		src, err := s.volumeSource(id, team, m, fresh)
		if err != nil {
			if fresh {
				s.releaseVolumes(context.Background(), id, mounts[:i])
			}
			return nil, err
		}
		out = append(out, sandboxrt.Volume{Source: src, Path: m.Path})
	}
	return out, nil
}

// volumeSource takes sandbox id's lease on m's volume, of team, and
// returns its directory.
func (s *Service) volumeSource(id, team string, m store.VolumeMount, fresh bool) (string, error) {
	if s.volumes == nil {
		return "", errNoVolumes
	}
	v, err := s.volumes.Get(team, m.ID, "")
	if err != nil {
		return "", fmt.Errorf("volume %s: %w", m.Name, err)
	}
	if err := s.volumes.Hold(v, id); err != nil {
		return "", err
	}
	root, err := s.volumes.Root(v)
	if err != nil {
		if fresh {
			_ = s.volumes.Release(v.ID, id)
		}
		return "", err
	}
	return root, nil
}

// releaseVolumes gives up sandbox id's leases.
func (s *Service) releaseVolumes(ctx context.Context, id string, mounts []store.VolumeMount) {
	if s.volumes == nil {
		return
	}
	defer s.holding.set(id, false)
	for _, m := range mounts {
		if err := s.volumes.Release(m.ID, id); err != nil {
			s.log.ErrorContext(ctx, "release a sandbox's lease on a volume; the volume cannot be deleted until sandboxd's next start", "sandbox", id, "volume", m.ID, "error", err)
		}
	}
}

// reconcileLeases makes this host's leases match its records after a
// start: a lease of a sandbox that is gone goes, and a sandbox that mounts
// a volume holds its lease.
func (s *Service) reconcileLeases(ctx context.Context) {
	if s.volumes == nil {
		return
	}
	own, err := s.volumes.OwnLeases()
	if err != nil {
		s.log.ErrorContext(ctx, "read this host's volume leases", "error", err)
		return
	}
	for vol, sandboxes := range own {
		for _, sb := range sandboxes {
			if _, err := s.reg.Get(sb); err != nil {
				if err := s.volumes.Release(vol, sb); err != nil {
					s.log.ErrorContext(ctx, "release a gone sandbox's lease on a volume", "sandbox", sb, "volume", vol, "error", err)
				}
			}
		}
	}
	for _, rec := range s.reg.List() {
		for _, m := range rec.VolumeMounts {
			if slices.Contains(own[m.ID], rec.ID) {
				continue
			}
			if _, err := s.volumeSource(rec.ID, rec.Team, m, false); err != nil {
				s.log.ErrorContext(ctx, "hold the lease of a sandbox on its volume", "sandbox", rec.ID, "volume", m.ID, "error", err)
			}
		}
	}
}

func toVolumeMounts(ms []store.VolumeMount) []*pb.VolumeMount {
	var out []*pb.VolumeMount
	for _, m := range ms {
		out = append(out, &pb.VolumeMount{Name: m.Name, Path: m.Path, VolumeId: m.ID})
	}
	return out
}
