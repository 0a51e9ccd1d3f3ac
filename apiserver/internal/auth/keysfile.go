package auth

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// maxParseErrors bounds how many problems one parse reports.
const maxParseErrors = 20

// keySet is the parsed content of a keys file: key digests and their teams.
// It never holds a key. It is immutable once built, so lookups need no lock.
type keySet struct {
	// byPrefix narrows a lookup by the first 8 bytes of the digest; the
	// decision is a constant-time comparison of the whole digest.
	byPrefix map[uint64][]keyEntry
	n        int
}

type keyEntry struct {
	digest [sha256.Size]byte
	team   string
}

// team returns the team of key, if any.
func (s *keySet) team(key string) (string, bool) {
	if !ValidKey(key) {
		return "", false
	}
	d := digest(key)
	for _, e := range s.byPrefix[digestPrefix(d)] {
		if equalDigests(e.digest[:], d[:]) {
			return e.team, true
		}
	}
	return "", false
}

func digestPrefix(d [sha256.Size]byte) uint64 {
	return binary.BigEndian.Uint64(d[:8])
}

// parseKeysFile parses a keys file: one `team key` pair per line, fields
// separated by blanks; `#` starts a comment; blank lines are ignored. The
// team must be a namespace name (an RFC 1123 label) and the key must pass
// ValidKey. A key listed for two teams is an error; listed twice for one
// team it is harmless.
//
// Errors name line numbers and never quote the file, which holds secrets.
func parseKeysFile(data []byte) (*keySet, error) {
	type seenKey struct {
		team string
		line int
	}
	seen := map[[sha256.Size]byte]seenKey{}
	var errs []error
	add := func(err error) {
		if len(errs) < maxParseErrors {
			errs = append(errs, err)
		} else if len(errs) == maxParseErrors {
			errs = append(errs, errors.New("more problems follow; fix these first"))
		}
	}
	text := strings.TrimPrefix(string(data), "\uFEFF")
	for i, line := range strings.Split(text, "\n") {
		n := i + 1
		line, _, _ = strings.Cut(line, "#")
		fields := strings.Fields(line)
		switch {
		case len(fields) == 0:
			continue
		case len(fields) != 2:
			add(fmt.Errorf("line %d: want two fields, `team key`, got %d", n, len(fields)))
			continue
		}
		team, key := fields[0], fields[1]
		if ValidKey(team) && !ValidKey(key) {
			add(fmt.Errorf("line %d: the key comes second: want `team key`", n))
			continue
		}
		if msgs := validation.IsDNS1123Label(team); len(msgs) > 0 {
			// The messages describe the rule; they do not quote the value.
			add(fmt.Errorf("line %d: the team is not a valid namespace name: %s", n, strings.Join(msgs, "; ")))
		}
		if !ValidKey(key) {
			add(fmt.Errorf("line %d: the key is not %q followed by %d lowercase hex characters", n, KeyPrefix, keyHexLen))
			continue
		}
		d := digest(key)
		if prev, ok := seen[d]; ok {
			if prev.team != team {
				add(fmt.Errorf("lines %d and %d: the same key is listed for two teams", prev.line, n))
			}
			continue
		}
		seen[d] = seenKey{team: team, line: n}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	set := &keySet{byPrefix: make(map[uint64][]keyEntry, len(seen)), n: len(seen)}
	for d, s := range seen {
		p := digestPrefix(d)
		set.byPrefix[p] = append(set.byPrefix[p], keyEntry{digest: d, team: s.team})
	}
	return set, nil
}
