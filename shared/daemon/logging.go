package daemon

import (
	"log/slog"
	"os"

	"github.com/skiff-dev/skiff/shared/logflags"
)

// Logger is the logger of --log-level and --log-format on stderr. It
// becomes slog's default, and client-go's and controller-runtime's logs go
// to it.
func Logger(o *logflags.Options) (*slog.Logger, error) {
	log, err := o.Logger(os.Stderr)
	if err != nil {
		return nil, err
	}
	slog.SetDefault(log)
	SendKubeLogs(log)
	return log, nil
}
