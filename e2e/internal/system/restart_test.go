package system_test

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/e2e/internal/systemtest"
)

// When sandboxd dies (kill -9), make up's supervisor starts it again and
// keeps its nftables table: the sandbox that ran before is re-adopted,
// isolated all along, and reachable again through the API and the proxy.
func TestSandboxdIsRestartedNotTornDown(t *testing.T) {
	sys := systemtest.Start(t, "team-a")
	key, table := sys.Keys["team-a"], sys.Config().NFTTable
	api := newAPIClient(key)
	call := func(method, url string, body any, header map[string]string) (int, []byte) {
		t.Helper()
		code, b, err := api.call(t.Context(), method, url, body, header)
		if err != nil {
			return 0, []byte(err.Error())
		}
		return code, b
	}
	tableThere := func() bool {
		return exec.Command("nft", "list", "table", "inet", table).Run() == nil
	}

	code, body := call(http.MethodPost, sys.APIURL+"/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 300}, nil)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var sb struct{ SandboxID string }
	if err := json.Unmarshal(body, &sb); err != nil {
		t.Fatal(err)
	}

	pid := sys.PID("sandboxd")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute) // a hang fails; a restart takes seconds
	for sys.Restarts("sandboxd") == 0 {
		if !tableThere() {
			t.Fatalf("nftables table %s is gone while sandboxd is down", table)
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxd (pid %d) was not restarted; its log ends:\n%s", pid, sys.LogTail("sandboxd", 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if sys.PID("sandboxd") == pid {
		t.Fatalf("sandboxd kept pid %d", pid)
	}
	// The apiserver follows the new sandboxd, which re-adopted the
	// sandbox; envd answers through the proxy and sandboxd's relay.
	envd := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983"}
	for {
		code, body = call(http.MethodGet, sys.APIURL+"/sandboxes/"+sb.SandboxID, nil, nil)
		var info struct{ State string }
		_ = json.Unmarshal(body, &info)
		health, _ := call(http.MethodGet, sys.SandboxURL+"/health", nil, envd)
		if code == http.StatusOK && info.State == "running" && health == http.StatusNoContent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart: GET /sandboxes/%s = %d %s, envd /health through the proxy = %d; sandboxd's log ends:\n%s",
				sb.SandboxID, code, body, health, sys.LogTail("sandboxd", 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !tableThere() {
		t.Fatalf("nftables table %s is gone after the restart", table)
	}
}
