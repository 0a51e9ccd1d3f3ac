package relay

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkRelay compares a request through the relay with the same request
// straight to the sandbox's port, on loopback: a 1 KB response, and a 100 MB
// download.
func BenchmarkRelay(b *testing.B) {
	small := bytes.Repeat([]byte("x"), 1<<10)
	big := bytes.Repeat([]byte("0123456789abcdef"), (100<<20)/16)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			_, _ = w.Write(big)
			return
		}
		_, _ = w.Write(small)
	}))
	defer upstream.Close()
	relay := httptest.NewServer(New(newResolver()))
	defer relay.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	port := portOf(b, upstream.URL)

	for _, tc := range []struct {
		name, path string
		size       int
	}{{"1KB", "/small", len(small)}, {"100MB", "/big", len(big)}} {
		for _, via := range []struct{ name, url string }{{"direct", upstream.URL}, {"relay", relay.URL}} {
			b.Run(tc.name+"/"+via.name, func(b *testing.B) {
				b.SetBytes(int64(tc.size))
				b.ReportAllocs()
				for b.Loop() {
					resp, err := client.Do(request(b, http.MethodGet, via.url, tc.path, port, nil))
					if err != nil {
						b.Fatal(err)
					}
					n, err := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err != nil || n != int64(tc.size) {
						b.Fatalf("read %d bytes, %v; want %d", n, err, tc.size)
					}
				}
			})
		}
	}
}
