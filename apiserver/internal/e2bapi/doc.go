// Package e2bapi serves e2b's REST control API (the routes of
// docs/e2b-protocol.md §1) so that an unmodified e2b SDK pointed at Skiff
// with E2B_API_URL creates, lists, connects to, pauses and kills sandboxes.
//
// The package owns the wire: routing, authentication hand-off, strict
// decoding and validation of bodies and queries, the exact success codes
// and JSON schemas the SDKs parse (Python parses a body only on the
// documented success code), e2b's error shape {"code","message"}, list
// filtering and pagination. Everything that touches a host goes through
// Backend, a narrow interface the caller implements; nothing reaches it
// before a request has passed validation.
//
// Routes Skiff does not support yet answer 501 in e2b's error shape, never
// a fake success; docs/e2b-compat.md lists every route and its status.
package e2bapi
