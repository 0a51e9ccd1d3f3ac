package service

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/skiff-dev/skiff/sandboxd/internal/layer"
	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/snapshot"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	"github.com/skiff-dev/skiff/sandboxd/internal/template"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// MaxForks is the most sandboxes one Fork starts, as in e2b.
const MaxForks = 100

// snapshotter is the runtime's sandboxrt.Snapshotter and the store, or
// the error that says why this host takes no snapshots.
func (s *Service) snapshotter() (sandboxrt.Snapshotter, error) {
	if s.snapshots == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this sandboxd keeps no snapshots (no snapshot store)"))
	}
	sn, ok := s.rt.(sandboxrt.Snapshotter)
	if !ok {
		return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("the %s runtime cannot copy a sandbox's files", s.rt.Name()))
	}
	return sn, nil
}

// Snapshot captures a running sandbox's files as a snapshot of its team.
func (s *Service) Snapshot(ctx context.Context, req *connect.Request[pb.SnapshotRequest]) (*connect.Response[pb.SnapshotResponse], error) {
	m := req.Msg
	var f fieldErrors
	checkID(&f, m.GetSandboxId())
	checkTeam(&f, m.GetTeam())
	if m.GetTeam() == "" {
		f.add("team", "required")
	}
	if m.GetName() != "" {
		if err := snapshot.CheckName(m.GetName()); err != nil {
			f.add("name", "%v", err)
		}
	}
	if err := f.err(); err != nil {
		return nil, err
	}
	sn, err := s.snapshotter()
	if err != nil {
		return nil, err
	}
	if err := s.checkDisk("snapshot", s.stateDir); err != nil {
		return nil, toConnect(err)
	}
	began := time.Now()
	unlock := s.locks.lock(m.GetSandboxId())
	c, err := s.captureLocked(ctx, sn, m.GetSandboxId(), m.GetTeam(), "snapshotted")
	unlock()
	if err != nil {
		return nil, toConnect(err)
	}
	// What it captured is held from sweeps until the record names it; a
	// failure lets go of it first, for the sweep that removes it.
	defer c.release()
	id, err := sandboxid.New(s.tag)
	if err != nil {
		c.discard()
		return nil, err
	}
	rec := s.snapshotRecord(id, c.src, c.layer)
	for _, path := range s.layerPaths(rec.Layers) {
		if n, err := layer.Size(path); err == nil {
			rec.SizeBytes += n
		}
	}
	if c.imageTmp != "" {
		n, err := s.snapshots.CommitImage(c.imageID, c.imageTmp)
		if err != nil {
			c.discard()
			c.release()
			s.gcLayers(ctx)
			return nil, toConnect(fmt.Errorf("keep the state of sandbox %s: %w", c.src.ID, err))
		}
		rec.Image, rec.ImageFormat, rec.ImageBytes, rec.ImageEnvdToken = c.imageID, c.format, n, c.src.EnvdAccessToken
		rec.SizeBytes += n
	}
	if m.GetName() != "" {
		rec.Name, rec.Tag = snapshot.SplitName(m.GetName())
	}
	replaced, err := s.putNamed(rec)
	if err != nil {
		c.release()
		s.gcLayers(ctx)
		return nil, toConnect(err)
	}
	s.digestInBackground(rec)
	defer s.hostChanged.notify()
	if replaced != nil {
		s.gcLayers(ctx)
	}
	s.log.InfoContext(ctx, "snapshot taken", "snapshot", rec.ID, "sandbox", c.src.ID, "team", rec.Team, "name", rec.Name,
		"layers", len(rec.Layers), "memory", rec.Image != "", "bytes", rec.SizeBytes, "duration", time.Since(began))
	return connect.NewResponse(&pb.SnapshotResponse{Snapshot: toSnapshot(rec)}), nil
}

// putNamed writes the snapshot record rec and, when it has a name, moves
// the name to it, as a new build of an e2b template takes its tag: the
// snapshot that held it is deleted (its layers go at the caller's sweep)
// and returned.
func (s *Service) putNamed(rec *snapshot.Record) (replaced *snapshot.Record, err error) {
	if rec.Name == "" {
		return nil, s.snapshots.Put(rec)
	}
	s.naming.Lock()
	defer s.naming.Unlock()
	if old, err := s.snapshots.Find(rec.Team, rec.Name+":"+rec.Tag); err == nil {
		replaced = old
	}
	if err := s.snapshots.Put(rec); err != nil {
		return nil, err
	}
	if replaced != nil {
		if err := s.snapshots.Delete(replaced.ID); err != nil {
			s.log.Error("delete the snapshot a new one took the name of", "snapshot", replaced.ID, "error", err)
		}
	}
	return replaced, nil
}

// captured is what captureLocked copied of a sandbox.
type captured struct {
	src *store.Record
	// layer is the ID of the layer of its files, in place.
	layer string
	// imageID and imageTmp are its state image, when the runtime keeps
	// one, still in its temporary directory; format is the image's.
	imageID, imageTmp, format string
	// release ends the hold on the layer and image and on the source's
	// layers (see hold): once a record names them, or before the sweep
	// that is to remove them.
	release func()
}

// discard removes the captured image (its layer goes by GC).
func (c *captured) discard() {
	if c.imageTmp != "" {
		_ = snapshot.RemoveImage(c.imageTmp)
	}
}

// captureLocked copies the files of sandbox id, which team must own and
// which must run, into a new layer in place, and with them its memory and
// processes into a state image when the host keeps them.
//
// verb ("snapshotted", "forked") words its refusals as e2b's API does: a
// paused sandbox is not found for a snapshot (e2b's store of live
// sandboxes has none) and a conflict for a fork (e2b's looks it up among
// the paused).
func (s *Service) captureLocked(ctx context.Context, sn sandboxrt.Snapshotter, id, team, verb string) (*captured, error) {
	src, err := s.reg.Get(id)
	if err != nil {
		return nil, err
	}
	if src.Team != team {
		return nil, fmt.Errorf("%w: %s", registry.ErrNotFound, id)
	}
	switch {
	case src.State == registry.StatePaused && verb == "forked":
		return nil, stateError(fmt.Sprintf("Sandbox '%s' is paused and cannot be forked; resume it first", id))
	case src.State == registry.StatePaused:
		return nil, fmt.Errorf("%w: %s is paused", registry.ErrNotFound, id)
	case src.State != registry.StateRunning:
		return nil, stateError(fmt.Sprintf("Sandbox '%s' cannot be %s while in '%s' state", id, verb, src.State))
	}
	if err := checkDepth(src); err != nil {
		return nil, fmt.Errorf("Sandbox '%s' cannot be %s: %w", id, verb, err) //nolint:staticcheck // e2b's capitalised message
	}
	// The source's own layers go under the new one; once the caller lets
	// go of the sandbox's lock, the source may end (a kill, its deadline)
	// and its sweep would remove those no snapshot names (a deleted
	// snapshot's, a pause to files'), before the new record names them.
	srcHold := s.hold(src.Layers...)
	c := &captured{src: src}
	var release func()
	if sc := s.stateCapturer(); sc != nil {
		c.layer, c.imageID, c.imageTmp, c.format, release, err = s.captureState(ctx, sc, id)
	} else {
		c.layer, release, err = s.captureLayer(ctx, sn, id)
	}
	if err != nil {
		srcHold()
		if errors.Is(err, sandboxrt.ErrCaptureTooLarge) {
			return nil, fmt.Errorf("Sandbox '%s' cannot be snapshotted: %w", id, err) //nolint:staticcheck // e2b's capitalised message
		}
		return nil, fmt.Errorf("copy the files of sandbox %s: %w", id, err)
	}
	c.release = func() { release(); srcHold() }
	return c, nil
}

// stateCapturer is the runtime's sandboxrt.StateCapturer when this host
// keeps memory and processes in snapshots (--snapshot-memory), else nil.
func (s *Service) stateCapturer() sandboxrt.StateCapturer {
	if !s.cfg.SnapshotMemory || s.snapshots == nil {
		return nil
	}
	sc, _ := s.rt.(sandboxrt.StateCapturer)
	return sc
}

// captureLayer copies the writable layer of sandbox id into a new layer of
// the store, in place and durable, and returns its ID; on failure nothing
// of it is left. The layer is held from sweeps (hold) until the caller
// calls release: no record names it yet.
func (s *Service) captureLayer(ctx context.Context, sn sandboxrt.Snapshotter, id string) (_ string, release func(), err error) {
	layerID, tmp, err := s.snapshots.NewLayer()
	if err != nil {
		return "", nil, err
	}
	release = s.hold(layerID)
	if err := sn.CaptureLayer(ctx, id, tmp); err != nil {
		_ = layer.Remove(tmp)
		release()
		return "", nil, err
	}
	if err := s.snapshots.CommitLayer(layerID, tmp); err != nil {
		_ = layer.Remove(tmp)
		release()
		return "", nil, err
	}
	return layerID, release, nil
}

// captureState is captureLayer with the sandbox's state image beside the
// layer, of the same instant; the image is left in its temporary
// directory (imageTmp), for the caller to commit or remove. The layer and
// the image are held from sweeps until the caller calls release.
func (s *Service) captureState(ctx context.Context, sc sandboxrt.StateCapturer, id string) (layerID, imageID, imageTmp, format string, release func(), err error) {
	format, err = sc.ImageFormat()
	if err != nil {
		return "", "", "", "", nil, err
	}
	layerID, tmp, err := s.snapshots.NewLayer()
	if err != nil {
		return "", "", "", "", nil, err
	}
	imageID, imageTmp, err = s.snapshots.NewImage()
	if err != nil {
		return "", "", "", "", nil, err
	}
	release = s.hold(layerID, imageID)
	if err := sc.CaptureState(ctx, id, tmp, imageTmp); err != nil {
		_ = layer.Remove(tmp)
		_ = snapshot.RemoveImage(imageTmp)
		release()
		return "", "", "", "", nil, err
	}
	if err := s.snapshots.CommitLayer(layerID, tmp); err != nil {
		_ = layer.Remove(tmp)
		_ = snapshot.RemoveImage(imageTmp)
		release()
		return "", "", "", "", nil, err
	}
	return layerID, imageID, imageTmp, format, release, nil
}

// layerPaths are the host directories of the store's layers ids.
func (s *Service) layerPaths(ids []string) []string {
	paths := make([]string, len(ids))
	for i, id := range ids {
		paths[i] = s.snapshots.LayerPath(id)
	}
	return paths
}

// snapshotRecord is the record of snapshot id of sandbox src, whose files
// are in layer top above src's own layers.
func (s *Service) snapshotRecord(id string, src *store.Record, top string) *snapshot.Record {
	rec := &snapshot.Record{
		ID: id, Team: src.Team, SourceSandbox: src.ID,
		Template: src.Template, TemplateVersion: src.TemplateVersion,
		Layers:    append([]string{top}, src.Layers...),
		CreatedAt: s.clock.Now().UTC(),
		CPUMilli:  src.CPUMilli, MemoryMiB: src.MemoryMiB, DiskMiB: src.DiskMiB,
	}
	rec.Rootfs = s.rootfsOf(src)
	return rec
}

// rootfsOf is the root filesystem sandbox rec was started from, or for a
// record from before sandboxd kept it, the template's current version.
func (s *Service) rootfsOf(rec *store.Record) string {
	if rec.RootfsPath != "" {
		return rec.RootfsPath
	}
	if t, err := s.templates.Get(rec.Template); err == nil {
		return t.Rootfs
	}
	return ""
}

// ListSnapshots lists a team's snapshots on this host.
func (s *Service) ListSnapshots(_ context.Context, req *connect.Request[pb.ListSnapshotsRequest]) (*connect.Response[pb.ListSnapshotsResponse], error) {
	m := req.Msg
	if m.GetTeam() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("team: required"))
	}
	out := []*pb.Snapshot{}
	if s.snapshots != nil {
		for _, r := range s.snapshots.List(snapshot.Filter{Team: m.GetTeam(), SourceSandbox: m.GetSandboxId(), Name: m.GetName()}) {
			out = append(out, toSnapshot(r))
		}
	}
	return connect.NewResponse(&pb.ListSnapshotsResponse{Snapshots: out}), nil
}

// DeleteSnapshot removes a team's snapshot; its layers go when nothing
// uses them.
func (s *Service) DeleteSnapshot(ctx context.Context, req *connect.Request[pb.DeleteSnapshotRequest]) (*connect.Response[pb.DeleteSnapshotResponse], error) {
	m := req.Msg
	if m.GetTeam() == "" || m.GetSnapshot() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("snapshot and team: required"))
	}
	rec, err := s.findSnapshot(m.GetTeam(), m.GetSnapshot())
	if err != nil {
		return nil, err
	}
	if err := s.snapshots.Delete(rec.ID); err != nil {
		return nil, toConnect(err)
	}
	s.hostChanged.notify()
	s.gcLayers(ctx)
	s.log.InfoContext(ctx, "snapshot deleted", "snapshot", rec.ID, "team", rec.Team, "name", rec.Name)
	return connect.NewResponse(&pb.DeleteSnapshotResponse{}), nil
}

// findSnapshot returns the team's snapshot that ref names, or not_found.
func (s *Service) findSnapshot(team, ref string) (*snapshot.Record, error) {
	if s.snapshots == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("snapshot %q not found: this sandboxd keeps no snapshots", ref))
	}
	rec, err := s.snapshots.Find(team, ref)
	if err != nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("snapshot %q not found", ref))
	}
	if err := checkRootfs(rec.Rootfs); err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("snapshot %s: %w", rec.ID, err))
	}
	return rec, nil
}

// Fork copies a running sandbox's files once and starts count sandboxes
// of its team from them, each with the source's settings.
func (s *Service) Fork(ctx context.Context, req *connect.Request[pb.ForkRequest]) (*connect.Response[pb.ForkResponse], error) {
	m := req.Msg
	var f fieldErrors
	checkID(&f, m.GetSandboxId())
	if m.GetTeam() == "" {
		f.add("team", "required")
	}
	if m.GetCount() < 1 || m.GetCount() > MaxForks {
		f.add("count", "must be between 1 and %d, got %d", MaxForks, m.GetCount())
	}
	timeout := s.checkTimeout(&f, "timeout", m.GetTimeout(), true)
	if err := f.err(); err != nil {
		return nil, err
	}
	sn, err := s.snapshotter()
	if err != nil {
		return nil, err
	}
	if err := s.checkDisk("fork", s.stateDir); err != nil {
		return nil, toConnect(err)
	}
	unlock := s.locks.lock(m.GetSandboxId())
	c, err := s.captureLocked(ctx, sn, m.GetSandboxId(), m.GetTeam(), "forked")
	unlock()
	if err != nil {
		return nil, toConnect(err)
	}
	src := c.src
	// The forks' layers are the source's under the new one; no record
	// names them, so they go with the last fork. The image, when there
	// is one, is read whole by each restore and removed after the last.
	// The new layer is held from sweeps until every fork has started (no
	// record names it before the first fork's, and none at all when the
	// forks fail).
	snap := s.snapshotRecord("", src, c.layer)
	defer s.gcLayers(context.WithoutCancel(ctx))
	defer c.discard()
	defer c.release()
	results := make([]*pb.ForkResult, m.GetCount())
	for i := range results {
		l := &launch{kind: kindCreate, tmpl: snapshotTemplate(snap), timeout: timeout, cpu: src.CPUMilli, mem: src.MemoryMiB, disk: src.DiskMiB,
			envVars: src.EnvVars}
		l.rec = store.Record{
			State:               registry.StateRunning,
			Team:                src.Team,
			Metadata:            maps.Clone(src.Metadata),
			EnvVars:             maps.Clone(src.EnvVars),
			AutoPause:           src.AutoPause,
			AutoPauseFilesOnly:  src.AutoPauseFilesOnly,
			AllowInternetAccess: src.AllowInternetAccess,
			AutoResume:          src.AutoResume,
			MaskRequestHost:     src.MaskRequestHost,
			VolumeMounts:        slices.Clone(src.VolumeMounts),
		}
		if src.Egress != nil {
			l.rec.Egress = &store.Egress{AllowOut: slices.Clone(src.Egress.AllowOut), DenyOut: slices.Clone(src.Egress.DenyOut)}
		}
		if src.TrafficAccessToken != "" {
			l.rec.TrafficAccessToken = newToken()
		}
		s.fromSnapshot(l, snap)
		if c.imageTmp != "" {
			s.restoreFrom(l, snap, c.imageTmp, src.EnvdAccessToken)
		}
		l.rec.Snapshot = "" // a fork names its source, not a snapshot
		rec, token, err := s.launch(ctx, l)
		if err != nil {
			ce := toConnect(err).(*connect.Error) //nolint:errorlint // toConnect returns one
			results[i] = &pb.ForkResult{ErrorCode: ce.Code().String(), ErrorMessage: ce.Message()}
			_ = s.countCreate(kindCreate, ce)
			continue
		}
		_ = s.countCreate(kindCreate, nil)
		results[i] = &pb.ForkResult{Created: &pb.CreateResponse{Sandbox: s.toSandbox(rec), EnvdAccessToken: token, TrafficAccessToken: rec.TrafficAccessToken}}
	}
	return connect.NewResponse(&pb.ForkResponse{Forks: results}), nil
}

// fromSnapshot makes l start from snap: restored from its state image
// when it has one this host's runtime restores, else booted on its files.
func (s *Service) fromSnapshot(l *launch, snap *snapshot.Record) {
	l.rec.Snapshot, l.rec.Layers, l.rec.RootfsPath = snap.ID, slices.Clone(snap.Layers), snap.Rootfs
	l.layers = s.layerPaths(snap.Layers)
	if snap.Image == "" {
		return
	}
	sc, ok := s.rt.(sandboxrt.StateCapturer)
	if !ok {
		return
	}
	if format, err := sc.ImageFormat(); err != nil || format != snap.ImageFormat {
		s.log.Warn("a snapshot's state image is of another runtime build; the sandbox boots on its files",
			"snapshot", snap.ID, "image_format", snap.ImageFormat, "runtime_format", format)
		return
	}
	s.restoreFrom(l, snap, s.snapshots.ImagePath(snap.Image), snap.ImageEnvdToken)
}

// restoreFrom makes l restore the state image at dir, taken of a sandbox
// with snap's stack but its top layer (the image holds that one as the
// sandbox held it) and whose envd held envdToken.
func (s *Service) restoreFrom(l *launch, snap *snapshot.Record, dir, envdToken string) {
	l.image, l.imageToken = dir, envdToken
	l.rec.Layers = slices.Clone(snap.Layers[1:])
	l.layers = s.layerPaths(l.rec.Layers)
}

// snapshotTemplate is the template a sandbox from snap starts on: the
// version the snapshot was taken on, which the library keeps.
func snapshotTemplate(snap *snapshot.Record) *template.Template {
	return &template.Template{Name: snap.Template, Version: snap.TemplateVersion, Rootfs: snap.Rootfs}
}

// snapshotResources fills what r leaves at zero with the snapshot's own.
func snapshotResources(snap *snapshot.Record, r *pb.Resources) *pb.Resources {
	out := &pb.Resources{CpuMilli: snap.CPUMilli, MemoryMib: snap.MemoryMiB, DiskMib: snap.DiskMiB}
	if r.GetCpuMilli() != 0 {
		out.CpuMilli = r.GetCpuMilli()
	}
	if r.GetMemoryMib() != 0 {
		out.MemoryMib = r.GetMemoryMib()
	}
	if r.GetDiskMib() != 0 {
		out.DiskMib = r.GetDiskMib()
	}
	return out
}

// gcLayers removes the layers (and images) no snapshot and no sandbox on
// the host uses and nothing holds (hold). The holds stay locked for the
// whole sweep: a capture names its layer in a record and then releases
// it, so a release in the middle of a sweep (after it read the records,
// before it read the holds) would leave the layer in neither; and a hold
// taken meanwhile would be for a layer the sweep may already have listed.
func (s *Service) gcLayers(ctx context.Context) {
	if s.snapshots == nil {
		return
	}
	s.holds.mu.Lock()
	defer s.holds.mu.Unlock()
	inUse := map[string]bool{}
	for id := range s.holds.held {
		inUse[id] = true
	}
	for _, rec := range s.reg.List() {
		for _, l := range rec.Layers {
			inUse[l] = true
		}
	}
	if n, err := s.snapshots.GC(inUse); err != nil {
		s.log.ErrorContext(ctx, "remove unused snapshot layers", "error", err)
	} else if n > 0 {
		s.log.InfoContext(ctx, "removed unused snapshot layers", "layers", n)
	}
}

// holds counts, per layer or image ID, the pulls and captures that hold it.
type holds struct {
	mu   sync.Mutex
	held map[string]int
}

// hold marks layers and images in use until release is called (once more
// is nothing): a pull's or a capture's, which are in place before any
// record names them. Any kill of a sandbox with layers sweeps, so without
// the hold a sweep in between would remove a snapshot's layer during the
// sync of its image, a fork's while the first fork starts, or the layer of
// a pause with the files only before its record names it.
func (s *Service) hold(ids ...string) (release func()) {
	s.holds.mu.Lock()
	defer s.holds.mu.Unlock()
	if s.holds.held == nil {
		s.holds.held = map[string]int{}
	}
	for _, id := range ids {
		s.holds.held[id]++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			s.holds.mu.Lock()
			defer s.holds.mu.Unlock()
			for _, id := range ids {
				if s.holds.held[id]--; s.holds.held[id] <= 0 {
					delete(s.holds.held, id)
				}
			}
		})
	}
}

func toSnapshot(r *snapshot.Record) *pb.Snapshot {
	return &pb.Snapshot{
		Id: r.ID, Team: r.Team, Name: r.Name, Tag: r.Tag,
		SourceSandboxId: r.SourceSandbox, Template: r.Template, TemplateVersion: r.TemplateVersion,
		CreatedAt: timestamppb.New(r.CreatedAt), SizeBytes: r.SizeBytes,
		Resources: &pb.Resources{CpuMilli: r.CPUMilli, MemoryMib: r.MemoryMiB, DiskMib: r.DiskMiB},
		Memory:    r.Image != "", ImageFormat: r.ImageFormat, PulledFrom: r.PulledFrom,
	}
}

// checkRootfs reports a snapshot whose template version is gone from the
// host.
func checkRootfs(path string) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("the template version the snapshot was taken on: %w", err)
	}
	return nil
}
