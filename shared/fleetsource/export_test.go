package fleetsource

import (
	"log/slog"
	"time"

	"github.com/skiff-dev/skiff/shared/serverclock"
)

// SetServerClockNow makes OpenKube measure the kube-apiserver's time
// against now and send each clock it makes to made, until the returned
// function restores it.
func SetServerClockNow(now func() time.Time, made func(*serverclock.Clock)) (restore func()) {
	old := newServerClock
	newServerClock = func(log *slog.Logger) *serverclock.Clock {
		c := serverclock.New(now, log, nil)
		made(c)
		return c
	}
	return func() { newServerClock = old }
}
