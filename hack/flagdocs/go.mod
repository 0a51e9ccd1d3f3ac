module github.com/skiff-dev/skiff/hack/flagdocs

go 1.26.0
