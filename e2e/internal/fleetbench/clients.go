package fleetbench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	sbv1 "github.com/skiff-dev/skiff/api/sandbox/v1beta1"
	"github.com/skiff-dev/skiff/e2e/internal/fleetenv"
	"github.com/skiff-dev/skiff/e2e/internal/fleetsim"
)

var (
	sandboxesGVR = sbv1.GroupVersion.WithResource("sandboxes")
	proxyHealth  = fleetenv.ProxyHealthBody
	randIntN     = rand.IntN
)

// e2b makes a call of the e2b API as the timed team, decoding a JSON
// answer into out when out is set; it returns the status and the body.
func (b *bench) e2b(ctx context.Context, method, path, body string, out any) (int, []byte, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.apiURL+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("X-API-Key", b.key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := b.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, data, fmt.Errorf("decode %s %s: %w", method, path, err)
		}
	}
	return resp.StatusCode, data, nil
}

// e2bCount lists the first page of the timed team's sandboxes (100), or
// with node set the first of them on that node (by their metadata,
// fleetsim.HostKey), and returns how many the page has.
func (b *bench) e2bCount(ctx context.Context, node string) (int, error) {
	q := url.Values{"limit": {"100"}}
	if node != "" {
		q = url.Values{"limit": {"1"}, "metadata": {fleetsim.HostKey + "=" + node}}
	}
	var page []json.RawMessage
	code, body, err := b.e2b(ctx, http.MethodGet, "/v2/sandboxes?"+q.Encode(), "", &page)
	if err != nil {
		return 0, err
	}
	if code != http.StatusOK {
		return 0, fmt.Errorf("e2b list: %d %s", code, body)
	}
	return len(page), nil
}

// kubePage lists a page of limit sandboxes of every team through the
// aggregator (as kubectl get sandboxes -A does), of node only when set,
// and returns how many the page has.
func (b *bench) kubePage(ctx context.Context, limit int64, node string) (int, error) {
	opts := metav1.ListOptions{Limit: limit}
	if node != "" {
		opts.FieldSelector = fields.OneTermEqualSelector(sbv1.FieldNodeName, node).String()
	}
	list, err := b.dyn.Resource(sandboxesGVR).List(ctx, opts)
	if err != nil {
		return 0, err
	}
	return len(list.Items), nil
}

// kubeCount counts the sandboxes the aggregated API lists (of node only
// when set) with one request: a page of one and the count of the rest.
func (b *bench) kubeCount(ctx context.Context, node string) (int, error) {
	opts := metav1.ListOptions{Limit: 1}
	if node != "" {
		opts.FieldSelector = fields.OneTermEqualSelector(sbv1.FieldNodeName, node).String()
	}
	list, err := b.dyn.Resource(sandboxesGVR).List(ctx, opts)
	if err != nil {
		return 0, err
	}
	n := len(list.Items)
	if rest := list.GetRemainingItemCount(); rest != nil {
		n += int(*rest)
	}
	return n, nil
}
