// Command skiff-up runs the whole Skiff system on this machine — sandboxd
// with the base template, sandbox-apiserver in single-host mode and
// sandbox-envd-proxy — prints the E2B_* lines that point an unmodified e2b
// SDK at it, and on Ctrl-C kills its sandboxes and stops it all. A server
// that dies meanwhile is restarted (sandboxd re-adopts its sandboxes), with
// a line on stderr that says so. `make up` builds the binaries and runs it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/skiff-dev/skiff/e2e/internal/system"
)

func main() { os.Exit(run()) }

func run() int {
	o := newOptions()
	fs := pflag.NewFlagSet("skiff-up", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "skiff-up:", err)
		return 2
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "skiff-up:", err)
		return 2
	}
	cfg := o.cfg
	cfg.Progress = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	sys, err := system.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "skiff-up:", err)
		return 1
	}
	if sys.E2BDomain != "" {
		fmt.Printf(`
Skiff is up: sandboxd, sandbox-apiserver and sandbox-envd-proxy on this machine (logs in %s),
served as https://api.%s and https://*.%s with a certificate of a local CA.
Point an unmodified e2b SDK at it (NODE_EXTRA_CA_CERTS for JS, SSL_CERT_FILE for Python):

unset E2B_API_URL E2B_SANDBOX_URL E2B_VOLUME_API_URL
export E2B_DOMAIN=%s
export E2B_API_KEY=%s
export NODE_EXTRA_CA_CERTS=%s
export SSL_CERT_FILE=%s

Ctrl-C kills the sandboxes and stops it all; a server that dies before is restarted.
`, sys.LogDir(), sys.E2BDomain, sys.E2BDomain, sys.E2BDomain, sys.Keys["default"], sys.DomainFiles.CA, sys.DomainFiles.Bundle)
	} else {
		fmt.Printf(`
Skiff is up: sandboxd, sandbox-apiserver and sandbox-envd-proxy on this machine (logs in %s).
Point an unmodified e2b SDK at it:

export E2B_API_URL=%s
export E2B_SANDBOX_URL=%s
export E2B_VOLUME_API_URL=%s
export E2B_API_KEY=%s

Ctrl-C kills the sandboxes and stops it all; a server that dies before is restarted.
(Presigned file URLs and getHost need names: make up UP_FLAGS=--domain=skiff.localhost.)
`, sys.LogDir(), sys.APIURL, sys.SandboxURL, sys.APIURL, sys.Keys["default"])
	}

	code := 0
	<-ctx.Done()
	stop()
	fmt.Fprintln(os.Stderr, "stopping: killing the sandboxes, then the servers...")
	stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := sys.Stop(stopCtx); err != nil {
		fmt.Fprintln(os.Stderr, "skiff-up: stop:", err)
		code = 1
	}
	return code
}
