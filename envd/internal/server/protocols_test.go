package server_test

import (
	"context"
	"net"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/envd/internal/server"
	pb "github.com/skiff-dev/skiff/envd/proto/process"
	"github.com/skiff-dev/skiff/envd/proto/process/processconnect"
)

// Beyond the SDKs' Connect JSON over HTTP/1.1, envd serves the binary codec,
// gRPC-Web over HTTP/1.1, and gRPC over h2c, as envd's Serve sets it up.
func TestProtocols(t *testing.T) {
	srv := server.New(server.NewOptions())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	url := "http://" + ln.Addr().String()

	h1 := &http.Client{}
	h2c := &http.Client{Transport: &http.Transport{Protocols: func() *http.Protocols {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		return p
	}()}}
	for _, tc := range []struct {
		name   string
		client *http.Client
		opts   []connect.ClientOption
	}{
		{"connect+proto", h1, nil},
		{"connect+json", h1, []connect.ClientOption{connect.WithProtoJSON()}},
		{"grpc-web", h1, []connect.ClientOption{connect.WithGRPCWeb()}},
		{"grpc over h2c", h2c, []connect.ClientOption{connect.WithGRPC()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := processconnect.NewProcessClient(tc.client, url, tc.opts...)
			if _, err := c.List(t.Context(), connect.NewRequest(&pb.ListRequest{})); err != nil {
				t.Fatalf("List: %v", err)
			}
			stream, err := c.Start(t.Context(), connect.NewRequest(bash("echo proto")))
			if err != nil {
				t.Fatal(err)
			}
			defer stream.Close()
			r := collect(stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() })
			if r.err != nil || r.first != "start" || r.stdout != "proto\n" || r.end == nil {
				t.Fatalf("Start = %+v", r)
			}
		})
	}
}
