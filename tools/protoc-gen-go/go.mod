// Pins bin/protoc-gen-go (make tools). One module per tool, outside go.work, so that no
// tool's dependencies move another's.
module github.com/skiff-dev/skiff/tools/protoc-gen-go

go 1.26.0

tool google.golang.org/protobuf/cmd/protoc-gen-go

require google.golang.org/protobuf v1.36.12 // indirect
