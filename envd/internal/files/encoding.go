package files

import (
	"strings"
)

// Content codings the download route can answer with.
const (
	encodingIdentity = "identity"
	encodingGzip     = "gzip"
)

// maxAcceptEncodingElements bounds the work spent on one Accept-Encoding.
const maxAcceptEncodingElements = 64

// parseAcceptEncoding parses Accept-Encoding header values (RFC 9110
// §12.5.3) into lowercased codings and their q-values in thousandths
// (0..1000). Elements with a malformed coding or q-value are ignored; the
// first occurrence of a coding wins.
func parseAcceptEncoding(values []string) map[string]int {
	out := make(map[string]int)
	n := 0
	for _, v := range values {
		for elem := range strings.SplitSeq(v, ",") {
			if n++; n > maxAcceptEncodingElements {
				return out
			}
			coding, params, _ := strings.Cut(elem, ";")
			coding = strings.ToLower(strings.TrimSpace(coding))
			if !isToken(coding) {
				continue
			}
			q, ok := 1000, true
			for param := range strings.SplitSeq(params, ";") {
				name, value, _ := strings.Cut(param, "=")
				if strings.EqualFold(strings.TrimSpace(name), "q") {
					q, ok = parseQValue(strings.TrimSpace(value))
				}
			}
			if _, seen := out[coding]; ok && !seen {
				out[coding] = q
			}
		}
	}
	return out
}

// parseQValue parses `"0" [ "." 0*3DIGIT ] / "1" [ "." 0*3("0") ]` into
// thousandths.
func parseQValue(s string) (int, bool) {
	if s == "" || len(s) > 5 || (s[0] != '0' && s[0] != '1') {
		return 0, false
	}
	q := int(s[0]-'0') * 1000
	if len(s) == 1 {
		return q, true
	}
	if s[1] != '.' {
		return 0, false
	}
	scale := 100
	for i := 2; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		q += int(c-'0') * scale
		scale /= 10
	}
	if q > 1000 {
		return 0, false
	}
	return q, true
}

// isToken reports whether s is a non-empty RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// negotiateEncoding picks the coding of a download for the Accept-Encoding
// header values: encodingGzip, encodingIdentity, or "" when the client
// accepts neither (406). With no header, or an empty one, identity is used.
// preferIdentity breaks a tie in identity's favour (for Range requests).
func negotiateEncoding(values []string, preferIdentity bool) string {
	accepted := parseAcceptEncoding(values)
	if len(accepted) == 0 {
		// Absent, empty or entirely malformed: identity only.
		return encodingIdentity
	}
	star, hasStar := accepted["*"]
	qGzip, ok := accepted[encodingGzip]
	if !ok {
		qGzip, ok = accepted["x-gzip"]
	}
	if !ok && hasStar {
		qGzip = star
	}
	qIdentity, ok := accepted[encodingIdentity]
	if !ok {
		qIdentity = 1000 // acceptable unless excluded explicitly or by "*;q=0"
		if hasStar {
			qIdentity = star
		}
	}
	switch {
	case qGzip > 0 && (qGzip > qIdentity || (qGzip == qIdentity && !preferIdentity)):
		return encodingGzip
	case qIdentity > 0:
		return encodingIdentity
	case qGzip > 0:
		return encodingGzip
	}
	return ""
}
