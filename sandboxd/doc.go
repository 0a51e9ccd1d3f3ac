// Package sandboxd is the root of the module of sandboxd, the daemon on every
// sandbox host that runs sandboxes, keeps them through its own crash, and
// relays their traffic. The daemon itself is being built (issue 4). The
// command (cmd/sandboxd, internal/cli) manages templates so far; the other
// pieces here: internal/store, its crash-safe record of every sandbox;
// internal/registry, the in-memory view over it (capacity reservations,
// atomic claims); internal/deadline, which fires at each sandbox's end time;
// internal/template, which unpacks OCI image archives into template root
// filesystems; internal/ipam, the sandboxes' address pool; and
// internal/relay, its traffic edge into sandbox ports.
package sandboxd
