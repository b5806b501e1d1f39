// Package deadletter is the DEAD_LETTER contract in code: how a message that
// could not be processed is parked there (Publish), how a parked message is
// read back (Get, List, Each), and how it is sent home once the cause is fixed
// (Redrive).
//
// A dead letter is the original payload, unchanged, on
// dead.<source>.<reason>, with the Snip-Dead-* headers of package events
// saying where it came from (stream, subject, sequence), who gave up
// (consumer), after how many attempts, and the last error. Publish sets
// Nats-Msg-Id to "<id>:dead:<source>:<seq>" (the event or job ID, who parks
// it, and the original stream sequence, or, for a message that never reached
// its stream, its position where it waited), so two paths of one source that
// park the same message within DEAD_LETTER's duplicate window store it once.
//
// This package is the only writer of dead letters: the log readers, the work
// queue, the click counter's feeds and the outbox relay all park through
// Publish, so every dead letter has the same headers and ID scheme and every
// one can be redriven.
//
// Redrive re-publishes the payload to the subject it came from, expecting the
// original stream, with a fresh Nats-Msg-Id "<id>:redrive:<stream>:<seq>"
// (the original stream and sequence) so the target stream's duplicate window
// does not swallow it, and deletes the dead letter only after the target
// stream acknowledged the publish. A crash in between leaves the dead letter
// in place; redriving it again within the duplicate window is deduplicated by
// that ID. So are the letters other sources parked of the same message (every
// consumer group of CLICKS parks an event of an unknown version): redriven
// within the window, they put it back once, and every group reads that copy.
// A letter of a message that never reached its stream (the outbox relay's)
// is redriven as "<id>:redrive:<dead seq>".
//
// A letter's headers and payload are the word of whoever published it, and
// each service's NATS user may publish its own dead.<source>.>. So Redrive
// sends a letter only where its source parks: PREVIEW_JOBS from preview and
// the outbox relay, LINKS from the click counter and the relay,
// FRAUD_VERDICTS from the click counter, nothing to FRAUD; a click from the
// outbox relay as it is (only the redirect's user may publish
// dead.outbox.>), and a click from a consumer group only as the copy of the
// click CLICKS still holds at the letter's sequence, with the letter's
// subject and payload. A planted click (a group's user making one up, or
// changing a real one) is refused with ErrNotRedrivable and left in place;
// so is a genuine letter whose click CLICKS no longer holds (past its age
// limit), which redrive cannot tell from a planted one.
//
// The runtimes that park (package reader, package workqueue, the click
// counter's feeds, the outbox relay), snipctl and the console all use it.
package deadletter

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/topology"
)

// HeaderRedriveOf is set on a redriven message: the DEAD_LETTER sequence it
// was redriven from, so a consumer's logs can tell a second life from a first.
const HeaderRedriveOf = "Snip-Redrive-Of"

// MaxErrorLen bounds the Snip-Dead-Error header.
const MaxErrorLen = 1024

// Errors callers check with errors.Is.
var (
	// ErrNotFound means there is no dead letter with that sequence (it was
	// redriven or expired, or never existed).
	ErrNotFound = errors.New("dead letter not found")
	// ErrNotRedrivable means the dead letter lacks the headers that say
	// where it came from, names a stream Redrive does not know, names a
	// stream its source does not park (see RedriveSubject), or is a
	// consumer group's letter of a click CLICKS no longer holds as the
	// letter has it (ErrOriginalGone, ErrOriginalDiffers).
	ErrNotRedrivable = errors.New("dead letter cannot be redriven")
	// ErrOriginalGone means a consumer group's letter of a click names a
	// CLICKS sequence that holds nothing (CLICKS' age limit passed, or it
	// was deleted or purged). It wraps ErrNotRedrivable.
	ErrOriginalGone = fmt.Errorf("its original is gone from %s (past the stream's age limit, or deleted): %w", events.ClicksStream, ErrNotRedrivable)
	// ErrOriginalDiffers means a consumer group's letter of a click names a
	// CLICKS sequence that holds another subject or payload than the
	// letter: not what the group parked. It wraps ErrNotRedrivable.
	ErrOriginalDiffers = fmt.Errorf("it differs from what %s holds there: %w", events.ClicksStream, ErrNotRedrivable)
	// ErrInvalid means a Parcel lacks a field Publish needs.
	ErrInvalid = errors.New("invalid dead letter")
)

// OutboxSource is the outbox relay's source: dead.outbox.<reason>. Its
// letters of clicks are the only ones without a CLICKS sequence, and only
// the redirect's NATS user may publish on dead.outbox.> (deploy/).
const OutboxSource = "outbox"

// Parcel is what a consumer that gives up on a message hands to Publish.
type Parcel struct {
	// Source is the first subject token after "dead": "preview" or the
	// consumer group's name (e.g. "click-counter").
	Source string
	// Reason is a short token: "not_found", "timeout", "malformed", ...
	Reason string
	// Stream, Subject and Seq say where the message was stored: the stream,
	// its stored subject (with the partition prefix on CLICKS) and sequence.
	Stream  string
	Subject string
	Seq     uint64
	// Position stands in for Seq when the message never reached Stream:
	// the outbox relay parks a click it will not publish, so it gives the
	// outbox entry's ID and the subject the click was to be published on
	// (clicks.<owner>.<code>, without a partition). One of Seq and
	// Position is needed; Position has no spaces or colons.
	Position string
	// Attempts is how many deliveries were tried.
	Attempts int
	// Error is the last error's text (truncated to MaxErrorLen).
	Error string
	// Consumer is the consumer (or group) that gave up.
	Consumer string
	// Data is the original payload.
	Data []byte
}

// Subject is where p is parked: dead.<source>.<reason>.
func (p Parcel) subject() string { return events.DeadLetterSubject(p.Source, p.Reason) }

// MsgID is the Nats-Msg-Id of the dead letter source parks for the message
// stored at seq in stream with payload data: "<id>:dead:<source>:<seq>",
// where id is the payload's event or job ID, or the stream name when the
// payload has none (a malformed one). Every path of one source that parks the
// same message computes the same ID (the preview worker and its advisory
// rescuer park a job once); two sources parking the same message (two
// consumer groups of CLICKS meeting one malformed event) each keep theirs.
func MsgID(source, stream string, seq uint64, data []byte) string {
	return msgID(source, stream, strconv.FormatUint(seq, 10), data)
}

// PositionMsgID is MsgID for a message that never reached its stream: the
// position where it waited (an outbox entry ID) takes the sequence's place.
func PositionMsgID(source, stream, position string, data []byte) string {
	return msgID(source, stream, position, data)
}

func msgID(source, stream, at string, data []byte) string {
	id := PayloadID(data)
	if id == "" {
		id = stream
	}
	return id + ":dead:" + source + ":" + at
}

// msgID is the Nats-Msg-Id Publish gives p.
func (p Parcel) msgID() string {
	if p.Seq > 0 {
		return MsgID(p.Source, p.Stream, p.Seq, p.Data)
	}
	return PositionMsgID(p.Source, p.Stream, p.Position, p.Data)
}

// PayloadID returns the "id" field of a JSON event or job, or "" when the
// payload has none that is safe to put in a header.
func PayloadID(data []byte) string {
	var v struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(data, &v) != nil || len(v.ID) == 0 || len(v.ID) > 64 {
		return ""
	}
	for i := 0; i < len(v.ID); i++ {
		c := v.ID[i]
		if c <= ' ' || c >= 0x7f || c == ':' {
			return ""
		}
	}
	return v.ID
}

// Publisher is what Publish needs of a JetStream client
// (jetstream.JetStream has it).
type Publisher interface {
	PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

// Publish parks p on DEAD_LETTER and waits for the stream's ack. A duplicate
// (the same message parked by another path within the duplicate window) is a
// success: ack.Duplicate tells.
func Publish(ctx context.Context, js Publisher, p Parcel) (*jetstream.PubAck, error) {
	switch {
	case !events.ValidToken(p.Source):
		return nil, fmt.Errorf("park message: source %q: %w", p.Source, ErrInvalid)
	case !events.ValidToken(p.Reason):
		return nil, fmt.Errorf("park message: reason %q: %w", p.Reason, ErrInvalid)
	case p.Stream == "" || p.Subject == "" || (p.Seq == 0 && !safePosition(p.Position)):
		return nil, fmt.Errorf("park message: stream %q subject %q seq %d position %q: %w", p.Stream, p.Subject, p.Seq, p.Position, ErrInvalid)
	}
	m := nats.NewMsg(p.subject())
	m.Data = p.Data
	m.Header.Set(events.HeaderMsgID, p.msgID())
	m.Header.Set(events.HeaderDeadReason, p.Reason)
	m.Header.Set(events.HeaderDeadSource, p.Stream)
	m.Header.Set(events.HeaderDeadSubject, p.Subject)
	if p.Seq > 0 {
		m.Header.Set(events.HeaderDeadSeq, strconv.FormatUint(p.Seq, 10))
	}
	m.Header.Set(events.HeaderDeadAttempts, strconv.Itoa(p.Attempts))
	if p.Consumer != "" {
		m.Header.Set(events.HeaderDeadGroup, p.Consumer)
	}
	if p.Error != "" {
		m.Header.Set(events.HeaderDeadError, HeaderSafe(p.Error))
	}
	ack, err := js.PublishMsg(ctx, m, jetstream.WithExpectStream(events.DeadLetterStream))
	if err != nil {
		return nil, fmt.Errorf("park message %s seq %d position %q on %s: %w", p.Stream, p.Seq, p.Position, m.Subject, err)
	}
	return ack, nil
}

// HeaderSafe makes s fit in a NATS header value: one line, valid UTF-8, at
// most MaxErrorLen bytes.
func HeaderSafe(s string) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' || r == 0 {
			return ' '
		}
		return r
	}, s)
	if len(s) > MaxErrorLen {
		cut := MaxErrorLen
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

// Letter is one dead letter, as read back from DEAD_LETTER.
type Letter struct {
	// Seq is the dead letter's own DEAD_LETTER sequence: what show and
	// redrive take.
	Seq uint64
	// Subject is dead.<source>.<reason>.
	Subject string
	Source  string
	Reason  string
	// Time is when it was parked.
	Time time.Time
	// Stream, OrigSubject and OrigSeq are where it came from.
	Stream      string
	OrigSubject string
	OrigSeq     uint64
	Attempts    int
	Error       string
	Consumer    string
	// ID is the payload's event or job ID ("" if it has none).
	ID     string
	Header nats.Header
	Data   []byte
}

func letterFrom(m *jetstream.RawStreamMsg) Letter {
	l := Letter{Seq: m.Sequence, Subject: m.Subject, Time: m.Time, Header: m.Header, Data: m.Data, ID: PayloadID(m.Data)}
	if parts := strings.SplitN(m.Subject, ".", 3); len(parts) == 3 {
		l.Source, l.Reason = parts[1], parts[2]
	}
	h := m.Header
	if h == nil {
		h = nats.Header{}
	}
	l.Stream = h.Get(events.HeaderDeadSource)
	l.OrigSubject = h.Get(events.HeaderDeadSubject)
	l.OrigSeq, _ = strconv.ParseUint(h.Get(events.HeaderDeadSeq), 10, 64)
	l.Attempts, _ = strconv.Atoi(h.Get(events.HeaderDeadAttempts))
	l.Error = h.Get(events.HeaderDeadError)
	l.Consumer = h.Get(events.HeaderDeadGroup)
	return l
}

// RedriveSubject is the subject a redrive publishes to: the subject the
// message had, without the partition prefix CLICKS' subject transform put in
// front (the stream adds it again on the way in). A click the outbox relay
// parked before publishing it has no prefix yet: its subject is
// clicks.<owner>.<code>, published as it is. A letter naming PREVIEW_JOBS,
// LINKS or FRAUD_VERDICTS has one only from a source that parks that
// stream's messages (parkers), and one naming FRAUD none (nothing parks alerts): the
// headers are the word of whoever published the letter. A letter of any
// other source than the outbox naming CLICKS has one only if it names the
// CLICKS message it was parked from (a sequence, a partition's subject);
// RedriveLetter and Redrivable then also check that CLICKS holds that
// message as the letter has it.
func (l Letter) RedriveSubject() (string, error) {
	switch {
	case l.Stream == "" || l.OrigSubject == "":
		return "", fmt.Errorf("dead letter %d has no %s/%s headers: %w", l.Seq, events.HeaderDeadSource, events.HeaderDeadSubject, ErrNotRedrivable)
	case l.Stream == events.ClicksStream:
		// A consumer group's letter is of a click stored in CLICKS, under
		// its partition, at the sequence the letter names (RedriveLetter
		// reads it there); only the outbox relay parks a click that never
		// reached CLICKS.
		group := l.Source != OutboxSource
		if events.PartitionOf(l.OrigSubject) >= 0 {
			if group && l.OrigSeq == 0 {
				return "", fmt.Errorf("dead letter %d of %q names no CLICKS sequence (only the outbox relay parks a click that never reached CLICKS): %w", l.Seq, l.Source, ErrNotRedrivable)
			}
			return l.OrigSubject[strings.IndexByte(l.OrigSubject, '.')+1:], nil
		}
		if group {
			return "", fmt.Errorf("dead letter %d of %q: %q is not a CLICKS partition's click subject: %w", l.Seq, l.Source, l.OrigSubject, ErrNotRedrivable)
		}
		if t := strings.Split(l.OrigSubject, "."); len(t) == 3 && t[0] == "clicks" && events.ValidToken(t[1]) && events.ValidToken(t[2]) {
			return l.OrigSubject, nil
		}
		return "", fmt.Errorf("dead letter %d: %q is not a click subject: %w", l.Seq, l.OrigSubject, ErrNotRedrivable)
	case l.Stream == events.PreviewJobsStream, l.Stream == events.LinksStream, l.Stream == events.FraudStream,
		l.Stream == events.FraudVerdictsStream:
		if !slices.Contains(parkers[l.Stream], l.Source) {
			return "", fmt.Errorf("dead letter %d of %q says it comes from %s, where %s: %w", l.Seq, l.Source, l.Stream, parkerOf(l.Stream), ErrNotRedrivable)
		}
		return l.OrigSubject, nil
	}
	return "", fmt.Errorf("dead letter %d comes from unknown stream %q: %w", l.Seq, l.Stream, ErrNotRedrivable)
}

// parkers names, for each stream other than CLICKS, the sources that park
// its messages: the only NATS users that may publish dead.<source>.* (deploy/
// has the grants). The headers saying where a letter came from are the
// publisher's word, so a letter of another source naming one of these streams
// (a service user that may not publish preview jobs or link events planting
// one on DEAD_LETTER) is not redriven there. The outbox relay parks the link
// events and preview jobs JetStream refused before they reached LINKS or
// PREVIEW_JOBS, the preview workers the jobs they gave up on, the click
// counter the link events and verdict messages it cannot apply. Nothing parks
// FRAUD's alerts. CLICKS is parked by every consumer group and the outbox
// relay: a group's letter is redriven only as the copy of a click CLICKS
// still holds (original), the relay's as it is.
var parkers = map[string][]string{
	events.PreviewJobsStream:   {"preview", OutboxSource},
	events.LinksStream:         {topology.GroupClickCounter, OutboxSource},
	events.FraudVerdictsStream: {topology.GroupClickCounter},
}

func parkerOf(stream string) string {
	if p, ok := parkers[stream]; ok {
		return "only " + strings.Join(p, " and ") + " park"
	}
	return "nothing parks"
}

// Get reads the dead letter stored at seq.
func Get(ctx context.Context, js jetstream.JetStream, seq uint64) (Letter, error) {
	s, err := js.Stream(ctx, events.DeadLetterStream)
	if err != nil {
		return Letter{}, fmt.Errorf("get dead letter %d: %w", seq, err)
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Letter{}, fmt.Errorf("get dead letter %d: %w", seq, ErrNotFound)
	}
	if err != nil {
		return Letter{}, fmt.Errorf("get dead letter %d: %w", seq, err)
	}
	return letterFrom(m), nil
}

// Group is the dead letters of one source and reason.
type Group struct {
	Source string
	Reason string
	Count  uint64
	// Newest is the most recently parked letter of the group.
	Newest Letter
}

// List returns a Group per source and reason, sorted by source then reason.
func List(ctx context.Context, js jetstream.JetStream) ([]Group, error) {
	l, err := ListMost(ctx, js, 0)
	return l.Groups, err
}

// Listing is the groups ListMost read, and what there is in all.
type Listing struct {
	// Groups are the groups with the most letters, sorted by source then
	// reason.
	Groups []Group
	// AllGroups and AllLetters count every group and letter, also those
	// of groups left out.
	AllGroups  int
	AllLetters uint64
}

// ListMost is List of the n groups with the most letters (every group when
// n is 0 or less); of the others it counts only their groups and letters.
// It reads one letter per group it returns, so a source that parks letters
// under many made-up reasons costs n reads, not one per reason.
func ListMost(ctx context.Context, js jetstream.JetStream, n int) (Listing, error) {
	s, err := js.Stream(ctx, events.DeadLetterStream)
	if err != nil {
		return Listing{}, fmt.Errorf("list dead letters: %w", err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(events.DeadLetterSubjects))
	if err != nil {
		return Listing{}, fmt.Errorf("list dead letters: %w", err)
	}
	type subject struct {
		name  string
		count uint64
	}
	subjects := make([]subject, 0, len(info.State.Subjects))
	var l Listing
	for name, count := range info.State.Subjects {
		subjects = append(subjects, subject{name, count})
		l.AllLetters += count
	}
	l.AllGroups = len(subjects)
	if n > 0 && len(subjects) > n {
		slices.SortFunc(subjects, func(a, b subject) int {
			if c := cmp.Compare(b.count, a.count); c != 0 {
				return c
			}
			return strings.Compare(a.name, b.name)
		})
		subjects = subjects[:n]
	}
	l.Groups = make([]Group, 0, len(subjects))
	for _, subj := range subjects {
		last, err := s.GetLastMsgForSubject(ctx, subj.name)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // redriven or expired since Info
		}
		if err != nil {
			return Listing{}, fmt.Errorf("list dead letters: newest on %s: %w", subj.name, err)
		}
		lt := letterFrom(last)
		l.Groups = append(l.Groups, Group{Source: lt.Source, Reason: lt.Reason, Count: subj.count, Newest: lt})
	}
	sortGroups(l.Groups)
	return l, nil
}

func sortGroups(g []Group) {
	for i := 1; i < len(g); i++ {
		for j := i; j > 0 && (g[j].Source < g[j-1].Source || g[j].Source == g[j-1].Source && g[j].Reason < g[j-1].Reason); j-- {
			g[j], g[j-1] = g[j-1], g[j]
		}
	}
}

// Filter is the subject filter of the dead letters of source (all sources
// if empty) and reason (all reasons if empty).
func Filter(source, reason string) string {
	switch {
	case source == "" && reason == "":
		return events.DeadLetterSubjects
	case reason == "":
		return "dead." + source + ".*"
	case source == "":
		return "dead.*." + reason
	}
	return events.DeadLetterSubject(source, reason)
}

// Each calls fn for every dead letter on subjects matching filter, oldest
// first, that was stored when Each started: letters parked meanwhile (for
// example a redriven message that failed again) are left for the next run.
// It stops at the first error fn returns.
func Each(ctx context.Context, js jetstream.JetStream, filter string, fn func(Letter) error) error {
	s, err := js.Stream(ctx, events.DeadLetterStream)
	if err != nil {
		return fmt.Errorf("read dead letters: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("read dead letters: %w", err)
	}
	last := info.State.LastSeq
	for seq := info.State.FirstSeq; seq <= last && seq > 0; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read dead letters from %d: %w", seq, err)
		}
		if m.Sequence > last {
			return nil
		}
		if err := fn(letterFrom(m)); err != nil {
			return err
		}
		seq = m.Sequence + 1
	}
	return nil
}

// Redriven is the outcome of one Redrive.
type Redriven struct {
	// Letter is the dead letter that was redriven (and is now deleted).
	Letter Letter
	// Subject and Stream are where it went; Seq is its new sequence there.
	Subject string
	Stream  string
	Seq     uint64
	// Duplicate is true when the target stream had already stored this
	// redrive (a retried redrive within its duplicate window).
	Duplicate bool
}

// Redrive sends the dead letter at seq back to the subject it came from and
// deletes it once the target stream acknowledged the publish.
func Redrive(ctx context.Context, js jetstream.JetStream, seq uint64) (Redriven, error) {
	l, err := Get(ctx, js, seq)
	if err != nil {
		return Redriven{}, fmt.Errorf("redrive: %w", err)
	}
	return RedriveLetter(ctx, js, l)
}

// RedriveLetter is Redrive for a letter already read (by Each or Get). A
// consumer group's letter of a click is redriven only if CLICKS still holds
// the click at the letter's sequence, with its subject and payload; what is
// published is that stored click. Otherwise the error wraps ErrOriginalGone
// or ErrOriginalDiffers (both ErrNotRedrivable) and the letter stays.
func RedriveLetter(ctx context.Context, js jetstream.JetStream, l Letter) (Redriven, error) {
	subj, orig, err := target(ctx, js, l)
	if err != nil {
		return Redriven{}, fmt.Errorf("redrive: %w", err)
	}
	m := nats.NewMsg(subj)
	m.Data = l.Data
	header := l.Header
	if orig != nil {
		m.Data, header = orig.Data, orig.Header
	}
	for k, vs := range header {
		if strings.HasPrefix(k, "Snip-Dead-") || strings.HasPrefix(k, "Nats-") {
			continue
		}
		m.Header[k] = vs
	}
	id := l.ID
	if id == "" {
		id = events.DeadLetterStream
	}
	seqStr := strconv.FormatUint(l.Seq, 10)
	m.Header.Set(events.HeaderMsgID, redriveMsgID(id, l))
	m.Header.Set(HeaderRedriveOf, seqStr)
	ack, err := js.PublishMsg(ctx, m, jetstream.WithExpectStream(l.Stream))
	if err != nil {
		return Redriven{}, fmt.Errorf("redrive dead letter %d to %s: %w", l.Seq, subj, err)
	}
	s, err := js.Stream(ctx, events.DeadLetterStream)
	if err != nil {
		return Redriven{}, fmt.Errorf("redrive dead letter %d: published, not deleted: %w", l.Seq, err)
	}
	if err := DeleteIfPresent(ctx, s, l.Seq); err != nil {
		return Redriven{}, fmt.Errorf("redrive dead letter %d: published, not deleted: %w", l.Seq, err)
	}
	return Redriven{Letter: l, Subject: subj, Stream: ack.Stream, Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// Redrivable is the subject RedriveLetter would publish l to, or why it
// would not: RedriveSubject, and for a consumer group's letter of a click,
// whether CLICKS still holds that click as the letter has it. It publishes
// nothing (snipctl dlq show and the console's letter view say it).
func Redrivable(ctx context.Context, js jetstream.JetStream, l Letter) (string, error) {
	subj, _, err := target(ctx, js, l)
	return subj, err
}

// target is l's redrive subject and, for a consumer group's letter of a
// click, the click CLICKS stores at the letter's sequence, checked against
// the letter. The letter's headers and payload are the word of whoever
// published it: every group's NATS user may publish its own dead.<group>.>,
// so without this check one (the webhooks', say) could plant a letter of a
// click that never happened, and an operator's redrive would publish it to
// CLICKS for every reader to count. A group parks a click it read from
// CLICKS, with its stored subject and payload; the outbox relay's letters
// (a click that never reached CLICKS) may be published by the redirect's
// user alone, which may publish clicks anyway. A letter that copies a click
// CLICKS does hold (its user can read CLICKS) redrives a copy of that real
// click, as a genuine letter does: with its event ID, which the readers
// skip within their windows.
func target(ctx context.Context, js jetstream.JetStream, l Letter) (string, *jetstream.RawStreamMsg, error) {
	subj, err := l.RedriveSubject()
	if err != nil || l.Stream != events.ClicksStream || l.Source == OutboxSource {
		return subj, nil, err
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return "", nil, fmt.Errorf("dead letter %d: read its original, %s seq %d: %w", l.Seq, events.ClicksStream, l.OrigSeq, err)
	}
	m, err := s.GetMsg(ctx, l.OrigSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", nil, fmt.Errorf("dead letter %d of %q names %s seq %d, but %w", l.Seq, l.Source, events.ClicksStream, l.OrigSeq, ErrOriginalGone)
	}
	if err != nil {
		return "", nil, fmt.Errorf("dead letter %d: read its original, %s seq %d: %w", l.Seq, events.ClicksStream, l.OrigSeq, err)
	}
	if m.Subject != l.OrigSubject || !bytes.Equal(m.Data, l.Data) {
		return "", nil, fmt.Errorf("dead letter %d of %q names %s seq %d, which holds %d bytes on %s where the letter has %d bytes on %s: %w",
			l.Seq, l.Source, events.ClicksStream, l.OrigSeq, len(m.Data), m.Subject, len(l.Data), l.OrigSubject, ErrOriginalDiffers)
	}
	return subj, m, nil
}

// redriveMsgID is the Nats-Msg-Id of l's redrive, id being its payload's ID
// (or the stream name): "<id>:redrive:<stream>:<original seq>" for a letter
// of a stored message, so the letters two sources parked of one message
// (every consumer group of CLICKS parks an event of an unknown version)
// redrive it once within the target stream's duplicate window, and every
// group reads that one copy; "<id>:redrive:<dead seq>" for a letter of a
// message that never reached its stream (one source parks it, once).
func redriveMsgID(id string, l Letter) string {
	if l.OrigSeq > 0 {
		return id + ":redrive:" + l.Stream + ":" + strconv.FormatUint(l.OrigSeq, 10)
	}
	return id + ":redrive:" + strconv.FormatUint(l.Seq, 10)
}

// DeleteIfPresent deletes the message at seq from s; a message that is
// already gone (deleted by another path, or acked off a work queue) is not an
// error. The server answers a delete of a missing message with a generic
// failure, so absence is confirmed with a read.
func DeleteIfPresent(ctx context.Context, s jetstream.Stream, seq uint64) error {
	err := s.DeleteMsg(ctx, seq)
	if err == nil {
		return nil
	}
	if _, gerr := s.GetMsg(ctx, seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
		return nil
	}
	return fmt.Errorf("delete %s seq %d: %w", s.CachedInfo().Config.Name, seq, err)
}

// safePosition reports whether a Parcel's Position can go into a
// Nats-Msg-Id: one to 64 printable characters without spaces or colons.
func safePosition(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == ':' {
			return false
		}
	}
	return true
}
