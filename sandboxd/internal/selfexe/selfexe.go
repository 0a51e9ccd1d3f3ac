// Package selfexe knows where sandboxd's binary is on disk, even after
// sandboxd re-executed itself from a sealed in-memory copy (see the native
// runtime), when os.Executable names that copy instead.
package selfexe

import "os"

// Env carries the on-disk path of the binary across the re-execution.
const Env = "_SKIFF_SEALED_EXE"

// Path is the on-disk path of the running binary.
func Path() (string, error) {
	if p := os.Getenv(Env); p != "" {
		return p, nil
	}
	return os.Executable()
}
