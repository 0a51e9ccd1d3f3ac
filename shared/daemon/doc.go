// Package daemon is what Skiff's long-running binaries share between their
// flags and their work: reading a secret file, finding the cluster, the
// logger of --log-level and --log-format, the operations endpoints
// (/metrics, /healthz, /readyz, opt-in pprof) on --admin-listen, and
// serving a set of listeners until a signal, then draining them within
// --shutdown-timeout.
//
// Each binary's internal/cli is wiring over it: an Options struct with
// AddFlags, Complete and Validate, and a run function that builds the
// binary's parts and hands its servers to a Group.
package daemon
