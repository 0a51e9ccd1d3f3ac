package kubeinventory

import (
	"encoding/json"
	"sync"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// packedDecoder decodes packed sandbox entries (v1beta1.PackSandboxes'
// encoding) as v1beta1.UnpackSandboxes does, and keeps the entries of its
// last decode by their JSON text: a decode of the next version of the
// same packed field (a host's changes, which mostly carry over from one
// publish to the next) decodes only the entries whose text is new, and
// checks every entry (v1beta1.ValidEntries) each time. The entries it
// returns share their metadata with those it keeps: only read them. It is
// safe for concurrent use (one decode at a time).
type packedDecoder struct {
	mu   sync.Mutex
	last map[string]v1beta1.SandboxEntry
}

// decode returns what v1beta1.UnpackSandboxes(packed) returns: the valid
// entries, and an error for what it did not keep (then, for packed that
// does not decode, no entry).
func (d *packedDecoder) decode(packed string) ([]v1beta1.SandboxEntry, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	spans, ok := splitPacked(packed)
	if !ok {
		// Not the compact array of objects PackSandboxes writes: the whole
		// decode says what is wrong with it.
		d.last = nil
		return v1beta1.UnpackSandboxes(packed)
	}
	next := make(map[string]v1beta1.SandboxEntry, len(spans))
	entries := make([]v1beta1.SandboxEntry, 0, len(spans))
	for _, sp := range spans {
		text := packed[sp[0]:sp[1]]
		e, seen := d.last[text]
		if !seen {
			if err := json.Unmarshal([]byte(text), &e); err != nil {
				// As a decode of the whole array: nothing of it.
				d.last = nil
				return nil, err
			}
		}
		next[text] = e
		entries = append(entries, e)
	}
	d.last = next
	return v1beta1.ValidEntries(entries)
}

// splitPacked returns where each element of packed starts and ends, when
// packed is a JSON array of objects with no space around its elements (as
// json.Marshal writes it); ok is false for anything else, valid JSON or
// not. An element is only delimited here (its braces balanced outside
// strings), not checked: decoding it checks it.
func splitPacked(packed string) (spans [][2]int, ok bool) {
	if len(packed) < 2 || packed[0] != '[' || packed[len(packed)-1] != ']' {
		return nil, false
	}
	if len(packed) == 2 {
		return nil, true
	}
	end := len(packed) - 1 // the array's closing bracket
	i := 1
	for {
		if packed[i] != '{' {
			return nil, false
		}
		start, depth, inString := i, 0, false
		for ; i < end; i++ {
			c := packed[i]
			switch {
			case inString && c == '\\':
				i++ // the escaped character
			case c == '"':
				inString = !inString
			case inString:
			case c == '{' || c == '[':
				depth++
			case c == '}' || c == ']':
				depth--
			}
			if depth == 0 {
				break
			}
		}
		if i >= end {
			return nil, false
		}
		i++ // past the element's closing brace
		spans = append(spans, [2]int{start, i})
		switch {
		case i == end:
			return spans, true
		case packed[i] == ',' && i+1 < end:
			i++
		default:
			return nil, false
		}
	}
}
