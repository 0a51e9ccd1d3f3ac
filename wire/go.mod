module github.com/skiff-dev/skiff/wire

go 1.26.0
