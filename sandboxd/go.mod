module github.com/skiff-dev/skiff/sandboxd

go 1.26.0

require (
	github.com/skiff-dev/skiff/shared v0.0.0
	github.com/spf13/cobra v1.10.2
	k8s.io/utils v0.0.0-20261023123148-ca04ba58ecab
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
)

replace (
	github.com/skiff-dev/skiff/api => ../api
	github.com/skiff-dev/skiff/shared => ../shared
)
