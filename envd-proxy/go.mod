module github.com/skiff-dev/skiff/envd-proxy

go 1.26.0

replace (
	github.com/skiff-dev/skiff/api => ../api
	github.com/skiff-dev/skiff/shared => ../shared
)
