package system_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"
)

// apiClient calls a system's e2b API (and, through its proxy, envd) with
// one team's key.
type apiClient struct {
	key    string
	client *http.Client
}

func newAPIClient(key string) apiClient {
	return apiClient{key: key, client: &http.Client{Timeout: 60 * time.Second}}
}

// call sends body as JSON (none if nil) with the key and header, and
// returns the status and body of the answer.
func (a apiClient) call(ctx context.Context, method, url string, body any, header map[string]string) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("X-API-Key", a.key)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}
