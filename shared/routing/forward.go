package routing

import "net/http/httputil"

// PassOn makes the request a Rewrite forwards what the client sent where
// Go's ReverseProxy changed it before Rewrite: the query as it came
// (ReverseProxy drops pairs with ';' or a bad escape), and the values of
// the named X-Forwarded-* headers the request carried (ReverseProxy takes
// them out), put back over those of this hop that pr.SetXForwarded set; a
// header the request came without keeps this hop's. Call it after
// SetXForwarded. The envd proxy passes on those of a trusted proxy, and
// sandboxd's relay those of the envd proxy.
func PassOn(pr *httputil.ProxyRequest, forwarded ...string) {
	pr.Out.URL.RawQuery = pr.In.URL.RawQuery
	for _, name := range forwarded {
		if v := pr.In.Header.Values(name); len(v) > 0 {
			pr.Out.Header[name] = append([]string(nil), v...)
		}
	}
}
