module github.com/skiff-dev/skiff/sandboxd

go 1.26.0

require (
	github.com/skiff-dev/skiff/shared v0.0.0
	k8s.io/utils v0.0.0-20261023123148-ca04ba58ecab
)

replace (
	github.com/skiff-dev/skiff/api => ../api
	github.com/skiff-dev/skiff/shared => ../shared
)
