package fleetsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"time"

	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/shared/publish"
)

// Config describes a fleet.
type Config struct {
	// Hosts is how many hosts, SandboxesPerHost how many sandboxes each
	// starts with.
	Hosts, SandboxesPerHost int
	// Teams own the sandboxes, in turn: every host has sandboxes of every
	// team when it has at least as many sandboxes as there are teams.
	Teams []string
	// Token is the node token every host accepts.
	Token string
	// Identity returns the control-plane identity of node (e.g. kubetest's
	// NodeUser). It is called once per host, in order, by New.
	Identity func(node string) (*rest.Config, error)
	// Publish is the hosts' publish cadence.
	Publish publish.Options
	// Writes, if set, counts every host's applies.
	Writes *Writes
	// Prefix names the nodes: Prefix + a three-digit index. Default "sim-".
	Prefix string
	// Subnet is the second octet of the hosts' loopback addresses,
	// 127.Subnet.y.z; 0 picks one from 100 to 199 at random, so that two
	// fleets on one machine rarely collide.
	Subnet int
	// Port is every host's sandboxd port; default 27777.
	Port int
	// Lifetime is how long the seeded sandboxes live from their start
	// (nothing ends them: their deadline is only published); default 24h.
	Lifetime time.Duration
	Log      *slog.Logger
}

// Fleet is N simulated hosts.
type Fleet struct {
	cfg   Config
	hosts []*Host
}

// New makes the hosts and seeds their sandboxes, started within the last
// hour. Nothing listens or publishes until Start.
func New(cfg Config) (*Fleet, error) {
	if cfg.Hosts <= 0 || cfg.Hosts > 254*256 {
		return nil, fmt.Errorf("fleet: %d hosts: want 1 to %d", cfg.Hosts, 254*256)
	}
	if len(cfg.Teams) == 0 {
		return nil, errors.New("fleet: no teams")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "sim-"
	}
	if cfg.Subnet == 0 {
		cfg.Subnet = 100 + rand.IntN(100)
	}
	if cfg.Port == 0 {
		cfg.Port = 27777
	}
	if cfg.Lifetime == 0 {
		cfg.Lifetime = 24 * time.Hour
	}
	f := &Fleet{cfg: cfg}
	now := time.Now()
	for i := range cfg.Hosts {
		name := fmt.Sprintf("%s%03d", cfg.Prefix, i)
		kube, err := cfg.Identity(name)
		if err != nil {
			return nil, fmt.Errorf("fleet: identity of %s: %w", name, err)
		}
		addr := net.JoinHostPort(fmt.Sprintf("127.%d.%d.%d", cfg.Subnet, i/254, i%254+1), strconv.Itoa(cfg.Port))
		h, err := NewHost(HostConfig{
			Sandboxd: SandboxdConfig{NodeName: name, Token: cfg.Token},
			Addr:     addr, Kube: kube, Publish: cfg.Publish, Writes: cfg.Writes, Log: cfg.Log,
		})
		if err != nil {
			return nil, err
		}
		for j := range cfg.SandboxesPerHost {
			started := now.Add(-time.Duration(rand.Int64N(int64(time.Hour))))
			if _, err := h.sd.Start(f.spec(name, cfg.Teams[(i+j)%len(cfg.Teams)], started)); err != nil {
				return nil, fmt.Errorf("fleet: seed %s: %w", name, err)
			}
		}
		f.hosts = append(f.hosts, h)
	}
	return f, nil
}

// spec is a sandbox as users make them: the base template, a user and
// the host in its metadata.
func (f *Fleet) spec(node, team string, started time.Time) Spec {
	return Spec{
		Team: team, StartedAt: started, EndAt: started.Add(f.cfg.Lifetime), AllowInternetAccess: true,
		Metadata: map[string]string{"user": fmt.Sprintf("u-%05d", rand.IntN(100000)), HostKey: node},
	}
}

// Hosts are the fleet's hosts, in order.
func (f *Fleet) Hosts() []*Host { return f.hosts }

// Sandboxes is how many sandboxes the fleet's hosts run, dead hosts'
// included.
func (f *Fleet) Sandboxes() int {
	n := 0
	for _, h := range f.hosts {
		n += h.sd.Len()
	}
	return n
}

// Start starts every host, their publishers spread evenly over spread
// (a publish interval, for a fleet in its steady state). On an error the
// hosts started are killed again.
func (f *Fleet) Start(ctx context.Context, spread time.Duration) error {
	for i, h := range f.hosts {
		if err := h.Start(ctx, spread*time.Duration(i)/time.Duration(len(f.hosts))); err != nil {
			f.Stop()
			return err
		}
	}
	return nil
}

// Stop kills every host that runs.
func (f *Fleet) Stop() {
	for _, h := range f.hosts {
		h.Kill()
	}
}
