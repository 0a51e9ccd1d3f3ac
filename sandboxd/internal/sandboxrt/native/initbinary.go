package native

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/exeseal"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/native/nsinit"
)

// InitBinaryName is the file name of the binary each sandbox's init runs
// (cmd/sandboxd-init), installed beside sandboxd.
const InitBinaryName = "sandboxd-init"

// initBinary guards libcontainer.InitBinary, which is the whole process's.
var initBinary sync.Mutex

// useInitBinary makes libcontainer run a sealed copy of the binary at path
// as every sandbox's init, or this process's own binary when path is
// empty. The binary must hold the same build of libcontainer as this one.
func useInitBinary(path string) error {
	var sealed *os.File
	if path != "" {
		var err error
		if sealed, err = sealInitBinary(path); err != nil {
			return err
		}
	}
	initBinary.Lock()
	defer initBinary.Unlock()
	if old := libcontainer.InitBinary; old != nil {
		_ = old.Close()
	}
	libcontainer.InitBinary = sealed
	return nil
}

func sealInitBinary(path string) (*os.File, error) {
	out, err := exec.Command(path, "build").Output()
	if err != nil {
		if ee, ok := errors.AsType[*exec.ExitError](err); ok && len(ee.Stderr) > 0 {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, fmt.Errorf("init binary %s: %w", path, err)
	}
	if got, want := strings.TrimSpace(string(out)), nsinit.Build(); got != want {
		return nil, fmt.Errorf("init binary %s is of another build (%s) than this sandboxd (%s): install the %s built with it", path, got, want, InitBinaryName)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("init binary: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("init binary: %w", err)
	}
	// Sealed, as libcontainer's own copies are: no sandbox can write to
	// the binary the next sandboxes start from.
	clone, err := exeseal.CloneBinary(f, st.Size(), path, os.TempDir())
	if err != nil {
		return nil, fmt.Errorf("init binary: seal a copy of %s: %w", path, err)
	}
	if !exeseal.IsCloned(clone) {
		_ = clone.Close()
		return nil, fmt.Errorf("init binary: the copy of %s could not be sealed", path)
	}
	return clone, nil
}
