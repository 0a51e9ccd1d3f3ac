package sandboxdapi

import (
	"net/http"
	"strings"

	sandboxdv1 "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
	"github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1/sandboxdv1connect"
	"github.com/skiff-dev/skiff/shared/tracing"
)

// procedures are the SandboxdService's RPCs, by URL path.
var procedures = func() map[string]string {
	m := make(map[string]string)
	methods := sandboxdv1.File_skiff_sandboxd_v1_sandboxd_proto.Services().ByName("SandboxdService").Methods()
	for i := range methods.Len() {
		name := sandboxdv1connect.SandboxdServiceName + "/" + string(methods.Get(i).Name())
		m["/"+name] = name
	}
	return m
}()

// SpanName names the span of a call of the SandboxdService by its RPC
// ("skiff.sandboxd.v1.SandboxdService/Create", OpenTelemetry's RPC span
// name), client and server alike; any other request by its method only,
// so that the names stay few.
func SpanName(r *http.Request) string {
	if name, ok := procedures[r.URL.Path]; ok {
		return name
	}
	return "HTTP " + r.Method
}

// Traced reports whether a call is traced: all but Watch, a stream that
// lasts as long as its follower (hours), whose span would only say that.
func Traced(r *http.Request) bool {
	return !strings.HasSuffix(r.URL.Path, "/"+sandboxdv1connect.SandboxdServiceName+"/Watch")
}

// traced is httpClient (nil: http.DefaultClient) with its transport under
// client spans (tracing.Transport), or httpClient itself with tracing off.
func traced(httpClient *http.Client) *http.Client {
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	if !tracing.Enabled() {
		return httpClient
	}
	c := *httpClient
	c.Transport = tracing.Transport(c.Transport, SpanName, Traced)
	return &c
}
