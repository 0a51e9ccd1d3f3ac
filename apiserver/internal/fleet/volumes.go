package fleet

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
	"github.com/skiff-dev/skiff/shared/idlebody"
	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// Volumes live in a host's volume store. A host's own store lists its
// volumes in its NodeInventory (spec.volumes), so a sandbox that mounts
// one is placed on that host; hosts that share a store (a filesystem each
// mounts: spec.sharedVolumeStore) all serve each of its volumes, and a
// sandbox that mounts one goes to any of them. A volume is found in the
// inventories first, then (a volume made a moment ago, not yet published;
// a shared store, which lists none) by asking the hosts.

// volumeRef is where a volume is served: the nodes, and the volume as one
// of them answered.
type volumeRef struct {
	vol   *sandboxdv1.Volume
	nodes []v1beta1.NodeInventory
}

// volumeSeen remembers on which node each volume (by team and name) was
// last found, so that a volume whose host has gone is told apart from one
// that does not exist.
type volumeSeen struct {
	mu    sync.Mutex
	nodes map[string]string // team/name → node
}

func (s *volumeSeen) note(team, name, node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodes == nil {
		s.nodes = map[string]string{}
	}
	s.nodes[team+"/"+name] = node
}

func (s *volumeSeen) node(team, name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodes[team+"/"+name]
}

// findVolume finds team's volume by ID, or by name when id is empty.
// usage asks the host to measure what the volume holds.
func (b *Backend) findVolume(ctx context.Context, team, id, name string, usage bool) (*volumeRef, error) {
	nodes, err := b.src.ListNodesShared(ctx)
	if err != nil {
		return nil, fmt.Errorf("find volume: list nodes: %w", err)
	}
	match := func(e v1beta1.VolumeEntry) bool {
		return e.Team == team && (id != "" && e.ID == id || id == "" && e.Name == name)
	}
	var listed, shared, rest []v1beta1.NodeInventory
	for _, n := range nodes {
		switch {
		case n.Spec.SharedVolumeStore != "":
			shared = append(shared, n)
		case slices.ContainsFunc(n.Spec.Volumes, match):
			listed = append(listed, n)
		default:
			rest = append(rest, n)
		}
	}
	// Each shared store is asked once, through any of its hosts.
	stores := map[string][]v1beta1.NodeInventory{}
	var order []string
	for _, n := range shared {
		if _, ok := stores[n.Spec.SharedVolumeStore]; !ok {
			order = append(order, n.Spec.SharedVolumeStore)
		}
		stores[n.Spec.SharedVolumeStore] = append(stores[n.Spec.SharedVolumeStore], n)
	}
	ask := func(group []v1beta1.NodeInventory) (*volumeRef, error) {
		var unreachable error
		for _, n := range group {
			resp, err := b.clients(n.Name, n.Spec.Endpoint).GetVolume(ctx, connect.NewRequest(&sandboxdv1.GetVolumeRequest{Team: team, VolumeId: id, Name: name, Usage: usage}))
			switch {
			case err == nil:
				v := resp.Msg.GetVolume()
				// The host that answered first: content and deletes go
				// to nodes[0].
				holders := []v1beta1.NodeInventory{n}
				if n.Spec.SharedVolumeStore != "" {
					for _, o := range stores[n.Spec.SharedVolumeStore] {
						if o.Name != n.Name {
							holders = append(holders, o)
						}
					}
				}
				b.seen.note(team, v.GetName(), n.Name)
				return &volumeRef{vol: v, nodes: holders}, nil
			case connect.CodeOf(err) == connect.CodeNotFound, connect.CodeOf(err) == connect.CodeUnimplemented:
				if n.Spec.SharedVolumeStore != "" {
					return nil, nil // one host of the store speaks for all
				}
			case isTransport(err):
				unreachable = &e2bapi.VolumeHostError{Volumes: []string{cmp.Or(name, id)}, Hosts: []string{n.Name}, Err: fmt.Errorf("%w: %w", e2bapi.ErrUnavailable, err)}
			default:
				return nil, classifyVolume("find", err)
			}
		}
		return nil, unreachable
	}
	if ref, err := ask(listed); ref != nil || err != nil {
		return ref, err
	}
	for _, st := range order {
		if ref, err := ask(stores[st]); ref != nil || err != nil {
			return ref, err
		}
	}
	// Not published yet: every other host, one after another.
	var errs []error
	for _, n := range rest {
		ref, err := ask([]v1beta1.NodeInventory{n})
		if ref != nil {
			return ref, nil
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if node := b.seen.node(team, name); id == "" && node != "" {
		return nil, &e2bapi.VolumeHostError{Volumes: []string{name}, Hosts: []string{node}, Err: fmt.Errorf("%w: it is not in the fleet now", e2bapi.ErrUnavailable)}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("volume not found on the hosts that answered: %w", errors.Join(errs...))
	}
	return nil, fmt.Errorf("volume %s: %w", cmp.Or(id, name), e2bapi.ErrNotFound)
}

// classifyVolume maps sandboxd's volume errors.
func classifyVolume(op string, err error) error {
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		return fmt.Errorf("%s volume: %w", op, e2bapi.ErrNotFound)
	case connect.CodeAlreadyExists:
		return fmt.Errorf("%s volume: %w", op, e2bapi.ErrVolumeExists)
	case connect.CodeFailedPrecondition:
		msg := err.Error()
		if ce := new(connect.Error); errors.As(err, &ce) {
			msg = ce.Message()
		}
		return fmt.Errorf("%s volume: %w", op, &e2bapi.ConflictError{Reason: "the volume is " + strings.TrimPrefix(msg, "volume in use: ")})
	case connect.CodeUnimplemented:
		return fmt.Errorf("%s volume: the host keeps no volumes: %w", op, e2bapi.ErrUnsupported)
	case connect.CodeInvalidArgument:
		return invalidFrom(err)
	case connect.CodeResourceExhausted:
		return fmt.Errorf("%s volume: %w: %w", op, e2bapi.ErrCapacity, err)
	}
	if isTransport(err) {
		return fmt.Errorf("%s volume: %w: %w", op, e2bapi.ErrUnavailable, err)
	}
	return fmt.Errorf("%s volume: %w", op, err)
}

func toVolume(v *sandboxdv1.Volume) *e2bapi.Volume {
	return &e2bapi.Volume{ID: v.GetId(), Name: v.GetName(), SizeBytes: v.GetSizeBytes(), UsedBytes: v.GetUsedBytes()}
}

// rendezvous orders nodes by how high each scores for key: every replica
// puts the same key on the same node, so two creates of one name race on
// one host, whose store refuses the second.
func rendezvous(nodes []v1beta1.NodeInventory, key string) []v1beta1.NodeInventory {
	score := func(n v1beta1.NodeInventory) string {
		h := sha256.Sum256([]byte(key + "\x00" + n.Name))
		return string(h[:])
	}
	out := slices.Clone(nodes)
	slices.SortFunc(out, func(a, b v1beta1.NodeInventory) int { return strings.Compare(score(b), score(a)) })
	return out
}

// CreateVolume makes team's volume on a shared store when the fleet has
// one, else on the host its name hashes to (rendezvous), or the next one
// that answers; hosts whose volume disk is under pressure come last.
func (b *Backend) CreateVolume(ctx context.Context, team, name string) (*e2bapi.Volume, error) {
	nodes, err := b.src.ListNodesShared(ctx)
	if err != nil {
		return nil, fmt.Errorf("create volume: list nodes: %w", err)
	}
	var shared []v1beta1.NodeInventory
	for _, n := range nodes {
		if n.Spec.SharedVolumeStore != "" {
			shared = append(shared, n)
		}
	}
	if len(shared) > 0 {
		nodes = shared
	} else {
		switch _, err := b.findVolume(ctx, team, "", name, false); {
		case err == nil:
			return nil, fmt.Errorf("create volume %q: %w", name, e2bapi.ErrVolumeExists)
		case !errors.Is(err, e2bapi.ErrNotFound):
			return nil, err
		}
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("create volume: no host: %w", e2bapi.ErrCapacity)
	}
	// A host whose volume store is below its disk reserve would refuse
	// (sandboxd --disk-reserve): it is asked only after every other one.
	// While its pressure changes, replicas whose inventories disagree may
	// order one name differently (docs/sandboxd.md says so).
	order := rendezvous(nodes, team+"/"+name)
	slices.SortStableFunc(order, func(x, y v1beta1.NodeInventory) int {
		return cmpBool(x.Spec.VolumeDiskPressure, y.Spec.VolumeDiskPressure)
	})
	var errs []error
	for _, n := range order {
		resp, err := b.clients(n.Name, n.Spec.Endpoint).CreateVolume(ctx, connect.NewRequest(&sandboxdv1.CreateVolumeRequest{Team: team, Name: name}))
		if err == nil {
			v := resp.Msg.GetVolume()
			b.seen.note(team, name, n.Name)
			b.log.InfoContext(ctx, "volume created", "team", team, "volume", v.GetId(), "name", name, "node", n.Name)
			return toVolume(v), nil
		}
		// Another host takes it when this one is down, keeps no volumes,
		// or its disk is nearly full (sandboxd --disk-reserve).
		if code := connect.CodeOf(err); !isTransport(err) && code != connect.CodeUnimplemented && code != connect.CodeResourceExhausted {
			return nil, classifyVolume("create", err)
		}
		errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
	}
	if slices.ContainsFunc(errs, func(err error) bool { return connect.CodeOf(err) == connect.CodeResourceExhausted }) {
		return nil, fmt.Errorf("create volume: no host has room: %w: %w", e2bapi.ErrCapacity, errors.Join(errs...))
	}
	return nil, fmt.Errorf("create volume: no host answered: %w: %w", e2bapi.ErrUnavailable, errors.Join(errs...))
}

// Volumes lists team's volumes: every host's own, and each shared store's
// once.
func (b *Backend) Volumes(ctx context.Context, team string) ([]e2bapi.Volume, error) {
	nodes, err := b.src.ListNodesShared(ctx)
	if err != nil {
		return nil, fmt.Errorf("list volumes: list nodes: %w", err)
	}
	seenStore := map[string]bool{}
	byID := map[string]e2bapi.Volume{}
	for _, n := range nodes {
		if st := n.Spec.SharedVolumeStore; st != "" {
			if seenStore[st] {
				continue
			}
		}
		resp, err := b.clients(n.Name, n.Spec.Endpoint).ListVolumes(ctx, connect.NewRequest(&sandboxdv1.ListVolumesRequest{Team: team}))
		if err != nil {
			if connect.CodeOf(err) == connect.CodeUnimplemented {
				continue
			}
			if isTransport(err) {
				b.hostUnreachable(ctx, n.Name, err)
				continue // as in List: a host that does not answer lists nothing
			}
			return nil, classifyVolume("list", err)
		}
		seenStore[n.Spec.SharedVolumeStore] = true
		for _, v := range resp.Msg.GetVolumes() {
			byID[v.GetId()] = *toVolume(v)
		}
	}
	out := make([]e2bapi.Volume, 0, len(byID))
	for _, v := range byID {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b e2bapi.Volume) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.ID, b.ID))
	})
	return out, nil
}

// Volume returns team's volume with what it holds.
func (b *Backend) Volume(ctx context.Context, team, id string) (*e2bapi.Volume, error) {
	ref, err := b.findVolume(ctx, team, id, "", true)
	if err != nil {
		return nil, err
	}
	return toVolume(ref.vol), nil
}

// DeleteVolume deletes team's volume on a host that serves it, telling it
// the fresh nodes: a sandbox of a gone node (a shared store) does not keep
// it.
func (b *Backend) DeleteVolume(ctx context.Context, team, id string) error {
	ref, err := b.findVolume(ctx, team, id, "", false)
	if err != nil {
		return err
	}
	nodes, err := b.src.ListNodesShared(ctx)
	if err != nil {
		return fmt.Errorf("delete volume: list nodes: %w", err)
	}
	live := make([]string, 0, len(nodes))
	for _, n := range nodes {
		live = append(live, n.Name)
	}
	n := ref.nodes[0]
	_, err = b.clients(n.Name, n.Spec.Endpoint).DeleteVolume(ctx, connect.NewRequest(&sandboxdv1.DeleteVolumeRequest{
		Team: team, VolumeId: id, LiveNodes: live, LiveNodesKnown: true,
	}))
	if err != nil {
		return classifyVolume("delete", err)
	}
	b.log.InfoContext(ctx, "volume deleted", "team", team, "volume", id, "node", n.Name)
	return nil
}

// ServeVolumeContent forwards a content request to a host that serves the
// volume (sandboxd's /skiff/v1/volumes/<id>/content/<kind>), streaming
// both ways.
func (b *Backend) ServeVolumeContent(w http.ResponseWriter, r *http.Request, team, id, kind string) {
	if b.tokens == nil {
		e2bapi.WriteContentError(w, http.StatusNotImplemented, "this apiserver holds no node tokens to reach the volume's host with")
		return
	}
	ref, err := b.findVolume(r.Context(), team, id, "", false)
	switch {
	case errors.Is(err, e2bapi.ErrNotFound):
		// Its token is good, so the volume was deleted since; the SDK
		// takes a 404 for a missing path (exists('/') would be false),
		// as sandboxd's own answer for it knows.
		e2bapi.WriteContentError(w, http.StatusGone, "the volume was deleted")
		return
	case errors.Is(err, e2bapi.ErrUnavailable):
		msg := "the volume's host is not answering; retry later"
		if vh := new(e2bapi.VolumeHostError); errors.As(err, &vh) {
			msg = vh.Message()
		}
		e2bapi.WriteContentError(w, http.StatusServiceUnavailable, msg)
		return
	case err != nil:
		b.log.ErrorContext(r.Context(), "find a volume for its content", "volume", id, "error", err)
		e2bapi.WriteContentError(w, http.StatusInternalServerError, "internal server error")
		return
	}
	n := ref.nodes[0]
	target := &url.URL{Scheme: "http", Host: n.Spec.Endpoint}
	// The server's whole-request read timeout is lifted for the body: an
	// upload takes as long as it takes while it moves.
	body := idlebody.Watch(w, r, b.bodyIdle)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path = volumeContentPrefix + id + "/content/" + kind
			pr.Out.URL.RawPath = ""
			pr.Out.Header.Set("Authorization", "Bearer "+b.tokens(n.Name))
			pr.Out.Header.Set(volumeTeamHeader, team)
			if body != nil && pr.Out.Body != nil {
				// The outgoing request's body only: the server's r.Body
				// keeps net/http's type, from which it decides whether
				// the connection may serve another request.
				pr.Out.Body = body.Wrap(pr.Out.Body)
			}
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			switch {
			case body.TimedOut():
				e2bapi.WriteContentError(w, http.StatusRequestTimeout, fmt.Sprintf("the request's body sent nothing for %s", b.bodyIdle))
			case body.Broken():
				// The client went away, or its body broke off: the
				// host is not at fault.
				e2bapi.WriteContentError(w, http.StatusBadRequest, "the request's body broke off")
			default:
				b.hostUnreachable(r.Context(), n.Name, err)
				e2bapi.WriteContentError(w, http.StatusServiceUnavailable, "the volume's host is not answering; retry later")
			}
		},
	}
	proxy.ServeHTTP(w, r)
}

// sandboxd's volume content routes (sandboxd/internal/service).
const (
	volumeContentPrefix = "/skiff/v1/volumes/"
	volumeTeamHeader    = "Skiff-Volume-Team"
)

// volumeNodes resolves p's volume mounts to the nodes that can mount them
// all: nil when p mounts none.
func (b *Backend) volumeNodes(ctx context.Context, team string, p e2bapi.CreateParams) (map[string]bool, error) {
	if len(p.VolumeMounts) == 0 {
		return nil, nil
	}
	var allowed map[string]bool
	var faults []string
	where := map[string]string{}
	for i, m := range p.VolumeMounts {
		ref, err := b.findVolume(ctx, team, "", m.Name, false)
		if errors.Is(err, e2bapi.ErrNotFound) {
			faults = append(faults, fmt.Sprintf("volume mount #%d: volume '%s' not found", i, m.Name))
			continue
		}
		if err != nil {
			return nil, err
		}
		these := map[string]bool{}
		for _, n := range ref.nodes {
			these[n.Name] = true
		}
		where[m.Name] = ref.nodes[0].Name
		if allowed == nil {
			allowed = these
			continue
		}
		for n := range allowed {
			if !these[n] {
				delete(allowed, n)
			}
		}
	}
	if len(faults) > 0 {
		return nil, e2bapi.MountsError(faults)
	}
	if len(allowed) == 0 {
		var parts []string
		for name, node := range where {
			parts = append(parts, fmt.Sprintf("%s on %s", name, node))
		}
		slices.Sort(parts)
		return nil, e2bapi.Invalid("volumeMounts", "the volumes live on different hosts (%s): a sandbox mounts volumes of one host", strings.Join(parts, ", "))
	}
	return allowed, nil
}

// cmpBool orders false before true.
func cmpBool(x, y bool) int {
	switch {
	case x == y:
		return 0
	case x:
		return 1
	}
	return -1
}
