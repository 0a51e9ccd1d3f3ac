package system_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/e2e/internal/systemtest"
)

// make up admits sandboxes by the memory they reserve, not the CPUs they
// may use: more default sandboxes (2 vCPU each) run at once than the
// machine has cores times 8 over 2, the limit when CPU was reserved at
// make up's old overcommit of 8.
func TestMoreDefaultSandboxesThanCores(t *testing.T) {
	sys := systemtest.Start(t, "team-a")
	n := runtime.NumCPU()*8/2 + 4
	// Not t.Context(): the kills run in Cleanup, after it ends.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	api := newAPIClient(sys.Keys["team-a"])
	call := func(method, url string, body any) (int, []byte, error) {
		return api.call(ctx, method, url, body, nil)
	}

	// Four at a time, paced under the team's 5 creates a second.
	ids := make(chan string, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := range n {
		time.Sleep(250 * time.Millisecond)
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			code, body, err := call(http.MethodPost, sys.APIURL+"/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 600})
			var sb struct{ SandboxID string }
			if err == nil && code == http.StatusCreated {
				err = json.Unmarshal(body, &sb)
			} else if err == nil {
				err = fmt.Errorf("create %d: %d %s", i, code, body)
			}
			if err != nil {
				errs <- err
				return
			}
			ids <- sb.SandboxID
		})
	}
	wg.Wait()
	close(ids)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var created []string
	for id := range ids {
		created = append(created, id)
	}
	defer func() {
		for _, id := range created {
			if code, body, err := call(http.MethodDelete, sys.APIURL+"/sandboxes/"+id, nil); err != nil || code != http.StatusNoContent {
				t.Errorf("kill %s: %d %s %v", id, code, body, err)
			}
		}
	}()
	code, body, err := call(http.MethodGet, sys.APIURL+"/v2/sandboxes?state=running&limit=100", nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("list: %d %s %v", code, body, err)
	}
	var list []struct {
		SandboxID string
		CPUCount  int
	}
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	if len(created) != n || len(list) != n {
		t.Fatalf("%d of %d default sandboxes created, %d running, on %d CPUs", len(created), n, len(list), runtime.NumCPU())
	}
	for _, sb := range list {
		if sb.CPUCount != 2 {
			t.Errorf("%s: cpuCount %d, want e2b's default 2 (its limit)", sb.SandboxID, sb.CPUCount)
		}
	}
	t.Logf("%d default sandboxes of 2 vCPU running on %d CPUs", n, runtime.NumCPU())
}
