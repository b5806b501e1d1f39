package events

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/segmentio/encoding/json"
)

// MaxClockSkew bounds how far a click's time (and the time inside its event
// ID) may be from when it was stored, or, at the relay, from when it is
// published. The outbox holds clicks while NATS is down, so hours are normal;
// a month is a broken clock or a forged event.
const MaxClockSkew = 30 * 24 * time.Hour

// Reasons an event is invalid: the last token of the dead-letter subject
// dead.<reader>.<reason>, the same for every reader and for the relay.
const (
	// ReasonMalformed: the payload is not a valid click (JSON, required
	// fields, token syntax, event ID).
	ReasonMalformed = "malformed"
	// ReasonUnknownVersion: the payload's schema version is not one this
	// build reads.
	ReasonUnknownVersion = "unknown_version"
	// ReasonSubjectMismatch: the subject's owner or code differs from the
	// payload's.
	ReasonSubjectMismatch = "subject_mismatch"
	// ReasonWrongPartition: the click is stored in another partition than
	// its link code hashes to.
	ReasonWrongPartition = "wrong_partition"
	// ReasonImplausibleTime: the click's time, or its event ID's, is more
	// than MaxClockSkew from when it was stored.
	ReasonImplausibleTime = "implausible_time"
)

// InvalidError is a click that fails the rule of validity for a reason other
// than its payload alone (ErrMalformed, ErrUnknownVersion): where it was
// published or stored, or when.
type InvalidError struct {
	// Reason is one of the Reason constants.
	Reason string
	Err    error
}

func (e *InvalidError) Error() string { return e.Err.Error() }

func (e *InvalidError) Unwrap() error { return e.Err }

// ErrInvalid is wrapped by every InvalidError.
var ErrInvalid = errors.New("invalid event")

func invalid(reason, format string, a ...any) error {
	return &InvalidError{Reason: reason, Err: fmt.Errorf(format+": %w", append(a, ErrInvalid)...)}
}

// Reason returns the dead-letter reason of an error from ReadClick,
// CheckClick or DecodeClick.
func Reason(err error) string {
	var ie *InvalidError
	switch {
	case errors.As(err, &ie):
		return ie.Reason
	case errors.Is(err, ErrUnknownVersion):
		return ReasonUnknownVersion
	}
	return ReasonMalformed
}

// ReadClick is how every reader reads a click from CLICKS: DecodeClick, then
// CheckClick against the subject the message was stored under, the stream's
// partition count and when it was stored. An error says why the event is
// invalid (see Reason); every reader parks such an event and none counts,
// loads or judges it.
func ReadClick(data []byte, subject string, partitions int, stored time.Time) (Click, error) {
	var c Click
	if err := readClick(&c, data, 0, subject, partitions, stored); err != nil {
		return Click{}, err
	}
	return c, nil
}

// ReadClickShared is ReadClick into *c, without copying: c's strings share
// data's memory (the JSON parser's zero-copy mode), so data must never be
// changed afterwards, and any string of c kept keeps all of data. The reader
// runtime reads every click so: a NATS message's payload is a buffer of its
// own that nothing writes again, and the ten strings of a click were ten
// allocations per event in every reader. c is zeroed first; on an error it
// holds nothing a caller may use.
func ReadClickShared(c *Click, data []byte, subject string, partitions int, stored time.Time) error {
	*c = Click{}
	return readClick(c, data, json.ZeroCopy, subject, partitions, stored)
}

func readClick(c *Click, data []byte, flags json.ParseFlags, subject string, partitions int, stored time.Time) error {
	if err := decodeClick(c, data, flags); err != nil {
		return err
	}
	return CheckClick(c, subject, partitions, stored)
}

// CheckClick is the one rule of validity beyond the payload itself
// (Click.Validate): the subject and the payload agree on owner and code;
// a stored subject's partition is the one the code hashes to (partitions
// > 0); and the click's time and its event ID's time are within
// MaxClockSkew of at (when it was stored; when it is published, at the
// relay). subject is a publish subject, clicks.<owner>.<code>, or a stored
// one, <partition>.clicks.<owner>.<code>. It depends only on the message,
// never on the clock of the reader, so every reader, and a replay, judges an
// event the same.
func CheckClick(c *Click, subject string, partitions int, at time.Time) error {
	rest, part := subject, -1
	if i := strings.IndexByte(subject, '.'); i > 0 && subject[0] >= '0' && subject[0] <= '9' {
		if part = PartitionOf(subject); part < 0 {
			return invalid(ReasonSubjectMismatch, "click %s: subject %q is not a click subject", c.ID, subject)
		}
		rest = subject[i+1:]
	}
	tail, ok := strings.CutPrefix(rest, "clicks.")
	owner, code, ok2 := strings.Cut(tail, ".")
	if !ok || !ok2 || strings.IndexByte(code, '.') >= 0 {
		return invalid(ReasonSubjectMismatch, "click %s: subject %q is not a click subject", c.ID, subject)
	}
	if owner != c.Owner || code != c.Code {
		return invalid(ReasonSubjectMismatch, "click %s of %s/%s published on %q", c.ID, c.Owner, c.Code, subject)
	}
	if part >= 0 && partitions > 0 {
		if want := Partition(c.Code, partitions); want != part {
			return invalid(ReasonWrongPartition, "click %s of link %q stored in partition %d, its code hashes to %d", c.ID, c.Code, part, want)
		}
	}
	if skew := c.Time.Sub(at); skew > MaxClockSkew || skew < -MaxClockSkew {
		return invalid(ReasonImplausibleTime, "click %s at %s, stored or published at %s: more than %s apart",
			c.ID, c.Time.UTC().Format(time.RFC3339), at.UTC().Format(time.RFC3339), MaxClockSkew)
	}
	idt, ok := idTime(c.ID)
	if !ok {
		return fmt.Errorf("click %s: event ID without a time: %w", c.ID, ErrMalformed)
	}
	if skew := idt.Sub(at); skew > MaxClockSkew || skew < -MaxClockSkew {
		return invalid(ReasonImplausibleTime, "click %s: event ID time %s, stored or published at %s: more than %s apart",
			c.ID, idt.Format(time.RFC3339), at.UTC().Format(time.RFC3339), MaxClockSkew)
	}
	return nil
}

// idTime reads the 48-bit millisecond timestamp of a canonical UUIDv7
// (hex digits 0-7 and 9-12) without parsing the rest.
func idTime(id string) (time.Time, bool) {
	if len(id) != 36 || id[8] != '-' {
		return time.Time{}, false
	}
	var ms int64
	for i := 0; i < 13; i++ {
		if i == 8 {
			continue
		}
		c := id[i]
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return time.Time{}, false
		}
		ms = ms<<4 | int64(v)
	}
	return time.UnixMilli(ms).UTC(), true
}
