package events

import (
	"fmt"
	"github.com/segmentio/encoding/json"
	"time"
)

// ClickVersion is the schema version of Click this build writes and reads.
const ClickVersion = 1

// Click is one redirect: the fact that a visitor followed a short link. It is
// published to CLICKS on ClickSubject(Owner, Code) with Nats-Msg-Id = ID.
//
// Privacy: the raw client address never leaves the redirect service. IPPrefix
// is the truncated network (/24 for IPv4, /48 for IPv6) and Visitor is a keyed
// hash of address and user agent whose key rotates daily, so neither can be
// turned back into an address.
type Click struct {
	// V is the schema version, ClickVersion.
	V int `json:"v"`
	// ID is the event ID, a UUIDv7 assigned by the redirect service.
	ID string `json:"id"`
	// Time is when the redirect was served, UTC.
	Time time.Time `json:"ts"`
	// Code is the link code.
	Code string `json:"code"`
	// Owner is the ID of the link's owner.
	Owner string `json:"owner"`
	// Target is the URL the visitor was sent to.
	Target string `json:"target"`
	// IPPrefix is the anonymised client network, e.g. "203.0.113.0/24".
	IPPrefix string `json:"ip_prefix,omitempty"`
	// Visitor is the anonymised visitor identity used for uniques and fraud:
	// hex of a keyed hash of client IP and user agent, key rotated daily.
	Visitor string `json:"visitor"`
	// UserAgent is the request's User-Agent header (truncated).
	UserAgent string `json:"ua,omitempty"`
	// Referrer is the request's Referer header (truncated).
	Referrer string `json:"referrer,omitempty"`
	// Country is an ISO 3166-1 alpha-2 code from the edge's header
	// (CF-IPCountry, X-Country) as the redirect read it (two letters,
	// uppercased), empty when unknown.
	Country string `json:"country,omitempty"`
	// RequestID ties the click to the redirect's access log.
	RequestID string `json:"request_id,omitempty"`
	// Bot is set at the source when the user agent is a known bot or link
	// unfurler. Bots are labelled, never dropped; fraud verdicts may label
	// more clicks later.
	Bot bool `json:"bot,omitempty"`
}

// Validate checks the fields every reader relies on.
func (c *Click) Validate() error {
	switch {
	case c.V != ClickVersion:
		return fmt.Errorf("click version %d: %w", c.V, ErrUnknownVersion)
	case !validID(c.ID):
		return fmt.Errorf("click id %q is not a UUIDv7: %w", c.ID, ErrMalformed)
	case c.Time.IsZero():
		return fmt.Errorf("click %s has no time: %w", c.ID, ErrMalformed)
	case !ValidToken(c.Code):
		return fmt.Errorf("click %s code %q: %w", c.ID, c.Code, ErrMalformed)
	case !ValidToken(c.Owner):
		return fmt.Errorf("click %s owner %q: %w", c.ID, c.Owner, ErrMalformed)
	case len(c.Country) != 0 && len(c.Country) != 2:
		return fmt.Errorf("click %s country %q: %w", c.ID, c.Country, ErrMalformed)
	}
	return nil
}

// DecodeClick parses and validates a click payload. It returns an error
// wrapping ErrMalformed or ErrUnknownVersion for payloads a reader must park.
//
// Readers call it for every event, so the common case parses the payload
// once; only a payload that fails is looked at again, to tell an event of an
// unknown version from a malformed one.
func DecodeClick(data []byte) (Click, error) {
	var c Click
	if err := decodeClick(&c, data, 0); err != nil {
		return Click{}, err
	}
	return c, nil
}

// decodeClick is DecodeClick into c, with the JSON parser's flags: a click
// in the shape Snip writes is read directly (parseCanonicalClick), any other
// payload by the general decoder.
func decodeClick(c *Click, data []byte, flags json.ParseFlags) error {
	if parseCanonicalClick(c, data, flags) {
		return checkDecoded(c)
	}
	*c = Click{}
	return decodeClickGeneral(c, data, flags)
}

// decodeClickGeneral is decodeClick with the general decoder only.
func decodeClickGeneral(c *Click, data []byte, flags json.ParseFlags) error {
	rest, err := json.Parse(data, c, flags)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%d bytes after the click", len(rest))
	}
	if err != nil || c.V != ClickVersion {
		if verr := checkVersion(data, ClickVersion); verr != nil {
			return fmt.Errorf("decode click: %w", verr)
		}
		return fmt.Errorf("decode click: %w: %v", ErrMalformed, err)
	}
	return checkDecoded(c)
}

// checkDecoded is the check every decoded click passes: Validate.
func checkDecoded(c *Click) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("decode click: %w", err)
	}
	return nil
}

// decodeVersioned checks the "v" field before decoding the rest, so an event
// of a future version is reported as such rather than as malformed.
func decodeVersioned(data []byte, want int, into any) error {
	if err := checkVersion(data, want); err != nil {
		return err
	}
	if err := json.Unmarshal(data, into); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return nil
}

// checkVersion reads only the "v" field: nil if it is want, ErrUnknownVersion
// if it is another number, ErrMalformed if there is none.
func checkVersion(data []byte, want int) error {
	var head struct {
		V *int `json:"v"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if head.V == nil {
		return fmt.Errorf("no schema version: %w", ErrMalformed)
	}
	if *head.V != want {
		return fmt.Errorf("version %d, this build reads %d: %w", *head.V, want, ErrUnknownVersion)
	}
	return nil
}
