// An empty google.golang.org/genproto, which go.work puts in place of the
// pre-split one that only the workspace's module graph reaches: see there.
module google.golang.org/genproto

go 1.21
