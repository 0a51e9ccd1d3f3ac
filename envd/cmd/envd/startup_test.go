package main

import (
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// BenchmarkStartupToHealth is the time from starting envd to its first 204
// on /health, as a plain child and as PID 1 of a new pid namespace, with and
// without --init: what being init costs at startup.
func BenchmarkStartupToHealth(b *testing.B) {
	for _, bc := range []struct {
		name  string
		pidns bool
		args  []string
	}{
		{"child", false, nil},
		{"child-init", false, []string{"--init"}},
		{"pid1-noinit", true, []string{"--init=false"}},
		{"pid1-init", true, nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			for b.Loop() {
				b.StopTimer()
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				port := ln.Addr().(*net.TCPAddr).Port
				_ = ln.Close()
				cmd := exec.Command(envdBin, append([]string{"--listen-address", "127.0.0.1", "--port", strconv.Itoa(port)}, bc.args...)...)
				cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
				if bc.pidns {
					cmd.SysProcAttr = newPIDNamespace()
				}
				url := "http://127.0.0.1:" + strconv.Itoa(port) + "/health"
				b.StartTimer()
				if err := cmd.Start(); err != nil {
					b.Skipf("start: %v", err)
				}
				deadline := time.Now().Add(10 * time.Second)
				for {
					resp, err := client.Get(url)
					if err == nil {
						_ = resp.Body.Close()
						if resp.StatusCode == http.StatusNoContent {
							break
						}
					}
					if time.Now().After(deadline) {
						_ = cmd.Process.Kill()
						_ = cmd.Wait()
						b.Fatal("envd did not answer /health")
					}
					time.Sleep(100 * time.Microsecond)
				}
				b.StopTimer()
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				b.StartTimer()
			}
		})
	}
}
