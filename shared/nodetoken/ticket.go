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

// A pull ticket lets one sandbox host fetch one snapshot from the host that
// holds it (sandboxd to sandboxd), without either holding the other's
// token: the control plane, which knows every host's token, makes the
// ticket with the holder's token, and the holder checks it with its own.
//
//	ticket = <expiry, Unix seconds> "." hex(HMAC-SHA256(token, "skiff-pull\x00" snapshot "\x00" expiry))
//
// It opens that snapshot's manifest, layers and state image, and nothing
// else, until it expires.

// PullTicketScheme is the Authorization scheme of a ticket:
// "Authorization: Skiff-Pull <ticket>".
const PullTicketScheme = "Skiff-Pull"

// PullTicket is a ticket for snapshot on the host whose token is token,
// valid until expires.
func PullTicket(token, snapshot string, expires time.Time) string {
	exp := strconv.FormatInt(expires.Unix(), 10)
	return exp + "." + ticketMAC(token, snapshot, exp)
}

func ticketMAC(token, snapshot, exp string) string {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("skiff-pull\x00" + snapshot + "\x00" + exp))
	return hex.EncodeToString(m.Sum(nil))
}

// ErrTicket is a ticket that opens nothing: malformed, for another
// snapshot or host, or expired.
var ErrTicket = errors.New("invalid or expired pull ticket")

// CheckPullTicket reports whether ticket opens snapshot on the host whose
// token is token, at now.
func CheckPullTicket(token, snapshot, ticket string, now time.Time) error {
	exp, mac, ok := strings.Cut(ticket, ".")
	if !ok || token == "" {
		return ErrTicket
	}
	n, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || now.Unix() > n {
		return ErrTicket
	}
	if !hmac.Equal([]byte(mac), []byte(ticketMAC(token, snapshot, exp))) {
		return ErrTicket
	}
	return nil
}
