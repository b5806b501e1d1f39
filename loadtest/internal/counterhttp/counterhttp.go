// Package counterhttp reads the click counter through its public stats API,
// GET /api/links/:code/stats with the owner's Bearer key, as any owner
// would: the oracle checks what users see, not the counter's Redis keys.
package counterhttp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client reads link totals from the click counter.
type Client struct {
	base string
	key  string
	http *http.Client
}

// New returns a client for the counter at base (e.g. http://127.0.0.1:8081)
// that authenticates with key.
func New(base, key string) *Client {
	return &Client{base: strings.TrimSuffix(base, "/"), key: key, http: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 16},
	}}
}

// stats is the part of the stats answer the oracle reads.
type stats struct {
	Totals struct {
		Human *int64 `json:"human"`
		Bot   *int64 `json:"bot"`
	} `json:"totals"`
}

// Totals implements oracle.CounterReader. A 404 is a link the counter has
// not counted a click of (or does not know): 0 and 0.
func (c *Client) Totals(ctx context.Context, code string) (int64, int64, error) {
	// The smallest range: the totals are the same for any range.
	u := c.base + "/api/links/" + url.PathEscape(code) + "/stats?hours=1&days=1&top=1"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("counter stats %s: %w", code, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("counter stats %s: %w", code, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, 0, fmt.Errorf("counter stats %s: %w", code, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return 0, 0, nil
	default:
		return 0, 0, fmt.Errorf("counter stats %s: %s: %s", code, resp.Status, strings.TrimSpace(string(body)))
	}
	var s stats
	if err := json.Unmarshal(body, &s); err != nil {
		return 0, 0, fmt.Errorf("counter stats %s: %w", code, err)
	}
	if s.Totals.Human == nil || s.Totals.Bot == nil {
		return 0, 0, fmt.Errorf("counter stats %s: no totals.human / totals.bot in %.200s", code, body)
	}
	return *s.Totals.Human, *s.Totals.Bot, nil
}
