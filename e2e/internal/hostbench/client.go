// Package hostbench measures one sandbox host as the e2b SDK meets it,
// through the whole system of make up (internal/system): how many idle
// sandboxes it holds and what each costs (Density), and how fast and at
// what CPU cost sandboxes start, run a command and end (Lifecycle),
// beside the cheapest start the kernel allows (Floor). Results go to a
// Recorder as JSON lines, which cmd/skiff-plot draws.
package hostbench

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"

	"fmt"
	"io"
	"net/http"
	"time"
)

// client calls the e2b API and, through the envd proxy, envd, as the SDK
// does.
type client struct {
	api, proxy, key string
	http            *http.Client
}

func newClient(api, proxy, key string) *client {
	return &client{api: api, proxy: proxy, key: key, http: &http.Client{
		Timeout:   2 * time.Minute,
		Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0, DisableCompression: true},
	}}
}

type sandbox struct{ id, token string }

// create makes a sandbox of template and returns it with the time the
// API took.
func (c *client) create(ctx context.Context, template string) (sandbox, time.Duration, error) {
	body, _ := json.Marshal(map[string]any{"templateID": template, "timeout": 3600})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.api+"/sandboxes", bytes.NewReader(body))
	if err != nil {
		return sandbox{}, 0, err
	}
	req.Header.Set("X-API-Key", c.key)
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return sandbox{}, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	took := time.Since(t0)
	if err != nil {
		return sandbox{}, took, err
	}
	if resp.StatusCode != http.StatusCreated {
		return sandbox{}, took, fmt.Errorf("create: %d %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	var out struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal(b, &out); err != nil {
		return sandbox{}, took, err
	}
	return sandbox{out.SandboxID, out.EnvdAccessToken}, took, nil
}

// kill ends a sandbox.
func (c *client) kill(ctx context.Context, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, c.api+"/sandboxes/"+id, nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", c.key)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("kill %s: %d %s", id, resp.StatusCode, bytes.TrimSpace(b))
	}
	return nil
}

// run runs cmd args as user in the sandbox through the proxy (envd's
// process.Process/Start, a Connect server stream, as commands.run does)
// and waits for it to end; it fails unless it exits 0.
func (c *client) run(ctx context.Context, sb sandbox, cmd string, args ...string) error {
	msg, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": cmd, "args": args}, "stdin": false})
	var body bytes.Buffer
	body.WriteByte(0)
	_ = binary.Write(&body, binary.BigEndian, uint32(len(msg)))
	body.Write(msg)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.proxy+"/process.Process/Start", &body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("E2b-Sandbox-Id", sb.id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", sb.token)
	req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("user:")))
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("process start: %d %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	for {
		var head [5]byte
		if _, err := io.ReadFull(resp.Body, head[:]); err != nil {
			return fmt.Errorf("process stream ended without its end event: %w", err)
		}
		frame := make([]byte, binary.BigEndian.Uint32(head[1:]))
		if _, err := io.ReadFull(resp.Body, frame); err != nil {
			return err
		}
		if head[0]&2 != 0 { // end of stream: an error, or none
			return fmt.Errorf("process stream ended without its end event: %s", frame)
		}
		var ev struct {
			Event struct {
				End *struct {
					ExitCode int
					Exited   bool
					Status   string
				}
			}
		}
		if err := json.Unmarshal(frame, &ev); err != nil {
			return err
		}
		if e := ev.Event.End; e != nil {
			if !e.Exited || e.ExitCode != 0 {
				return fmt.Errorf("process ended: %s (code %d)", e.Status, e.ExitCode)
			}
			return nil
		}
	}
}
