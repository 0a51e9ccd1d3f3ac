// Package sandboxdapi is the contract between sandboxd and its clients (the
// apiserver, vk-sandbox, the warm-pool driver): the Connect service in
// proto/skiff/sandboxd/v1, generated into gen/.
package sandboxdapi

//go:generate ../../bin/buf lint
//go:generate ../../bin/buf generate
