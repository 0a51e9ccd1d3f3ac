// Package apiserver is the module of sandbox-apiserver: the e2b REST API
// the unmodified SDKs call, placement of sandboxes on the fleet, teams and
// API keys, and the single-host mode.
package apiserver
