package service

// Snapshots move between hosts sandboxd to sandboxd. The control plane asks
// the host that should start a sandbox from a snapshot it lacks to pull it
// (PullSnapshot), naming a host that holds it and giving a ticket that
// host accepts for that snapshot only (nodetoken.PullTicket). The puller
// fetches the holder's manifest, then every layer it lacks and the state
// image when its runtime restores it, each as a tar in layer.WriteTar's
// form whose SHA-256 must be the digest the holder keeps for it: layers
// are content addressed, so a layer two snapshots share moves once, and a
// byte changed on the way, or on the holder's disk since it was digested,
// is refused. Everything is written under temporary names and put in place
// verified and synced; the record comes last, so a pull cut at any point
// leaves no snapshot, and what it fetched goes at the next sweep.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/sandboxd/internal/layer"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
	"github.com/skiff-dev/skiff/sandboxd/internal/snapshot"
	"github.com/skiff-dev/skiff/shared/nodetoken"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// ExportPrefix is where a host serves its snapshots to other hosts:
//
//	GET <prefix><snapshot>/manifest        the record, its layers' and image's digests
//	GET <prefix><snapshot>/layers/<layer>  one of its layers, as a tar
//	GET <prefix><snapshot>/image           its state image, as a tar
//
// each with "Authorization: Skiff-Pull <ticket>" for that snapshot.
const ExportPrefix = "/skiff/v1/snapshots/"

// manifest is what a holder tells a puller of one snapshot.
type manifest struct {
	// Snapshot is the record, without its host paths.
	Snapshot *snapshot.Record `json:"snapshot"`
	Layers   []digested       `json:"layers"`
	// Image is its state image, when it has one.
	Image *digested `json:"image,omitempty"`
}

type digested struct {
	ID     string `json:"id"`
	Digest string `json:"digest"`
}

// CheckTicket checks a pull ticket for a snapshot; the server gives it
// with the host's token. nil, or an error for every ticket, when the host
// has no token to check tickets with.
type CheckTicket func(snapshot, ticket string) error

// ExportHandler serves ExportPrefix to other hosts, each request opened by
// a pull ticket that check accepts.
func (s *Service) ExportHandler(check CheckTicket) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		rest := strings.TrimPrefix(r.URL.Path, ExportPrefix)
		id, what, _ := strings.Cut(rest, "/")
		ticket, ok := strings.CutPrefix(r.Header.Get("Authorization"), nodetoken.PullTicketScheme+" ")
		if !ok || check == nil || check(id, strings.TrimSpace(ticket)) != nil {
			w.Header().Set("WWW-Authenticate", nodetoken.PullTicketScheme)
			http.Error(w, "a pull ticket for this snapshot is needed", http.StatusUnauthorized)
			return
		}
		if s.snapshots == nil {
			http.Error(w, "this sandboxd keeps no snapshots", http.StatusNotFound)
			return
		}
		rec, err := s.snapshots.Get(id)
		if err != nil {
			http.Error(w, "no such snapshot", http.StatusNotFound)
			return
		}
		switch {
		case what == "manifest":
			m, err := s.manifestOf(rec)
			if err != nil {
				s.log.ErrorContext(r.Context(), "snapshot manifest", "snapshot", id, "error", err)
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(m)
		case strings.HasPrefix(what, "layers/"):
			l := strings.TrimPrefix(what, "layers/")
			if !slices.Contains(rec.Layers, l) {
				http.Error(w, "no such layer in this snapshot", http.StatusNotFound)
				return
			}
			s.sendTree(w, r, s.snapshots.LayerPath(l))
		case what == "image" && rec.Image != "":
			s.sendTree(w, r, s.snapshots.ImagePath(rec.Image))
		default:
			http.NotFound(w, r)
		}
	})
}

// manifestOf is rec's manifest, its digests computed now if they were not
// yet.
func (s *Service) manifestOf(rec *snapshot.Record) (*manifest, error) {
	m := &manifest{Snapshot: rec}
	rec.Rootfs = ""
	for _, l := range rec.Layers {
		d, err := s.snapshots.LayerDigest(l)
		if err != nil {
			return nil, err
		}
		m.Layers = append(m.Layers, digested{ID: l, Digest: d})
	}
	if rec.Image != "" {
		d, err := s.snapshots.ImageDigest(rec.Image)
		if err != nil {
			return nil, err
		}
		m.Image = &digested{ID: rec.Image, Digest: d}
	}
	return m, nil
}

// sendTree writes the tar of a layer or image directory.
func (s *Service) sendTree(w http.ResponseWriter, r *http.Request, dir string) {
	w.Header().Set("Content-Type", "application/x-tar")
	if r.Method == http.MethodHead {
		return
	}
	if err := layer.WriteTar(dir, w); err != nil {
		// The status is sent: the puller's digest check fails instead.
		s.log.WarnContext(r.Context(), "send a snapshot tree to another host", "dir", dir, "error", err)
	}
}

// digestInBackground computes the digests of a new snapshot's layers and
// image soon after it is taken, so that a later pull finds them ready and
// they are of the bytes as taken.
func (s *Service) digestInBackground(rec *snapshot.Record) {
	go func() {
		for _, l := range rec.Layers {
			if _, err := s.snapshots.LayerDigest(l); err != nil {
				s.log.Warn("digest of a snapshot layer", "snapshot", rec.ID, "layer", l, "error", err)
			}
		}
		if rec.Image != "" {
			if _, err := s.snapshots.ImageDigest(rec.Image); err != nil {
				s.log.Warn("digest of a snapshot image", "snapshot", rec.ID, "error", err)
			}
		}
	}()
}

// pullTimeout bounds one pull: a layer of gigabytes on a slow link.
const pullTimeout = 30 * time.Minute

// PullSnapshot fetches a snapshot from another host (see the top of this
// file) and keeps it here.
func (s *Service) PullSnapshot(ctx context.Context, req *connect.Request[pb.PullSnapshotRequest]) (*connect.Response[pb.PullSnapshotResponse], error) {
	m := req.Msg
	var f fieldErrors
	if !sandboxid.Valid(m.GetSnapshotId()) {
		f.add("snapshot_id", "%q is not a snapshot ID", truncate(m.GetSnapshotId()))
	}
	if m.GetTeam() == "" {
		f.add("team", "required")
	}
	src, err := url.Parse(m.GetSourceUrl())
	if err != nil || (src.Scheme != "http" && src.Scheme != "https") || src.Host == "" || src.Path != "" && src.Path != "/" {
		f.add("source_url", "want http(s)://host:port, got %q", truncate(m.GetSourceUrl()))
	}
	if m.GetTicket() == "" {
		f.add("ticket", "required")
	}
	if err := f.err(); err != nil {
		return nil, err
	}
	if s.snapshots == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this sandboxd keeps no snapshots (no snapshot store)"))
	}
	if rec, err := s.snapshots.Get(m.GetSnapshotId()); err == nil {
		if rec.Team != m.GetTeam() {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("snapshot %q not found", m.GetSnapshotId()))
		}
		return connect.NewResponse(&pb.PullSnapshotResponse{Snapshot: toSnapshot(rec)}), nil
	}
	if err := s.checkDisk("pull snapshot", s.stateDir); err != nil {
		return nil, toConnect(err)
	}
	// One pull of a snapshot at a time; the others wait for it and then
	// find it here.
	unlock := s.locks.lock("pull/" + m.GetSnapshotId())
	defer unlock()
	if rec, err := s.snapshots.Get(m.GetSnapshotId()); err == nil && rec.Team == m.GetTeam() {
		return connect.NewResponse(&pb.PullSnapshotResponse{Snapshot: toSnapshot(rec)}), nil
	}
	ctx, cancel := context.WithTimeout(ctx, pullTimeout)
	defer cancel()
	began := time.Now()
	p := &puller{s: s, base: strings.TrimSuffix(src.String(), "/") + ExportPrefix + m.GetSnapshotId(), ticket: m.GetTicket()}
	rec, fetched, err := p.pull(ctx, m.GetTeam(), m.GetSourceNode())
	if err != nil {
		s.gcLayers(context.WithoutCancel(ctx))
		return nil, toConnect(err)
	}
	s.hostChanged.notify()
	s.log.InfoContext(ctx, "snapshot pulled", "snapshot", rec.ID, "team", rec.Team, "from", m.GetSourceNode(),
		"layers", len(rec.Layers), "memory", rec.Image != "", "fetched_bytes", fetched, "duration", time.Since(began))
	return connect.NewResponse(&pb.PullSnapshotResponse{Snapshot: toSnapshot(rec), FetchedBytes: fetched}), nil
}

// puller is one pull.
type puller struct {
	s      *Service
	base   string // the holder's ExportPrefix + snapshot ID
	ticket string
}

// errPull is a pull the holder or the transfer made fail: unavailable, so
// the control plane tries another holder.
var errPull = errors.New("pull snapshot")

func (p *puller) get(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path, http.NoBody)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", nodetoken.PullTicketScheme+" "+p.ticket)
	resp, err := p.s.peers.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: GET %s: %w", errPull, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		_ = resp.Body.Close()
		err := fmt.Errorf("%w: GET %s: %s: %s", errPull, path, resp.Status, strings.TrimSpace(string(body)))
		if resp.StatusCode == http.StatusNotFound && path == "/manifest" {
			return nil, connect.NewError(connect.CodeNotFound, err)
		}
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return resp, nil
}

func (p *puller) pull(ctx context.Context, team, from string) (*snapshot.Record, int64, error) {
	s := p.s
	resp, err := p.get(ctx, "/manifest")
	if err != nil {
		return nil, 0, err
	}
	var m manifest
	err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&m)
	_ = resp.Body.Close()
	if err != nil {
		return nil, 0, connect.NewError(connect.CodeUnavailable, fmt.Errorf("%w: manifest: %w", errPull, err))
	}
	rec := m.Snapshot
	if rec == nil || !strings.HasSuffix(p.base, "/"+rec.ID) || len(m.Layers) != len(rec.Layers) {
		return nil, 0, connect.NewError(connect.CodeUnavailable, fmt.Errorf("%w: the holder's manifest is not of this snapshot", errPull))
	}
	if rec.Team != team {
		return nil, 0, connect.NewError(connect.CodeNotFound, fmt.Errorf("snapshot %q not found", rec.ID))
	}
	tmpl, err := s.templates.Get(rec.Template)
	if err != nil || tmpl.Version != rec.TemplateVersion {
		have := "none"
		if err == nil {
			have = "version " + tmpl.Version
		}
		return nil, 0, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"snapshot %s stands on template %s version %s, and this host has %s", rec.ID, rec.Template, rec.TemplateVersion, have))
	}
	// What this pull puts in place is in use until its record is.
	held := make([]string, 0, len(m.Layers)+1)
	for _, l := range m.Layers {
		held = append(held, l.ID)
	}
	if m.Image != nil {
		held = append(held, m.Image.ID)
	}
	defer s.hold(held...)()

	var fetched int64
	for i, l := range m.Layers {
		if l.ID != rec.Layers[i] {
			return nil, 0, connect.NewError(connect.CodeUnavailable, fmt.Errorf("%w: the manifest's layers are not the record's", errPull))
		}
		if s.snapshots.HasLayer(l.ID) {
			continue
		}
		n, err := p.fetch(ctx, "/layers/"+l.ID, func(r io.Reader) error { return s.snapshots.ImportLayer(l.ID, l.Digest, r) })
		fetched += n
		if err != nil {
			return nil, fetched, err
		}
	}
	if rec.Image != "" && m.Image != nil && m.Image.ID == rec.Image && p.restores(rec.ImageFormat) {
		if !s.snapshots.HasImage(rec.Image) {
			n, err := p.fetch(ctx, "/image", func(r io.Reader) error { return s.snapshots.ImportImage(rec.Image, m.Image.Digest, r) })
			fetched += n
			if err != nil {
				return nil, fetched, err
			}
		}
	} else {
		// This host's runtime cannot restore it: the files alone.
		rec.Image, rec.ImageFormat, rec.ImageBytes, rec.ImageEnvdToken = "", "", 0, ""
	}
	rec.Rootfs, rec.PulledFrom = tmpl.Rootfs, from
	if err := s.snapshots.Put(rec); err != nil {
		return nil, fetched, err
	}
	return rec, fetched, nil
}

// restores reports whether this host's runtime restores images of format.
func (p *puller) restores(format string) bool {
	sc, ok := p.s.rt.(sandboxrt.StateCapturer)
	if !ok {
		return false
	}
	f, err := sc.ImageFormat()
	return err == nil && f == format
}

// fetch GETs path and gives its body to put, counting the bytes.
func (p *puller) fetch(ctx context.Context, path string, put func(io.Reader) error) (int64, error) {
	resp, err := p.get(ctx, path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	cr := &countingReader{r: resp.Body}
	if err := put(cr); err != nil {
		code := connect.CodeUnavailable
		if ctx.Err() == nil && !isTransfer(err) {
			code = connect.CodeInternal
		}
		return cr.n, connect.NewError(code, fmt.Errorf("%w: %s: %w", errPull, path, err))
	}
	return cr.n, nil
}

// isTransfer tells an error of the transfer or of its content (a digest
// mismatch, a cut stream, a bad tar), which another holder may not have,
// from one of this host's own disk.
func isTransfer(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) || strings.Contains(err.Error(), "digest mismatch") ||
		strings.Contains(err.Error(), "read layer tar")
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}
