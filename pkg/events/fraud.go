package events

import (
	"fmt"
	"time"
)

// FraudVersion is the schema version of FraudAlert and FraudVerdict.
const FraudVersion = 1

// FraudAlert says a rule fired on a link. It is published on
// FraudAlertSubject(Code) with Nats-Msg-Id = ID. The ID is deterministic
// (rule, key and window), not random: a replayed or redelivered detector
// computes the same ID, and the FRAUD stream's duplicate window drops the
// copy, so replay never raises the same alert twice.
type FraudAlert struct {
	V  int    `json:"v"`
	ID string `json:"id"`
	// Rule names the rule that fired, e.g. "visitor_burst".
	Rule  string `json:"rule"`
	Code  string `json:"code"`
	Owner string `json:"owner"`
	// Key is what the rule counted on: a visitor hash, a user agent class,
	// or "" for link-level rules.
	Key string `json:"key,omitempty"`
	// WindowStart and WindowEnd bound the window the rule looked at.
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
	// Count is what the rule saw in the window; Threshold is what it allows.
	Count     int `json:"count"`
	Threshold int `json:"threshold"`
	// Time is the event time that triggered the alert (not the wall clock),
	// so a replay produces the same payload.
	Time   time.Time `json:"ts"`
	Detail string    `json:"detail,omitempty"`
}

// FraudVerdict labels one click, keyed by the click's event ID. It is
// published on FraudVerdictSubject(Owner, Code) with Nats-Msg-Id = ID. The
// click counter applies it as a correction (moving the click between its
// human and bot counts once, keyed by ClickID); clicks are labelled, never
// deleted, and a later verdict with Bot=false reclassifies a click as human.
type FraudVerdict struct {
	V  int    `json:"v"`
	ID string `json:"id"`
	// Partition and the label's ClickSeq locate the click in CLICKS, so a
	// reader can tell whether it has already processed it.
	Partition int `json:"partition"`
	// FraudVerdictLabel is the label itself; its fields encode at the top
	// level of the verdict, as they always did.
	FraudVerdictLabel
}

// MaxFraudIDLen bounds deterministic fraud IDs (they are Nats-Msg-Id values).
const MaxFraudIDLen = 128

// validFraudID accepts 1 to MaxFraudIDLen letters, digits, '-', '_' and ':'.
func validFraudID(id string) bool {
	if len(id) == 0 || len(id) > MaxFraudIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == ':') {
			return false
		}
	}
	return true
}

// DecodeFraudAlert parses and validates an alert.
func DecodeFraudAlert(data []byte) (FraudAlert, error) {
	var a FraudAlert
	if err := decodeVersioned(data, FraudVersion, &a); err != nil {
		return FraudAlert{}, fmt.Errorf("decode fraud alert: %w", err)
	}
	switch {
	case !validFraudID(a.ID):
		return FraudAlert{}, fmt.Errorf("decode fraud alert: id %q: %w", a.ID, ErrMalformed)
	case a.Rule == "" || !ValidToken(a.Code) || !ValidToken(a.Owner):
		return FraudAlert{}, fmt.Errorf("decode fraud alert %s: rule %q code %q owner %q: %w", a.ID, a.Rule, a.Code, a.Owner, ErrMalformed)
	}
	return a, nil
}

// DecodeFraudVerdict parses and validates a verdict.
func DecodeFraudVerdict(data []byte) (FraudVerdict, error) {
	var v FraudVerdict
	if err := decodeVersioned(data, FraudVersion, &v); err != nil {
		return FraudVerdict{}, fmt.Errorf("decode fraud verdict: %w", err)
	}
	switch {
	case !validFraudID(v.ID):
		return FraudVerdict{}, fmt.Errorf("decode fraud verdict: id %q: %w", v.ID, ErrMalformed)
	case !validID(v.ClickID):
		return FraudVerdict{}, fmt.Errorf("decode fraud verdict %s: click id %q: %w", v.ID, v.ClickID, ErrMalformed)
	case v.Rule == "" || !ValidToken(v.Code) || !ValidToken(v.Owner):
		return FraudVerdict{}, fmt.Errorf("decode fraud verdict %s: rule %q code %q owner %q: %w", v.ID, v.Rule, v.Code, v.Owner, ErrMalformed)
	case v.ClickSeq == 0 || v.ClickTime.IsZero():
		return FraudVerdict{}, fmt.Errorf("decode fraud verdict %s: click seq %d, click time %s: %w", v.ID, v.ClickSeq, v.ClickTime, ErrMalformed)
	}
	return v, nil
}
