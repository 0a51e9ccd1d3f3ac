package service

import (
	"errors"
	"net/http"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/sandboxd/internal/relay"
	"github.com/skiff-dev/skiff/shared/routing"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
)

// compressMinBytes is the smallest Connect message sent gzipped.
const compressMinBytes = 64 << 10

// Handler is the API's handler: requests that name a sandbox
// (E2b-Sandbox-Id / E2b-Sandbox-Port, or a `<port>-<id>.` host; Relayed)
// go to the relay, everything else to the Connect service. It checks no
// caller: the server puts it behind the node token.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(sandboxdv1connect.NewSandboxdServiceHandler(s,
		connect.WithInterceptors(rpcCounter{s.metrics}),
		// Connect gzips every message a client accepts gzip for (its
		// default threshold is 0 bytes): resetting the compressor cost
		// more than the rest of a Get or a Claim together. Only messages
		// big enough to gain from it (a long List) are compressed.
		connect.WithCompressMinBytes(compressMinBytes)))
	mux.HandleFunc(VolumeContentPrefix+"{id}/content/{kind}", s.serveVolumeContent)
	rel := relay.New(s)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if Relayed(r) {
			rel.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// Relayed reports whether a request names a sandbox (well or badly: the
// relay answers a bad target itself), and so goes to the relay, whose
// Authorization header is the sandbox's.
func Relayed(r *http.Request) bool {
	_, err := routing.Parse(r)
	return !errors.Is(err, routing.ErrNoTarget)
}
