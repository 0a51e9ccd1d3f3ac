package filesig

import (
	"net/url"
	"strconv"
	"testing"
	"time"
)

// FuzzVerify checks that signature verification never panics and
// accepts only exactly the signature of the request's own parameters.
func FuzzVerify(f *testing.F) {
	const token = "tok"
	now := time.Unix(1_700_000_000, 0)
	valid := Sign("/home/user/f", OpRead, "", token, nil)
	f.Add("path=%2Fhome%2Fuser%2Ff&signature="+url.QueryEscape(valid), "read")
	f.Add("path=%2Fhome%2Fuser%2Ff&signature="+url.QueryEscape(valid)+"&signature_expiration=1", "read")
	f.Add("path=%2Fhome%2Fuser%2Ff&signature="+url.QueryEscape(valid)+"&signature="+url.QueryEscape(valid), "read")
	f.Add("path=x&username=root&signature=v1_&signature_expiration=99999999999", "write")
	f.Add("signature=v1_%ZZ&signature_expiration=-1", "read")
	f.Add("signature_expiration=+1700000001&signature=v1_abc", "read")
	f.Fuzz(func(t *testing.T, rawQuery, op string) {
		q, err := url.ParseQuery(rawQuery)
		if err != nil {
			return
		}
		got := Verify(q, op, token, now)
		// The one acceptable outcome, computed independently.
		want := false
		if sigs := q["signature"]; len(sigs) == 1 {
			exps, hasExp := q["signature_expiration"]
			var exp *int64
			okExp := true
			if hasExp {
				okExp = false
				if len(exps) == 1 {
					if v, err := strconv.ParseInt(exps[0], 10, 64); err == nil && strconv.FormatInt(v, 10) == exps[0] && v >= now.Unix() {
						exp, okExp = &v, true
					}
				}
			}
			want = okExp && sigs[0] == Sign(q.Get("path"), op, q.Get("username"), token, exp)
		}
		if got != want {
			t.Fatalf("Verify(%q, %q) = %v, want %v", rawQuery, op, got, want)
		}
		if Verify(q, op, "", now) {
			t.Fatal("a signature verified with no token")
		}
	})
}
