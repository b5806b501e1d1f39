// Package counterhttp reads the click counter through its public stats API,
// GET /api/links/:code/stats with the owner's Bearer key, as any owner
// would: the oracle checks what users see, not the counter's Redis keys.
package counterhttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/snipdev/snip/loadtest/internal/oracle"
)

// Client reads link stats from the click counter.
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

// pair is a human and a bot count as the stats API writes them.
type pair struct {
	Human *int64 `json:"human"`
	Bot   *int64 `json:"bot"`
}

// dimension is one entry of top_countries or top_referrers.
type dimension struct {
	Name string `json:"name"`
	pair
}

// stats is the part of the stats answer the oracle reads.
type stats struct {
	Totals       pair        `json:"totals"`
	TopCountries []dimension `json:"top_countries"`
	TopReferrers []dimension `json:"top_referrers"`
}

// Totals returns a link's human and bot totals (0 and 0 for a link the
// counter has not counted a click of): the probe poller's question.
func (c *Client) Totals(ctx context.Context, code string) (int64, int64, error) {
	s, err := c.get(ctx, code, 1)
	if err != nil {
		return 0, 0, err
	}
	return s.Totals.Human, s.Totals.Bot, nil
}

// Stats implements oracle.CounterReader: the totals and the counts by
// country and referrer, up to oracle.TopDimensions of each. A 404 is a
// link the counter has not counted a click of (or does not know).
func (c *Client) Stats(ctx context.Context, code string) (oracle.LinkStats, error) {
	return c.get(ctx, code, oracle.TopDimensions)
}

func (c *Client) get(ctx context.Context, code string, top int) (oracle.LinkStats, error) {
	var out oracle.LinkStats
	// The smallest series: the totals and the dimensions are the same for
	// any range.
	u := c.base + "/api/links/" + url.PathEscape(code) + "/stats?hours=1&days=1&top=" + strconv.Itoa(top)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return out, fmt.Errorf("counter stats %s: %w", code, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := c.http.Do(req)
	if err != nil {
		return out, fmt.Errorf("counter stats %s: %w", code, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return out, fmt.Errorf("counter stats %s: %w", code, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return out, nil
	default:
		return out, fmt.Errorf("counter stats %s: %s: %s", code, resp.Status, strings.TrimSpace(string(body)))
	}
	var s stats
	if err := json.Unmarshal(body, &s); err != nil {
		return out, fmt.Errorf("counter stats %s: %w", code, err)
	}
	if out.Totals, err = s.Totals.value(); err != nil {
		return out, fmt.Errorf("counter stats %s: totals: %w in %.200s", code, err, body)
	}
	if out.Countries, err = dimensions(s.TopCountries); err != nil {
		return out, fmt.Errorf("counter stats %s: top_countries: %w", code, err)
	}
	if out.Referrers, err = dimensions(s.TopReferrers); err != nil {
		return out, fmt.Errorf("counter stats %s: top_referrers: %w", code, err)
	}
	return out, nil
}

func (p pair) value() (oracle.Pair, error) {
	if p.Human == nil || p.Bot == nil {
		return oracle.Pair{}, errors.New("no human or no bot count")
	}
	return oracle.Pair{Human: *p.Human, Bot: *p.Bot}, nil
}

// dimensions turns a top list into counts by name; a name listed twice is
// an error, not a sum.
func dimensions(list []dimension) (map[string]oracle.Pair, error) {
	out := make(map[string]oracle.Pair, len(list))
	for _, d := range list {
		p, err := d.value()
		if err != nil {
			return nil, fmt.Errorf("%q: %w", d.Name, err)
		}
		if _, dup := out[d.Name]; dup {
			return nil, fmt.Errorf("%q listed twice", d.Name)
		}
		out[d.Name] = p
	}
	return out, nil
}
