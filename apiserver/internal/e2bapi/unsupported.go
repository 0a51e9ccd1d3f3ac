package e2bapi

import "net/http"

// unsupportedRoute is an e2b route Skiff does not implement yet.
type unsupportedRoute struct {
	Pattern string
	// What names the feature in the 501 message.
	What string
}

// unsupportedRoutes answer 501 in e2b's error shape, never a fake success.
// docs/e2b-compat.md lists them; TestUnsupportedRoutes keeps the two in
// step.
var unsupportedRoutes = []unsupportedRoute{
	{"POST /templates", "template builds"},
	{"POST /v2/templates", "template builds"},
	{"POST /v3/templates", "template builds"},
	{"POST /templates/{templateID}", "template builds"},
	{"PATCH /templates/{templateID}", "template updates"},
	{"PATCH /v2/templates/{templateID}", "template updates"},
	{"GET /templates/{templateID}/files/{hash}", "template builds"},
	{"POST /templates/{templateID}/builds/{buildID}", "template builds"},
	{"POST /v2/templates/{templateID}/builds/{buildID}", "template builds"},
	{"GET /templates/{templateID}/builds/{buildID}/status", "template builds"},
	{"GET /templates/{templateID}/builds/{buildID}/logs", "template builds"},
	{"POST /templates/tags", "template tags"},
	{"DELETE /templates/tags", "template tags"},
	{templateTagsPattern, "template tags"},

	{"GET /teams", "teams (a team is a Kubernetes namespace)"},
	{"GET /teams/{teamID}/metrics", "team metrics"},
	{"GET /teams/{teamID}/metrics/max", "team metrics"},
	{"GET /api-keys", "managing API keys over e2b's API (keys are Secrets)"},
	{"POST /api-keys", "managing API keys over e2b's API (keys are Secrets)"},
	{"PATCH /api-keys/{apiKeyID}", "managing API keys over e2b's API (keys are Secrets)"},
	{"DELETE /api-keys/{apiKeyID}", "managing API keys over e2b's API (keys are Secrets)"},
	{"POST /access-tokens", "access tokens"},
	{"DELETE /access-tokens/{accessTokenID}", "access tokens"},
}

// volumeRoutesUnsupported answer 501 when the server has no key to sign
// volume tokens with (Config.VolumeKey).
var volumeRoutesUnsupported = []unsupportedRoute{
	{"GET /volumes", "volumes (this apiserver has no node token to sign volume tokens with)"},
	{"POST /volumes", "volumes (this apiserver has no node token to sign volume tokens with)"},
	{"GET /volumes/{volumeID}", "volumes (this apiserver has no node token to sign volume tokens with)"},
	{"DELETE /volumes/{volumeID}", "volumes (this apiserver has no node token to sign volume tokens with)"},
}

// templateTagsPattern is served by templateSub (see routes).
const templateTagsPattern = "GET /templates/{templateID}/tags"

func notImplemented(u unsupportedRoute) teamHandler {
	return func(w http.ResponseWriter, r *http.Request, _ string) {
		writeError(w, http.StatusNotImplemented, "", "%s (%s) is not supported by Skiff yet", u.Pattern, u.What)
	}
}
