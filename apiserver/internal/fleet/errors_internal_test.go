package fleet

import (
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/apiserver/internal/e2bapi"
)

// A host that refuses a snapshot or a volume for its disk (sandboxd
// --disk-reserve: resource_exhausted) is a host without capacity (503),
// not a failure of the server (500).
func TestErrorsOfAFullHost(t *testing.T) {
	full := connect.NewError(connect.CodeResourceExhausted, errors.New("host is full: snapshot: this host's disk is nearly full"))
	if err := snapshotError("snapshot", "sb1", full); !errors.Is(err, e2bapi.ErrCapacity) || !strings.Contains(err.Error(), "disk is nearly full") {
		t.Errorf("snapshotError = %v, want ErrCapacity with the host's words", err)
	}
	if err := classifyVolume("create", full); !errors.Is(err, e2bapi.ErrCapacity) {
		t.Errorf("classifyVolume = %v, want ErrCapacity", err)
	}
}
