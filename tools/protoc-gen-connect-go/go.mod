// Pins bin/protoc-gen-connect-go (make tools). One module per tool, outside go.work, so that no
// tool's dependencies move another's.
module github.com/skiff-dev/skiff/tools/protoc-gen-connect-go

go 1.26.0

tool connectrpc.com/connect/cmd/protoc-gen-connect-go

require (
	connectrpc.com/connect v1.21.1 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)
