module github.com/skiff-dev/skiff/e2e

go 1.26.0
