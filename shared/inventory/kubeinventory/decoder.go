package kubeinventory

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/skiff-dev/skiff/api/v1beta1"
)

// packedDecoder decodes packed sandbox entries (v1beta1.PackSandboxes'
// encoding) as a shard's spec.packed is decoded
// (NodeInventoryShardSpec.UnpackedSandboxes), and keeps the entries of its last decode by
// their JSON text: a decode of the next version of the same packed field
// (a host's changes, which mostly carry over from one publish to the
// next) decodes and checks only the entries whose text is new. The
// entries it returns share their metadata with those it keeps: only read
// them. It is safe for concurrent use (one decode at a time).
type packedDecoder struct {
	mu   sync.Mutex
	last map[string]v1beta1.SandboxEntry
}

// decode returns the entries of packed that pass SandboxEntry.Validate, at
// most v1beta1.MaxShardEntries, and an error for what did not (then, for
// packed that does not decode, no entry).
func (d *packedDecoder) decode(packed string) ([]v1beta1.SandboxEntry, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	spans, ok := splitPacked(packed)
	if !ok {
		// Not the compact array of objects PackSandboxes writes: the whole
		// decode says what is wrong with it.
		d.last = nil
		return (&v1beta1.NodeInventoryShardSpec{Packed: packed}).UnpackedSandboxes()
	}
	next := make(map[string]v1beta1.SandboxEntry, len(spans))
	entries := make([]v1beta1.SandboxEntry, 0, len(spans))
	var errs []error
	for i, sp := range spans {
		text := packed[sp[0]:sp[1]]
		e, seen := d.last[text]
		if !seen {
			if err := json.Unmarshal([]byte(text), &e); err != nil {
				// As a decode of the whole array: nothing of it.
				d.last = nil
				return nil, err
			}
			if err := e.Validate(); err != nil {
				errs = append(errs, fmt.Errorf("entry %d: %w", i, err))
				continue
			}
		}
		next[text] = e
		entries = append(entries, e)
	}
	d.last = next
	kept := len(entries)
	if kept > v1beta1.MaxShardEntries {
		errs = append(errs, fmt.Errorf("%d entries, past the %d a host may have: the first %d kept", kept, v1beta1.MaxShardEntries, v1beta1.MaxShardEntries))
		entries = entries[:v1beta1.MaxShardEntries]
	}
	if len(errs) > 0 {
		return entries, fmt.Errorf("%d dropped: %w", len(spans)-len(entries), errors.Join(errs...))
	}
	return entries, nil
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
