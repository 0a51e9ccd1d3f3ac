package wire_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/skiff-dev/skiff/wire"
)

func TestWriteErrorIsJSONWhateverTheMessage(t *testing.T) {
	for _, msg := range []string{"plain", `quote " and \ backslash`, "newline\nand\ttab", "\x00\x1f control", "ünïcödé ✓", "\xff invalid utf-8", "</script>"} {
		rec := httptest.NewRecorder()
		wire.WriteError(rec, http.StatusBadGateway, msg)
		if rec.Code != http.StatusBadGateway {
			t.Errorf("%q: status %d, want 502", msg, rec.Code)
		}
		var got wire.Error
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("%q: body %q is not JSON: %v", msg, rec.Body.String(), err)
		}
		if got.Code != http.StatusBadGateway {
			t.Errorf("%q: code %d, want 502", msg, got.Code)
		}
		if json.Valid([]byte(msg)) && got.Message != msg {
			t.Errorf("message %q came back as %q", msg, got.Message)
		}
		for k, want := range map[string]string{"Content-Type": "application/json", "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"} {
			if v := rec.Header().Get(k); v != want {
				t.Errorf("%s: %q, want %q", k, v, want)
			}
		}
	}
}

func TestWriteKeepsE2bFields(t *testing.T) {
	rec := httptest.NewRecorder()
	wire.Write(rec, wire.Error{SandboxID: "abc", Code: 502, Message: "The sandbox was not found"})
	var got map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got["sandboxId"] != "abc" || got["code"] != float64(502) || got["message"] != "The sandbox was not found" {
		t.Errorf("body %s", rec.Body.String())
	}
	if _, ok := got["error_code"]; ok {
		t.Errorf("empty error_code written: %s", rec.Body.String())
	}
	rec = httptest.NewRecorder()
	wire.Write(rec, wire.Error{Code: 503, Message: "m", ErrorCode: "sandbox_capacity_unavailable"})
	if want := `{"code":503,"message":"m","error_code":"sandbox_capacity_unavailable"}` + "\n"; rec.Body.String() != want {
		t.Errorf("body %q, want %q", rec.Body.String(), want)
	}
}

func FuzzWriteError(f *testing.F) {
	f.Add(400, "bad")
	f.Add(502, "\xff\"\\")
	f.Fuzz(func(t *testing.T, status int, msg string) {
		if status < 100 || status > 999 {
			return
		}
		rec := httptest.NewRecorder()
		wire.WriteError(rec, status, msg)
		var got wire.Error
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got.Code != status {
			t.Fatalf("status %d message %q: body %q (%v)", status, msg, rec.Body.String(), err)
		}
	})
}
