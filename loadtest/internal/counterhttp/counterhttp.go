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

// hour is one entry of the hourly series.
type hour struct {
	Hour *time.Time `json:"hour"`
	pair
}

// day is one entry of the daily series.
type day struct {
	Day     string `json:"day"`
	Uniques *int64 `json:"uniques"`
	pair
}

// stats is the part of the stats answer the oracle reads.
type stats struct {
	Totals       pair        `json:"totals"`
	TopCountries []dimension `json:"top_countries"`
	TopReferrers []dimension `json:"top_referrers"`
	Hourly       []hour      `json:"hourly"`
	Daily        []day       `json:"daily"`
}

// Totals returns a link's human and bot totals (0 and 0 for a link the
// counter has not counted a click of): the probe poller's question.
func (c *Client) Totals(ctx context.Context, code string) (int64, int64, error) {
	s, err := c.get(ctx, code, oracle.Span{Hours: 1, Days: 1}, 1)
	if err != nil {
		return 0, 0, err
	}
	return s.Totals.Human, s.Totals.Bot, nil
}

// Stats implements oracle.CounterReader: the totals, the counts by country
// and referrer, up to oracle.TopDimensions of each, and the hourly and
// daily series of span. A 404 is a link the counter has not counted a
// click of (or does not know).
func (c *Client) Stats(ctx context.Context, code string, span oracle.Span) (oracle.LinkStats, error) {
	return c.get(ctx, code, span, oracle.TopDimensions)
}

func (c *Client) get(ctx context.Context, code string, span oracle.Span, top int) (oracle.LinkStats, error) {
	var out oracle.LinkStats
	q := url.Values{"hours": {strconv.Itoa(span.Hours)}, "days": {strconv.Itoa(span.Days)}, "top": {strconv.Itoa(top)}}
	u := c.base + "/api/links/" + url.PathEscape(code) + "/stats?" + q.Encode()
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
	if out.Hourly, err = hourly(s.Hourly); err != nil {
		return out, fmt.Errorf("counter stats %s: hourly: %w", code, err)
	}
	if out.Daily, err = daily(s.Daily); err != nil {
		return out, fmt.Errorf("counter stats %s: daily: %w", code, err)
	}
	return out, nil
}

// hourly turns the hourly series into counts by hour; an hour that is not
// one (minutes set) or comes again is an error.
func hourly(list []hour) ([]oracle.HourCount, error) {
	out := make([]oracle.HourCount, 0, len(list))
	seen := make(map[time.Time]bool, len(list))
	for i, h := range list {
		if h.Hour == nil {
			return nil, fmt.Errorf("entry %d: no hour", i)
		}
		t := h.Hour.UTC()
		if !t.Truncate(time.Hour).Equal(t) || seen[t] {
			return nil, fmt.Errorf("entry %d: hour %s not the start of an hour, or listed twice", i, t.Format(time.RFC3339))
		}
		seen[t] = true
		p, err := h.value()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.Format(time.RFC3339), err)
		}
		out = append(out, oracle.HourCount{Hour: t, Pair: p})
	}
	return out, nil
}

// daily turns the daily series into counts by day; a day that is not a
// date or comes again, or has no uniques, is an error.
func daily(list []day) ([]oracle.DayCount, error) {
	out := make([]oracle.DayCount, 0, len(list))
	seen := make(map[time.Time]bool, len(list))
	for i, d := range list {
		t, err := time.Parse(time.DateOnly, d.Day)
		if err != nil || seen[t] {
			return nil, fmt.Errorf("entry %d: day %q not a date, or listed twice", i, d.Day)
		}
		seen[t] = true
		p, err := d.value()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d.Day, err)
		}
		if d.Uniques == nil {
			return nil, fmt.Errorf("%s: no uniques", d.Day)
		}
		out = append(out, oracle.DayCount{Day: t, Pair: p, Uniques: *d.Uniques})
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
