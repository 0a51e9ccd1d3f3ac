package process

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/skiff-dev/skiff/envd/internal/identity"
	pb "github.com/skiff-dev/skiff/envd/proto/process"
)

// command builds the exec.Cmd for cfg, run as u; every error is bad input:
//   - the environment is built, not inherited: envd's PATH, the user's HOME,
//     USER and LOGNAME, then the sandbox defaults (/init's envVars and
//     E2B_SANDBOX=true), then the request's envs, the last one winning;
//   - the working directory is cfg.cwd (relative to the user's home), else
//     the sandbox's default workdir, else the home; a requested cwd must
//     exist, a missing default falls back to /;
//   - the process runs with the user's uid, gid and groups when envd runs as
//     someone else.
func command(cfg *pb.ProcessConfig, u *identity.User, defaults map[string]string, workdir string) (*exec.Cmd, error) {
	if cfg == nil || cfg.GetCmd() == "" {
		return nil, errors.New("cmd is empty")
	}
	cwd := cfg.GetCwd()
	if cwd == "" {
		cwd = workdir
	}
	if cwd == "" {
		cwd = u.Home
	}
	cwd, err := identity.ResolvePath(cwd, u)
	if err != nil {
		return nil, fmt.Errorf("cwd: %w", err)
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		if cfg.GetCwd() != "" {
			return nil, fmt.Errorf("cwd '%s' does not exist", cwd)
		}
		cwd = "/" // a default workdir or home that is missing (nobody's /nonexistent)
	}

	env := map[string]string{"PATH": os.Getenv("PATH"), "HOME": u.Home, "USER": u.Name, "LOGNAME": u.Name}
	if env["PATH"] == "" {
		env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	maps.Copy(env, defaults)
	maps.Copy(env, cfg.GetEnvs())

	path := cfg.GetCmd()
	if !strings.Contains(path, "/") {
		// Look the command up on the PATH the process gets, not envd's.
		// A name with a slash is a path, as to a shell: relative to the
		// working directory (exec runs it from cmd.Dir).
		found, err := lookPath(path, env["PATH"], cwd)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", path, err)
		}
		path = found
	}
	cmd := exec.Command(path, cfg.GetArgs()...)
	cmd.Args[0] = cfg.GetCmd()
	cmd.Dir = cwd
	cmd.Env = make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		cmd.Env = append(cmd.Env, k+"="+env[k])
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if uint32(os.Geteuid()) != u.UID || uint32(os.Getegid()) != u.GID {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	return cmd, nil
}

// lookPath finds file in the directories of path, as a shell would; a
// relative directory (".", or empty) is the process's working directory,
// cwd. The path it returns is absolute.
func lookPath(file, path, cwd string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		p := filepath.Join(dir, file)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}
