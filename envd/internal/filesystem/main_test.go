package filesystem

import (
	"testing"

	"github.com/skiff-dev/skiff/envd/internal/hosttest"
)

// TestMain runs the tests where root's and the users' homes are empty
// tmpfs mounts (hosttest): they run envd's file operations as root, and a
// path that resolves to a home must not reach the host's.
func TestMain(m *testing.M) { hosttest.Main(m) }

func TestHomesAreHidden(t *testing.T) { hosttest.AssertHidden(t) }
