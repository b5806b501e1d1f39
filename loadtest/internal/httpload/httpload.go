// Package httpload drives the redirect service over HTTP: it creates the
// run's links through the owner API, then sends GET /:code at a constant
// arrival rate with vegeta and records every answer.
//
// The arrival rate is open: vegeta starts requests on schedule and adds
// workers when answers are slow, so a slow service does not lower the load
// it is offered (no coordinated omission). Redirects are not followed: a
// 302 is the answer being measured.
//
// Each request is click seq = vegeta's sequence number. A transport wrapper
// reads the number from the X-Vegeta-Seq header vegeta sets and dresses the
// request as workload.Visit(seq) says: link, user agent, referrer, country
// header, X-Forwarded-For, and X-Request-ID = the run's request ID for seq,
// which the redirect copies into the click. So every result, a timeout
// included, maps back to exactly one click of the truth.
package httpload

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/snipdev/snip/loadtest/internal/series"
	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
)

// Config is one HTTP run.
type Config struct {
	// Base is the redirect service's base URL, e.g. http://127.0.0.1:8080.
	Base string
	// Rate is requests per second; Duration how long to send.
	Rate     int
	Duration time.Duration
	// Timeout bounds one request (default 10s).
	Timeout time.Duration
	// MaxConns bounds connections to the service (0: unbounded).
	MaxConns int
	// ForwardedFor sends each visit's address in X-Forwarded-For. The
	// redirect believes it only from a trusted proxy (SNIP_TRUSTED_PROXIES);
	// otherwise every click comes from the generator's own address.
	ForwardedFor bool
	// CountryHeader is the header carrying the country (X-Country or
	// CF-IPCountry).
	CountryHeader string
	Tag           workload.Tag
	Gen           *workload.Generator
}

func (c *Config) defaults() error {
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.CountryHeader == "" {
		c.CountryHeader = "X-Country"
	}
	switch {
	case c.Rate < 1:
		return fmt.Errorf("rate %d: want >= 1", c.Rate)
	case c.Duration <= 0:
		return fmt.Errorf("duration %s: want > 0", c.Duration)
	case c.Gen == nil:
		return errors.New("no workload generator")
	}
	if _, err := http.NewRequest(http.MethodGet, c.Base, nil); err != nil {
		return fmt.Errorf("base url %q: %w", c.Base, err)
	}
	return nil
}

// newTransport is the HTTP transport of the generator: keep-alive
// connections, many of them, and no proxy from the environment.
func newTransport(maxConns int) *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: 10_000,
		MaxConnsPerHost:     maxConns,
		IdleConnTimeout:     90 * time.Second,
	}
}

// visitTransport dresses each request as its visit.
type visitTransport struct {
	base http.RoundTripper
	cfg  *Config
	m    *series.Meter
	// unnumbered counts requests without a sequence (never, with vegeta).
	unnumbered atomic.Uint64
}

func (t *visitTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	seq, err := strconv.ParseUint(req.Header.Get("X-Vegeta-Seq"), 10, 64)
	if err != nil {
		t.unnumbered.Add(1)
		return nil, fmt.Errorf("request without X-Vegeta-Seq: %w", err)
	}
	v := t.cfg.Gen.Visit(seq)
	r := req.Clone(req.Context()) // a RoundTripper must not change its argument
	r.URL.Path = "/" + t.cfg.Tag.LinkCode(v.Link)
	h := r.Header
	h.Del("X-Vegeta-Seq")
	h.Del("X-Vegeta-Attack")
	h.Set("User-Agent", v.UserAgent)
	h.Set("X-Request-Id", t.cfg.Tag.RequestID(seq))
	if v.Referrer != "" {
		h.Set("Referer", v.Referrer)
	}
	if v.Country != "" {
		h.Set(t.cfg.CountryHeader, v.Country)
	}
	if t.cfg.ForwardedFor {
		h.Set("X-Forwarded-For", v.IP.String())
	}
	t.m.Sent()
	return t.base.RoundTrip(r)
}

// Run sends cfg.Rate requests a second for cfg.Duration (or until ctx
// ends), records each click's outcome in rec and each answer in m, and
// returns the number of requests made.
func Run(ctx context.Context, cfg Config, rec *truth.Recorder, m *series.Meter) (uint64, error) {
	if err := cfg.defaults(); err != nil {
		return 0, fmt.Errorf("http load: %w", err)
	}
	tr := &visitTransport{base: newTransport(cfg.MaxConns), cfg: &cfg, m: m}
	atk := vegeta.NewAttacker(
		vegeta.Client(&http.Client{Transport: tr}),
		vegeta.Redirects(vegeta.NoFollow),
		vegeta.Timeout(cfg.Timeout),
		vegeta.MaxBody(0),
		vegeta.Workers(64),
	)
	target := vegeta.Target{Method: http.MethodGet, URL: strings.TrimSuffix(cfg.Base, "/") + "/"}
	targeter := func(t *vegeta.Target) error { *t = target; return nil }
	pacer := vegeta.ConstantPacer{Freq: cfg.Rate, Per: time.Second}

	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stop()
	var attempts uint64
	// The schedule offers load for Duration; the answers to its last
	// requests are waited for after it, up to Timeout, offering nothing.
	began := time.Now()
	m.Offer(began, began.Add(cfg.Duration))
	for res := range atk.Attack(targeter, pacer, cfg.Duration, "snip") {
		attempts = max(attempts, res.Seq+1)
		o, answer := Classify(res.Code, res.Headers, res.Error)
		rec.Record(res.Seq, o, answer)
		m.Done(res.Latency, o == truth.Sent)
		if o == truth.Sent && cfg.Gen.Visit(res.Seq).Kind == workload.Probe {
			m.ProbeSent(res.End())
		}
	}
	if n := tr.unnumbered.Load(); n > 0 {
		return attempts, fmt.Errorf("http load: %d requests had no sequence number", n)
	}
	return attempts, nil
}

// ClickHeader is the redirect's answer header that marks a 503 whose click
// was sent to JetStream and never acknowledged (services/redirect's
// httpapi.ClickHeader): it may be recorded.
const ClickHeader = "Snip-Click"

// Classify maps an answer to a click outcome. A 302 recorded the click.
// 4xx and 503 say it was not recorded (503 is the redirect's "click not
// recorded", "outbox full" or "storage unavailable"), except a 503 marked
// "Snip-Click: unconfirmed" (click_unconfirmed: JetStream may have it).
// Anything else (no answer, a 500, a 200) leaves it open.
func Classify(code uint16, header http.Header, errText string) (truth.Outcome, string) {
	switch {
	case code == http.StatusFound:
		return truth.Sent, "302"
	case code == 0:
		return truth.Uncertain, errorClass(errText)
	case code == http.StatusServiceUnavailable && header.Get(ClickHeader) == "unconfirmed":
		return truth.Uncertain, "503 unconfirmed"
	case code == http.StatusServiceUnavailable, code >= 400 && code < 500:
		return truth.Refused, strconv.Itoa(int(code))
	}
	return truth.Uncertain, strconv.Itoa(int(code))
}

// errorClass shortens a transport error to a label for the answer counts.
func errorClass(e string) string {
	switch {
	case strings.Contains(e, "Client.Timeout"), strings.Contains(e, "deadline exceeded"), strings.Contains(e, "timeout"):
		return "timeout"
	case strings.Contains(e, "connection refused"):
		return "connection refused"
	case strings.Contains(e, "connection reset"), strings.Contains(e, "EOF"), strings.Contains(e, "broken pipe"):
		return "connection reset"
	case strings.Contains(e, "too many open files"):
		return "out of file descriptors"
	}
	return "transport error"
}

// CreateLinks creates link i of the run as code tag.LinkCode(i) for every
// i < n, through POST /api/links with the owner's key, 16 at a time, each
// pointing at linkBase/<code> (by default a page of `make demo`'s local
// site: the preview workers fetch every new link's target). It returns the
// owner ID the API reports.
func CreateLinks(ctx context.Context, base, key, linkBase string, tag workload.Tag, n int) (string, error) {
	client := &http.Client{Timeout: 30 * time.Second, Transport: newTransport(16)}
	var (
		mu    sync.Mutex
		owner string
		first error
		next  atomic.Int64
		wg    sync.WaitGroup
	)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				o, err := createLink(ctx, client, base, key, tag.LinkCode(i), LinkTarget(linkBase, tag.LinkCode(i)))
				mu.Lock()
				if err != nil && first == nil {
					first = err
					next.Store(int64(n)) // stop the others
				}
				if owner == "" {
					owner = o
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return "", fmt.Errorf("create links: %w", first)
	}
	if ctx.Err() != nil {
		return "", fmt.Errorf("create links: %w", ctx.Err())
	}
	return owner, nil
}

// LinkTarget is where link code of a run points: linkBase/code.
func LinkTarget(linkBase, code string) string {
	return strings.TrimSuffix(linkBase, "/") + "/" + code
}

func createLink(ctx context.Context, client *http.Client, base, key, code, target string) (string, error) {
	body, _ := json.Marshal(map[string]string{"target": target, "code": code})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+"/api/links", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("create %s: %w", code, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("create %s: %s: %s", code, resp.Status, bytes.TrimSpace(b))
	}
	var l struct {
		Code  string `json:"code"`
		Owner string `json:"owner"`
	}
	if err := json.Unmarshal(b, &l); err != nil || l.Code != code {
		return "", fmt.Errorf("create %s: unexpected answer %s", code, bytes.TrimSpace(b))
	}
	return l.Owner, nil
}
