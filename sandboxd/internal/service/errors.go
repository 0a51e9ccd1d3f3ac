package service

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	"github.com/skiff-dev/skiff/sandboxd/internal/envdclient"
	"github.com/skiff-dev/skiff/sandboxd/internal/ipam"
	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/sandboxrt"
)

// errWrongState is wrapped when a sandbox is not in the state an operation
// needs (resume of a running one, pause of a paused one, …).
var errWrongState = errors.New("sandbox is in the wrong state")

// stateError is an errWrongState whose message is only its own words, for
// an answer the caller shows as it is.
type stateError string

func (e stateError) Error() string        { return string(e) }
func (e stateError) Is(target error) bool { return target == errWrongState }

// toConnect maps an error to its Connect code; it is the one place where
// sandboxd's error categories meet the wire. Messages never carry tokens:
// no error in this package is built from one.
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	if ce := new(connect.Error); errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, registry.ErrNotFound), errors.Is(err, sandboxrt.ErrNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, registry.ErrExists):
		code = connect.CodeAlreadyExists
	case errors.Is(err, registry.ErrExhausted), errors.Is(err, ipam.ErrExhausted):
		code = connect.CodeResourceExhausted
	case errors.Is(err, registry.ErrNotWarm), errors.Is(err, errWrongState), errors.Is(err, sandboxrt.ErrCaptureTooLarge):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, envdclient.ErrEnvd):
		code = connect.CodeUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	}
	return connect.NewError(code, err)
}

// fieldErrors collects what is wrong with a request, each naming its field.
type fieldErrors []string

func (f *fieldErrors) add(field, format string, args ...any) {
	*f = append(*f, field+": "+fmt.Sprintf(format, args...))
}

// err is the invalid_argument error naming every bad field, or nil.
func (f fieldErrors) err() error {
	if len(f) == 0 {
		return nil
	}
	return connect.NewError(connect.CodeInvalidArgument, errors.New(strings.Join(f, "; ")))
}
