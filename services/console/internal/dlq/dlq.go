// Package dlq is the console's view of DEAD_LETTER through pkg/deadletter:
// counts and the newest letter per source and reason, one letter with its
// headers and payload, and redrive of one letter or of a whole source and
// reason.
package dlq

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
)

// Letter is a dead letter as the panel shows it.
type Letter struct {
	Seq         uint64    `json:"seq"`
	Subject     string    `json:"subject"`
	Source      string    `json:"source"`
	Reason      string    `json:"reason"`
	Parked      time.Time `json:"parked"`
	Stream      string    `json:"stream"`
	OrigSubject string    `json:"orig_subject"`
	OrigSeq     uint64    `json:"orig_seq"`
	Attempts    int       `json:"attempts"`
	Error       string    `json:"error,omitempty"`
	Consumer    string    `json:"consumer,omitempty"`
	ID          string    `json:"id,omitempty"`
	// RedriveTo is the subject a redrive publishes to; RedriveRefused says
	// why it cannot be redriven instead.
	RedriveTo      string `json:"redrive_to,omitempty"`
	RedriveRefused string `json:"redrive_refused,omitempty"`
	// Headers and the payload: as indented JSON or text when it is one,
	// else base64. Only a single letter's view carries them.
	Headers       map[string][]string `json:"headers,omitempty"`
	Payload       string              `json:"payload,omitempty"`
	PayloadBase64 string              `json:"payload_base64,omitempty"`
	PayloadBytes  int                 `json:"payload_bytes"`
}

func view(l deadletter.Letter, full bool) Letter {
	v := Letter{
		Seq: l.Seq, Subject: l.Subject, Source: l.Source, Reason: l.Reason, Parked: l.Time.UTC(), Stream: l.Stream,
		OrigSubject: l.OrigSubject, OrigSeq: l.OrigSeq, Attempts: l.Attempts, Error: l.Error, Consumer: l.Consumer,
		ID: l.ID, PayloadBytes: len(l.Data),
	}
	if subj, err := redriveSubject(l); err == nil {
		v.RedriveTo = subj
	} else {
		v.RedriveRefused = err.Error()
	}
	if !full {
		return v
	}
	v.Headers = map[string][]string(l.Header)
	var pretty bytes.Buffer
	switch {
	case json.Valid(l.Data) && json.Indent(&pretty, l.Data, "", "  ") == nil:
		v.Payload = pretty.String()
	case utf8.Valid(l.Data):
		v.Payload = string(l.Data)
	default:
		v.PayloadBase64 = base64.StdEncoding.EncodeToString(l.Data)
	}
	return v
}

// consoleRedrives are the streams whose letters the console may send home:
// the only ones its NATS user may publish to. That user is "console" in
// deploy/nats/accounts.conf, generated from deploy/check/natsconf.go, which
// grants it clicks.> (CLICKS) and jobs.preview (PREVIEW_JOBS) "for redrive";
// change the two together. Letters of LINKS and FRAUD_VERDICTS (the click
// counter's) are redriven with snipctl, as admin; pkg/deadletter redrives a
// letter of PREVIEW_JOBS, LINKS or FRAUD_VERDICTS only from a source that
// parks that stream's messages, none of FRAUD, and a consumer group's letter
// of a click only as the copy of the click CLICKS holds at its sequence
// (reading it takes $JS.API.STREAM.MSG.GET.CLICKS, in the user's
// $JS.API.STREAM.MSG.GET.*).
var consoleRedrives = map[string]bool{events.ClicksStream: true, events.PreviewJobsStream: true}

// redriveSubject is l.RedriveSubject for the console: a letter whose stream
// the console may not publish to cannot be redriven here.
func redriveSubject(l deadletter.Letter) (string, error) {
	if l.Stream != "" && !consoleRedrives[l.Stream] {
		return "", fmt.Errorf("dead letter %d comes from %s, which the console may not publish to (snipctl dlq redrive can): %w",
			l.Seq, l.Stream, deadletter.ErrNotRedrivable)
	}
	return l.RedriveSubject()
}

// checked is view(l, full) with what a redrive would find: a consumer
// group's letter of a click whose original CLICKS no longer holds as the
// letter has it (gone, or a planted letter) shows why it cannot be redriven
// instead of where it would go (deadletter.Redrivable reads CLICKS).
func (d *DLQ) checked(ctx context.Context, l deadletter.Letter, full bool) (Letter, error) {
	v := view(l, full)
	if v.RedriveTo == "" {
		return v, nil
	}
	_, err := deadletter.Redrivable(ctx, d.js, l)
	if errors.Is(err, deadletter.ErrNotRedrivable) {
		v.RedriveTo, v.RedriveRefused = "", err.Error()
		return v, nil
	}
	return v, err
}

// redrive sends l home if the console may.
func (d *DLQ) redrive(ctx context.Context, l deadletter.Letter) (deadletter.Redriven, error) {
	if _, err := redriveSubject(l); err != nil {
		return deadletter.Redriven{}, fmt.Errorf("redrive: %w", err)
	}
	return deadletter.RedriveLetter(ctx, d.js, l)
}

// Group is the letters of one source and reason.
type Group struct {
	Source string `json:"source"`
	Reason string `json:"reason"`
	Count  uint64 `json:"count"`
	Newest Letter `json:"newest"`
}

// DLQ reads and redrives dead letters.
type DLQ struct {
	js jetstream.JetStream
}

// New returns the DLQ view on js.
func New(js jetstream.JetStream) *DLQ { return &DLQ{js: js} }

// GroupsShown bounds the groups the panel lists: those with the most
// letters. A credential that parks letters under many made-up reasons
// (each its own dead.<source>.<reason> subject) would otherwise make the
// panel read one letter per reason and answer them all.
const GroupsShown = 50

// Groups are the dead-letter groups the panel lists, and what there is in
// all.
type Groups struct {
	// Groups are the GroupsShown groups with the most letters, sorted by
	// source then reason.
	Groups []Group `json:"groups"`
	// Total is every letter's count, TotalGroups every group's, also of
	// the groups not listed.
	Total       uint64 `json:"total"`
	TotalGroups int    `json:"total_groups"`
}

// Groups returns the GroupsShown groups with the most letters, sorted by
// source then reason, and how many letters and groups there are in all.
func (d *DLQ) Groups(ctx context.Context) (Groups, error) {
	l, err := deadletter.ListMost(ctx, d.js, GroupsShown)
	if err != nil {
		return Groups{}, err
	}
	out := Groups{Groups: make([]Group, 0, len(l.Groups)), Total: l.AllLetters, TotalGroups: l.AllGroups}
	for _, g := range l.Groups {
		out.Groups = append(out.Groups, Group{Source: g.Source, Reason: g.Reason, Count: g.Count, Newest: view(g.Newest, false)})
	}
	return out, nil
}

func filter(source, reason string) (string, error) {
	if (source != "" && !events.ValidToken(source)) || (reason != "" && !events.ValidToken(reason)) {
		return "", fmt.Errorf("source %q reason %q: %w", source, reason, ErrBadFilter)
	}
	return deadletter.Filter(source, reason), nil
}

var errEnough = errors.New("enough letters")

// Letters returns up to limit letters of source and reason (empty: any),
// oldest first.
func (d *DLQ) Letters(ctx context.Context, source, reason string, limit int) ([]Letter, error) {
	f, err := filter(source, reason)
	if err != nil {
		return nil, err
	}
	out := []Letter{}
	err = deadletter.Each(ctx, d.js, f, func(l deadletter.Letter) error {
		v, err := d.checked(ctx, l, false)
		if err != nil {
			return err
		}
		out = append(out, v)
		if len(out) >= limit {
			return errEnough
		}
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		return nil, err
	}
	return out, nil
}

// Letter returns one letter with its headers and payload.
func (d *DLQ) Letter(ctx context.Context, seq uint64) (Letter, error) {
	l, err := deadletter.Get(ctx, d.js, seq)
	if err != nil {
		return Letter{}, err
	}
	return d.checked(ctx, l, true)
}

// Redriven is the outcome of one redrive.
type Redriven struct {
	Seq       uint64 `json:"seq"`
	Subject   string `json:"subject"`
	Stream    string `json:"stream"`
	NewSeq    uint64 `json:"new_seq"`
	Duplicate bool   `json:"duplicate"`
}

func redriven(r deadletter.Redriven) Redriven {
	return Redriven{Seq: r.Letter.Seq, Subject: r.Subject, Stream: r.Stream, NewSeq: r.Seq, Duplicate: r.Duplicate}
}

// Redrive sends one letter home.
func (d *DLQ) Redrive(ctx context.Context, seq uint64) (Redriven, error) {
	l, err := deadletter.Get(ctx, d.js, seq)
	if err != nil {
		return Redriven{}, fmt.Errorf("redrive: %w", err)
	}
	r, err := d.redrive(ctx, l)
	if err != nil {
		return Redriven{}, err
	}
	return redriven(r), nil
}

// RefusalsListed bounds the refusals a group redrive lists: a group of
// letters none of which may be redriven here (a million from LINKS) would
// otherwise answer with an entry for each.
const RefusalsListed = 100

// GroupRedrive is the outcome of redriving a source and reason.
type GroupRedrive struct {
	Redriven int `json:"redriven"`
	// RefusedCount counts the letters that could not be redriven (left in
	// place); Refused lists the oldest RefusalsListed of them, and
	// RefusedListed says how many it may list.
	RefusedCount  int       `json:"refused_count"`
	Refused       []Refusal `json:"refused"`
	RefusedListed int       `json:"refused_listed"`
	// Incomplete is true when time ran out before every letter was tried;
	// the rest are still there.
	Incomplete bool   `json:"incomplete"`
	Error      string `json:"error,omitempty"`
}

// Refusal is a letter left in place, and why.
type Refusal struct {
	Seq   uint64 `json:"seq"`
	Error string `json:"error"`
}

// RedriveGroup sends every letter of source and reason (both required)
// stored when it started home, oldest first, until ctx ends. A letter that
// cannot be redriven, or whose redrive fails while ctx lasts, is reported in
// Refused (the oldest RefusalsListed; RefusedCount counts them all) and left
// in place; the letters behind it are still tried.
func (d *DLQ) RedriveGroup(ctx context.Context, source, reason string) (GroupRedrive, error) {
	if source == "" || reason == "" {
		return GroupRedrive{}, fmt.Errorf("redrive: give a source and a reason: %w", ErrBadFilter)
	}
	f, err := filter(source, reason)
	if err != nil {
		return GroupRedrive{}, err
	}
	out := GroupRedrive{Refused: []Refusal{}, RefusedListed: RefusalsListed}
	err = deadletter.Each(ctx, d.js, f, func(l deadletter.Letter) error {
		_, err := d.redrive(ctx, l)
		if err != nil && ctx.Err() != nil {
			return err // time is up: the rest are still there
		}
		if err != nil {
			// Each goes oldest first: the ones listed are the oldest.
			if out.RefusedCount++; len(out.Refused) < RefusalsListed {
				out.Refused = append(out.Refused, Refusal{Seq: l.Seq, Error: err.Error()})
			}
			return nil
		}
		out.Redriven++
		return nil
	})
	if err != nil {
		// What was redriven stays redriven: report it with the error.
		out.Incomplete, out.Error = true, err.Error()
	}
	sort.Slice(out.Refused, func(i, j int) bool { return out.Refused[i].Seq < out.Refused[j].Seq })
	return out, nil
}
