module github.com/skiff-dev/skiff/envd

go 1.26.0

require (
	connectrpc.com/connect v1.21.1
	github.com/creack/pty v1.1.24
	github.com/fsnotify/fsnotify v1.10.1
	github.com/skiff-dev/skiff/wire v0.0.0
	github.com/spf13/pflag v1.1.0
	golang.org/x/sys v0.50.0
	google.golang.org/protobuf v1.36.12
)

replace github.com/skiff-dev/skiff/wire => ../wire
