package v1beta1

import (
	"encoding/json"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cbor "k8s.io/apimachinery/pkg/runtime/serializer/cbor/direct"
)

// MicroTime is a time to the microsecond: an RFC 3339 string in UTC with
// six digits of fraction, as metav1.MicroTime writes it. Readers also take
// one with any fraction or none: an entry's times were whole seconds
// before hosts kept their microseconds.
//
// +kubebuilder:object:generate=false
// +kubebuilder:validation:Type=string
// +kubebuilder:validation:Format=date-time
type MicroTime struct {
	// Not metav1.MicroTime itself: it reads six digits of fraction only,
	// and refuses the whole seconds of an older host's entries (a reader
	// that has these times as metav1.Time reads them all: time.Parse takes
	// a fraction its layout does not name). Embedded, not a time.Time of
	// its own: equality.Semantic, with which the publisher compares
	// entries, knows how to compare a metav1.MicroTime, and would panic on
	// time.Time's unexported fields. NewMicroTime and the readers keep the
	// time in UTC and truncated to the microsecond, so that an entry
	// compares equal to itself after a round trip through JSON.
	metav1.MicroTime
}

// NewMicroTime returns t as a MicroTime keeps it: in UTC, truncated to the
// microsecond.
func NewMicroTime(t time.Time) MicroTime {
	if t.IsZero() {
		return MicroTime{}
	}
	return MicroTime{metav1.NewMicroTime(t.UTC().Truncate(time.Microsecond))}
}

// DeepCopyInto copies t into out; a time.Time is immutable.
func (t *MicroTime) DeepCopyInto(out *MicroTime) { *out = *t }

// DeepCopy returns a copy of t.
func (t *MicroTime) DeepCopy() *MicroTime {
	if t == nil {
		return nil
	}
	out := *t
	return &out
}

// Equal reports whether t and u are the same instant; both nil are equal.
func (t *MicroTime) Equal(u *MicroTime) bool {
	if t == nil || u == nil {
		return t == u
	}
	return t.Time.Equal(u.Time)
}

// format is t as JSON and CBOR write it; "" for the zero time.
func (t MicroTime) format() string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(metav1.RFC3339Micro)
}

// parseMicroTime reads s, RFC 3339 with any fraction of a second or none.
func parseMicroTime(s string) (MicroTime, error) {
	pt, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return MicroTime{}, err
	}
	return NewMicroTime(pt), nil
}

// MarshalJSON writes t as metav1.MicroTime does: null when zero.
func (t MicroTime) MarshalJSON() ([]byte, error) {
	s := t.format()
	if s == "" {
		return []byte("null"), nil
	}
	return json.Marshal(s)
}

// UnmarshalJSON reads null (the zero time) or an RFC 3339 time, with or
// without a fraction of a second.
func (t *MicroTime) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*t = MicroTime{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	pt, err := parseMicroTime(s)
	if err != nil {
		return err
	}
	*t = pt
	return nil
}

// MarshalCBOR writes t as metav1.MicroTime does: nil when zero.
func (t MicroTime) MarshalCBOR() ([]byte, error) {
	s := t.format()
	if s == "" {
		return cbor.Marshal(nil)
	}
	return cbor.Marshal(s)
}

// UnmarshalCBOR reads nil (the zero time) or a string as UnmarshalJSON
// does.
func (t *MicroTime) UnmarshalCBOR(b []byte) error {
	var s *string
	if err := cbor.Unmarshal(b, &s); err != nil {
		return err
	}
	if s == nil {
		*t = MicroTime{}
		return nil
	}
	pt, err := parseMicroTime(*s)
	if err != nil {
		return err
	}
	*t = pt
	return nil
}

// ToUnstructured is t as runtime.DefaultUnstructuredConverter writes it:
// its JSON string, or nil when zero.
func (t MicroTime) ToUnstructured() any {
	if s := t.format(); s != "" {
		return s
	}
	return nil
}
