package hosttest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

// Inside the tests, /root is an empty tmpfs and /home one too; what a test
// makes there, the host does not see.
func TestHomesAreHidden(t *testing.T) {
	if os.Geteuid() == 0 {
		for _, d := range homes {
			ents, err := os.ReadDir(d)
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			if len(ents) != 0 {
				t.Fatalf("%s has %d entries (%s…), want none", d, len(ents), ents[0].Name())
			}
		}
	}
	AssertHidden(t)
}

// A marker set by hand does not get tests past the guard: the test binary
// run in the host's mount namespace with the marker refuses to run them
// (-test.run=^$ runs none, should the refusal be broken).
func TestMarkerAloneIsNoGuard(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: no guard")
	}
	pid, err := outsidePID()
	if err != nil {
		t.Fatal(err)
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		t.Skip(err)
	}
	cmd := exec.Command(nsenter, fmt.Sprintf("--mount=/proc/%d/ns/mnt", pid), "--", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", markerEnv, pid))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(string(out), "the homes are not hidden") {
		t.Fatalf("run outside with the marker: %v\n%s", err, out)
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/a\040b`: "/a b",
		`/plain`:  "/plain",
		`/x\`:     `/x\`,
		`/x\04`:   `/x\04`,
		`\134`:    `\`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
