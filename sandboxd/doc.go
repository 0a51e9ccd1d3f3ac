// Package sandboxd is the root of the module of sandboxd, the daemon on every
// sandbox host that runs sandboxes, keeps them through its own crash, and
// relays their traffic. The command is cmd/sandboxd; internal/cli holds its
// flags (one Options with AddFlags, Complete and Validate) and wires the
// rest: internal/server serves the API and the admin endpoints (over
// shared/daemon); internal/service is the API itself, its handlers and the
// sandboxes' lifecycle; internal/relay is the traffic edge into sandbox
// ports; internal/sandboxrt is the seam to the runtimes (native, gvisor);
// internal/network, internal/ipam and internal/hostlimits set up the host;
// internal/registry and internal/store are the sandboxes in memory and on
// disk; internal/prepared, internal/stats, internal/envdclient,
// internal/envdlog and internal/deadline serve the service; and
// internal/template builds template root filesystems. docs/development.md
// has the map of the whole tree.
package sandboxd
