package daemon

import (
	"log/slog"
	"os"

	"github.com/skiff-dev/skiff/shared/logflags"
)

// Logger is the logger of --log-level and --log-format on stderr. It
// becomes slog's default (kubeclient.SendLogs sends client-go's logs to it).
func Logger(o *logflags.Options) (*slog.Logger, error) {
	log, err := o.Logger(os.Stderr)
	if err != nil {
		return nil, err
	}
	slog.SetDefault(log)
	return log, nil
}
