package sandboxrt

// DefaultCapabilities are Docker's default capabilities, which a sandbox's
// root holds inside the sandbox (its user namespace, or gVisor's kernel)
// and never on the host: envd needs setuid and setgid to run commands as
// the sandbox's user.
var DefaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// CPUPeriod is the CFS period of sandboxes' CPU quota, in µs.
const CPUPeriod = 100_000
