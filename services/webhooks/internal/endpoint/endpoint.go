// Package endpoint is an owner's webhook endpoint: where events go, which
// ones, how they are batched and signed, and whether it is paused or
// disabled. It validates what owners send and makes secrets.
package endpoint

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/snipdev/snip/pkg/events"
)

// Event types an endpoint can subscribe to.
const (
	// TypeClick is a click on one of the owner's links (events.Click).
	TypeClick = "click"
	// TypeFraudAlert is a fraud alert on one of the owner's links (events.FraudAlert).
	TypeFraudAlert = "fraud_alert"
	// TypeTest is a test event sent on the owner's request; every endpoint gets it.
	TypeTest = "test"
)

// Expected failures.
var (
	// ErrInvalid: the owner's request cannot be accepted (bad URL, unknown
	// event type, out-of-range batch settings). The message says which.
	ErrInvalid = errors.New("invalid endpoint")
	// ErrNotFound: no such endpoint for this owner.
	ErrNotFound = errors.New("endpoint not found")
)

// Limits on what an owner may configure.
const (
	MaxBatchEvents = 1000
	MaxBatchWait   = 60 * time.Second
	MaxLinkFilter  = 100
	MaxURLLen      = 2048
)

// Endpoint is an owner's webhook endpoint.
type Endpoint struct {
	ID    string `json:"id"`
	Owner string `json:"owner"`
	URL   string `json:"url"`
	// Types are the event types sent (TypeClick, TypeFraudAlert).
	Types []string `json:"event_types"`
	// Links, when not empty, limits events to these link codes.
	Links []string `json:"links,omitempty"`
	// BatchMax is the most events in one POST (1: one event per POST).
	BatchMax int `json:"batch_max"`
	// BatchWait is the longest an event waits for a batch to fill.
	BatchWait time.Duration `json:"batch_wait"`
	// Secret signs every delivery; OldSecret also signs until
	// OldSecretUntil, so receivers can switch during the overlap.
	Secret         string    `json:"secret"`
	OldSecret      string    `json:"old_secret,omitempty"`
	OldSecretUntil time.Time `json:"old_secret_until,omitzero"`
	// Paused endpoints keep queueing (bounded) but nothing is sent.
	Paused bool `json:"paused"`
	// DisabledAt is set when deliveries failed for longer than the
	// configured time; nothing is queued or sent until it is resumed.
	DisabledAt     time.Time `json:"disabled_at,omitzero"`
	DisabledReason string    `json:"disabled_reason,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	// ReplayClicksUpto and ReplayAlertsUpto are the stream sequences a
	// replay copied up to: live intake skips events at or below them, so a
	// replay and live traffic do not both queue the same event. Creating an
	// endpoint, and resuming a disabled one, sets ReplayClicksUpto to
	// CLICKS' last sequence then: the group's consumers may not have passed
	// older clicks of the owner (they were not sent them while nothing
	// wanted them), and the endpoint gets what is stored after.
	ReplayClicksUpto uint64 `json:"replay_clicks_upto,omitempty"`
	ReplayAlertsUpto uint64 `json:"replay_alerts_upto,omitempty"`
	// Generation changes with each replay: a sender drops a batch it read
	// from the queue before the replay cleared it.
	Generation int `json:"generation,omitempty"`
}

// Wants reports whether events of type typ on link code go to e. A
// disabled endpoint wants nothing; a paused one keeps queueing.
func (e Endpoint) Wants(typ, code string) bool {
	return e.DisabledAt.IsZero() && e.Selects(typ, code)
}

// Selects reports whether events of type typ on link code are among those
// e subscribes to (its event types and links), disabled or not. A replay
// refills a disabled endpoint's queue by it: the events are sent once the
// owner resumes the endpoint.
func (e Endpoint) Selects(typ, code string) bool {
	if typ != TypeTest && !slices.Contains(e.Types, typ) {
		return false
	}
	return len(e.Links) == 0 || typ == TypeTest || slices.Contains(e.Links, code)
}

// Secrets are the secrets that sign a delivery made at now: the current one
// and, during a rotation's overlap, the old one.
func (e Endpoint) Secrets(now time.Time) []string {
	if e.OldSecret != "" && now.Before(e.OldSecretUntil) {
		return []string{e.Secret, e.OldSecret}
	}
	return []string{e.Secret}
}

// Status is what the console and the owner see: "active", "paused" or "disabled".
func (e Endpoint) Status() string {
	switch {
	case !e.DisabledAt.IsZero():
		return "disabled"
	case e.Paused:
		return "paused"
	}
	return "active"
}

// Request is what an owner sends to create an endpoint.
type Request struct {
	URL         string   `json:"url"`
	Types       []string `json:"event_types"`
	Links       []string `json:"links"`
	BatchMax    int      `json:"batch_max"`
	BatchWaitMS int      `json:"batch_wait_ms"`
}

// Rules are the deployment's limits on endpoint URLs.
type Rules struct {
	// HTTPHosts may be reached over plain http (a local receiver in a
	// demo); every other endpoint must be https.
	HTTPHosts []string
	// DefaultBatchMax and DefaultBatchWait apply when the request leaves
	// them out.
	DefaultBatchMax  int
	DefaultBatchWait time.Duration
}

// New validates r and returns the owner's new endpoint, with a fresh ID
// and secret.
func New(owner string, r Request, rules Rules, now time.Time) (Endpoint, error) {
	u, err := CheckURL(r.URL, rules.HTTPHosts)
	if err != nil {
		return Endpoint{}, err
	}
	if len(r.Types) == 0 {
		return Endpoint{}, fmt.Errorf("event_types: want at least one of %q, %q: %w", TypeClick, TypeFraudAlert, ErrInvalid)
	}
	var types []string
	for _, t := range r.Types {
		if t != TypeClick && t != TypeFraudAlert {
			return Endpoint{}, fmt.Errorf("event_types: %q is not %q or %q: %w", t, TypeClick, TypeFraudAlert, ErrInvalid)
		}
		if !slices.Contains(types, t) {
			types = append(types, t)
		}
	}
	if len(r.Links) > MaxLinkFilter {
		return Endpoint{}, fmt.Errorf("links: %d codes, at most %d: %w", len(r.Links), MaxLinkFilter, ErrInvalid)
	}
	for _, c := range r.Links {
		if !events.ValidToken(c) {
			return Endpoint{}, fmt.Errorf("links: %q is not a link code: %w", c, ErrInvalid)
		}
	}
	e := Endpoint{
		ID: "ep_" + events.NewID(), Owner: owner, URL: u.String(), Types: types, Links: r.Links,
		BatchMax: rules.DefaultBatchMax, BatchWait: rules.DefaultBatchWait,
		Secret: NewSecret(), CreatedAt: now.UTC(),
	}
	if r.BatchMax != 0 {
		e.BatchMax = r.BatchMax
	}
	if r.BatchWaitMS != 0 {
		e.BatchWait = time.Duration(r.BatchWaitMS) * time.Millisecond
	}
	switch {
	case e.BatchMax < 1 || e.BatchMax > MaxBatchEvents:
		return Endpoint{}, fmt.Errorf("batch_max %d: want 1..%d: %w", e.BatchMax, MaxBatchEvents, ErrInvalid)
	case e.BatchWait < 0 || e.BatchWait > MaxBatchWait:
		return Endpoint{}, fmt.Errorf("batch_wait_ms %d: want 0..%d: %w", r.BatchWaitMS, MaxBatchWait.Milliseconds(), ErrInvalid)
	}
	return e, nil
}

// CheckURL accepts absolute https URLs without credentials or fragments,
// and http only for the allow-listed hosts. Where the host points is checked
// separately (netguard), at creation and at every connection.
func CheckURL(raw string, httpHosts []string) (*url.URL, error) {
	if len(raw) > MaxURLLen {
		return nil, fmt.Errorf("url: longer than %d bytes: %w", MaxURLLen, ErrInvalid)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("url: %v: %w", err, ErrInvalid)
	}
	switch {
	case u.Hostname() == "":
		return nil, fmt.Errorf("url %q: no host: %w", raw, ErrInvalid)
	case u.User != nil:
		return nil, fmt.Errorf("url: credentials in the URL are not accepted: %w", ErrInvalid)
	case u.Fragment != "":
		return nil, fmt.Errorf("url: fragments are not sent: %w", ErrInvalid)
	case u.Scheme == "https":
	case u.Scheme == "http" && slices.Contains(httpHosts, strings.ToLower(u.Hostname())):
	case u.Scheme == "http":
		return nil, fmt.Errorf("url: https required (%s is not allowed plain http): %w", u.Hostname(), ErrInvalid)
	default:
		return nil, fmt.Errorf("url: scheme %q, want https: %w", u.Scheme, ErrInvalid)
	}
	return u, nil
}

// NewSecret returns a Standard Webhooks secret: "whsec_" and 32 random
// bytes in base64.
func NewSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// Rotate gives e a new secret; the old one keeps signing until now+overlap.
func (e *Endpoint) Rotate(now time.Time, overlap time.Duration) {
	e.OldSecret, e.OldSecretUntil = e.Secret, now.Add(overlap).UTC()
	e.Secret = NewSecret()
}
