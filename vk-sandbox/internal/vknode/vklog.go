package vknode

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
)

// SetVKLogger sends virtual-kubelet's own logs to log. Its messages are
// free text (often formatted), so each line has one constant message and
// the text under "text"; its fields become attributes.
func SetVKLogger(log *slog.Logger) {
	vklog.L = &vkLogger{l: log}
}

// vkLogger is virtual-kubelet's log.Logger over slog.
type vkLogger struct{ l *slog.Logger }

// vkMessage is the message of every line virtual-kubelet logs.
const vkMessage = "virtual-kubelet log"

func (v *vkLogger) log(level slog.Level, text string) {
	v.l.Log(context.Background(), level, vkMessage, "text", text)
}

func (v *vkLogger) Debug(args ...any) { v.log(slog.LevelDebug, fmt.Sprint(args...)) }
func (v *vkLogger) Debugf(format string, args ...any) {
	v.log(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (v *vkLogger) Info(args ...any) { v.log(slog.LevelInfo, fmt.Sprint(args...)) }
func (v *vkLogger) Infof(format string, args ...any) {
	v.log(slog.LevelInfo, fmt.Sprintf(format, args...))
}
func (v *vkLogger) Warn(args ...any) { v.log(slog.LevelWarn, fmt.Sprint(args...)) }
func (v *vkLogger) Warnf(format string, args ...any) {
	v.log(slog.LevelWarn, fmt.Sprintf(format, args...))
}
func (v *vkLogger) Error(args ...any) { v.log(slog.LevelError, fmt.Sprint(args...)) }
func (v *vkLogger) Errorf(format string, args ...any) {
	v.log(slog.LevelError, fmt.Sprintf(format, args...))
}

func (v *vkLogger) Fatal(args ...any) {
	v.log(slog.LevelError, fmt.Sprint(args...))
	os.Exit(1)
}

func (v *vkLogger) Fatalf(format string, args ...any) {
	v.log(slog.LevelError, fmt.Sprintf(format, args...))
	os.Exit(1)
}

func (v *vkLogger) WithField(k string, val any) vklog.Logger {
	return &vkLogger{l: v.l.With(k, val)}
}

func (v *vkLogger) WithFields(f vklog.Fields) vklog.Logger {
	args := make([]any, 0, 2*len(f))
	for k, val := range f {
		args = append(args, k, val)
	}
	return &vkLogger{l: v.l.With(args...)}
}

func (v *vkLogger) WithError(err error) vklog.Logger {
	return &vkLogger{l: v.l.With("error", err)}
}
