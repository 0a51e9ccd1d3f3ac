module github.com/skiff-dev/skiff/hack/chartdocs

go 1.26.0

require go.yaml.in/yaml/v3 v3.0.4
