package auth

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"github.com/skiff-dev/skiff/wire"
)

// HeaderAPIKey is the header the e2b SDKs send the API key in (the JS SDK
// spells it X-API-KEY; header names are case-insensitive).
const HeaderAPIKey = "X-API-Key"

type teamKey struct{}

// WithTeam returns a context carrying team, as Middleware does.
func WithTeam(ctx context.Context, team string) context.Context {
	return context.WithValue(ctx, teamKey{}, team)
}

// TeamFrom returns the team Middleware authenticated, if any.
func TeamFrom(ctx context.Context) (string, bool) {
	team, ok := ctx.Value(teamKey{}).(string)
	return team, ok && team != ""
}

// Middleware lets a request through to next only if its X-API-Key header
// holds a key store knows; next finds the key's team with TeamFrom. Without
// a key, or with a wrong one, it answers 401 in the e2b error shape
// {"code":401,"message":...}, which the SDKs turn into AuthenticationError.
// If the store cannot answer, it answers 500.
//
// Only X-API-Key is read. The e2b SDKs send nothing else on the routes
// Skiff serves; "Authorization: Bearer" carries e2b's CLI access tokens
// (sk_e2b_...), which Skiff does not issue, so such a request gets a 401 that
// says where the key goes.
//
// Every request is checked: mount GET /health, which must stay public, on the
// outer mux rather than behind Middleware. The key header is removed before
// next sees the request, so no handler logs or forwards it.
func Middleware(store Store, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys := r.Header.Values(HeaderAPIKey)
		switch {
		case len(keys) == 0 || keys[0] == "":
			msg := "missing API key: send it in the X-API-Key header"
			if r.Header.Get("Authorization") != "" {
				msg = "access tokens are not accepted: send an API key in the X-API-Key header"
			}
			wire.WriteError(w, http.StatusUnauthorized, msg)
			return
		case len(keys) > 1:
			wire.WriteError(w, http.StatusUnauthorized, "more than one X-API-Key header")
			return
		}
		team, err := store.Team(r.Context(), strings.TrimSpace(keys[0]))
		switch {
		case errors.Is(err, ErrUnknownKey):
			wire.WriteError(w, http.StatusUnauthorized, "invalid API key")
			return
		case err != nil:
			slog.ErrorContext(r.Context(), "authenticate request", "error", err)
			wire.WriteError(w, http.StatusInternalServerError, "cannot check the API key right now")
			return
		}
		r = r.WithContext(WithTeam(r.Context(), team))
		r.Header = r.Header.Clone()
		r.Header.Del(HeaderAPIKey)
		next.ServeHTTP(w, r)
	})
}
