// Package exeseal provides mechanisms for sealing /proc/self/exe and thus
// protecting the runc binary against CVE-2019-5736-style attacks.
package exeseal
