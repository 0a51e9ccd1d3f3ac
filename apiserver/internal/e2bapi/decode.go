package e2bapi

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"time"
)

// decodeBody reads r's JSON body into v. An absent or empty body leaves v
// as it is (each route then applies its defaults and required fields).
// Unknown fields are ignored, as e2b's server does: newer SDKs send fields
// an older server does not know. A field of the wrong type is a 400 naming
// the field. On failure decodeBody writes the answer and returns false.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body := &readErrs{r: http.MaxBytesReader(w, r.Body, maxBodyBytes)}
	dec := json.NewDecoder(body)
	err := dec.Decode(v)
	if errors.Is(err, io.EOF) {
		return true
	}
	if err == nil {
		// Exactly one JSON value: anything after it is malformed input.
		var extra json.RawMessage
		if err2 := dec.Decode(&extra); !errors.Is(err2, io.EOF) {
			if err2 == nil {
				err2 = errors.New("more than one JSON value")
			}
			err = err2
		}
	}
	if err == nil {
		return true
	}
	var (
		maxErr    *http.MaxBytesError
		typeErr   *json.UnmarshalTypeError
		syntaxErr *json.SyntaxError
	)
	var netErr net.Error
	switch {
	case errors.As(body.err, &netErr) && netErr.Timeout():
		// The server's read timeout: a body sent too slowly. The
		// connection is closed after this answer.
		writeError(w, http.StatusRequestTimeout, "", "body: not received in time")
	case body.err != nil && !errors.As(body.err, &maxErr):
		// The connection failed (its error names addresses): whoever
		// sent the body has most likely gone.
		writeError(w, http.StatusBadRequest, "", "body: could not be read")
	case errors.As(err, &maxErr):
		writeError(w, http.StatusRequestEntityTooLarge, "", "body: larger than %d bytes", maxBodyBytes)
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			writeError(w, http.StatusBadRequest, "", "body: must be a JSON object, not %s", jsonValueKind(typeErr.Value))
		} else {
			writeError(w, http.StatusBadRequest, "", "%s: must be %s, not %s", typeErr.Field, jsonTypeName(typeErr.Type), jsonValueKind(typeErr.Value))
		}
	case errors.As(err, &syntaxErr):
		writeError(w, http.StatusBadRequest, "", "body: invalid JSON at byte %d: %s", syntaxErr.Offset, syntaxErr.Error())
	case errors.Is(err, io.ErrUnexpectedEOF):
		writeError(w, http.StatusBadRequest, "", "body: invalid JSON: unexpected end of input")
	default:
		writeError(w, http.StatusBadRequest, "", "body: invalid JSON: %s", err.Error())
	}
	return false
}

// readErrs remembers the error of a body read other than io.EOF, so that
// decodeBody can tell a failing connection from malformed JSON.
type readErrs struct {
	r   io.Reader
	err error
}

func (e *readErrs) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		e.err = err
	}
	return n, err
}

// jsonValueKind names the JSON value an UnmarshalTypeError saw ("number",
// "number 1.5", "string", …), without echoing long input.
func jsonValueKind(v string) string {
	if strings.HasPrefix(v, "number ") {
		return "the number " + strings.TrimPrefix(v, "number ")
	}
	return "a JSON " + v
}

// jsonTypeName describes a Go type in JSON terms for an error message.
func jsonTypeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return jsonTypeName(t.Elem())
	default:
		return "a JSON value"
	}
}

// seconds validates an optional timeout in seconds from a body: absent
// gives def; it must lie in [minSeconds, max].
func seconds(field string, v *int64, def time.Duration, minSeconds int64, maxD time.Duration) (time.Duration, error) {
	if v == nil {
		return min(def, maxD), nil
	}
	maxS := int64(maxD / time.Second)
	switch {
	case *v < minSeconds && minSeconds > 0:
		return 0, Invalid(field, "must be at least %d second(s), got %d", minSeconds, *v)
	case *v < 0:
		return 0, Invalid(field, "must not be negative, got %d", *v)
	case *v > maxS:
		return 0, Invalid(field, "must be at most %d seconds, got %d", maxS, *v)
	}
	return time.Duration(*v) * time.Second, nil
}

// writeInvalid answers a validation error.
func writeInvalid(w http.ResponseWriter, err error) {
	writeError(w, http.StatusBadRequest, "", "%s", err.Error())
}

// required is the error for a missing required field.
func required(field string) error {
	return Invalid(field, "is required")
}
