// Package shared is the root of the module of libraries that two or more Skiff
// binaries use. It imports no binary's module, only api.
package shared
