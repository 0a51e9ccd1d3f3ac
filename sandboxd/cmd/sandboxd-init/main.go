// Command sandboxd-init is the first process of every sandbox of sandboxd's
// native runtime: libcontainer's init, which sets the sandbox up from inside
// (mounts, root, hostname, capabilities, seccomp) and then becomes its envd.
// sandboxd runs it (--init-binary) rather than a copy of its own binary,
// which is several times larger and initialises much more before it gets
// there.
//
//	sandboxd-init init    what libcontainer runs (package nsinit)
//	sandboxd-init build   prints the build of libcontainer it holds, which
//	                      must be sandboxd's own
package main

import (
	"fmt"
	"os"

	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt/native/nsinit"
)

func main() {
	// "init" never gets here: package nsinit's init took it.
	if len(os.Args) == 2 && os.Args[1] == "build" {
		fmt.Println(nsinit.Build())
		return
	}
	fmt.Fprintln(os.Stderr, "sandboxd-init is run by sandboxd as the init of each sandbox; by hand it takes only \"build\"")
	os.Exit(2)
}
