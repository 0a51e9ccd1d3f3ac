module github.com/skiff-dev/skiff/e2e

go 1.26.0

replace github.com/skiff-dev/skiff/shared => ../shared

require (
	github.com/skiff-dev/skiff/shared v0.0.0
	github.com/spf13/pflag v1.1.0
)
