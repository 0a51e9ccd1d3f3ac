package nodetoken

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// A volume token is e2b's VolumeAndToken.token: it lets its holder read
// and write one volume of one team through the e2b API's volume content
// routes, and nothing else, until it expires. The apiserver makes it (POST
// /volumes, GET /volumes/{id}) and checks it, with a key every replica
// derives alike from the secret it already holds (VolumeKey):
//
//	token = "skv1." <team> "." <volume> "." <expiry, Unix seconds> "." hex(HMAC-SHA256(key, the part before))
//
// Team names and volume IDs hold no ".".

// volumeTokenPrefix starts every volume token.
const volumeTokenPrefix = "skv1."

// ErrVolumeToken is a token that opens no volume: malformed, signed with
// another key, or expired.
var ErrVolumeToken = errors.New("invalid or expired volume token")

// VolumeKey is the key volume tokens are signed with: derived from the
// fleet key or the shared node token, whichever t holds.
func (t *Tokens) VolumeKey() []byte {
	secret := t.key
	if secret == nil {
		secret = []byte(t.shared)
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("skiff volume tokens v1"))
	return m.Sum(nil)
}

// VolumeToken is a token for volume of team, valid until expires.
func VolumeToken(key []byte, team, volume string, expires time.Time) string {
	body := volumeTokenPrefix + team + "." + volume + "." + strconv.FormatInt(expires.Unix(), 10)
	return body + "." + volumeMAC(key, body)
}

func volumeMAC(key []byte, body string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(body))
	return hex.EncodeToString(m.Sum(nil))
}

// CheckVolumeToken returns the team and volume token opens at now.
func CheckVolumeToken(key []byte, token string, now time.Time) (team, volume string, err error) {
	body, mac, ok := cutLast(token, ".")
	if !ok || !strings.HasPrefix(body, volumeTokenPrefix) || !hmac.Equal([]byte(mac), []byte(volumeMAC(key, body))) {
		return "", "", ErrVolumeToken
	}
	parts := strings.Split(strings.TrimPrefix(body, volumeTokenPrefix), ".")
	if len(parts) != 3 {
		return "", "", ErrVolumeToken
	}
	exp, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || now.Unix() > exp {
		return "", "", ErrVolumeToken
	}
	return parts[0], parts[1], nil
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}
