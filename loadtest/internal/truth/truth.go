// Package truth is what a load test run knows for certain: the traffic model
// it used and, for every click it tried to send, what came of it. A 302 (or
// a publish ack) means the click must reach every reader exactly once; a
// definite refusal (404, 503 "not recorded") means it must reach none; no
// answer (a timeout, a dropped connection) means it may reach them once, or
// not at all, but never twice.
//
// The truth is small on purpose: the Spec recomputes every click, and only
// the clicks whose outcome was not "sent" are listed, so a run of millions of
// clicks saves a file of a few kilobytes that `loadtest verify --truth` can
// check later.
package truth

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/snipdev/snip/loadtest/internal/workload"
)

// Version is the truth file format version.
const Version = 1

// Mode is how the clicks were sent.
type Mode string

// Modes.
const (
	// ModeHTTP: GET /:code on the redirect service; the click's request ID
	// names its sequence.
	ModeHTTP Mode = "http"
	// ModeEvents: published straight into CLICKS; the event ID names its
	// sequence.
	ModeEvents Mode = "events"
)

// Outcome is what came of one attempt to send a click.
type Outcome uint8

// Outcomes.
const (
	// NotSent: the driver never sent it. Readers must not have it.
	NotSent Outcome = iota
	// Sent: a 302 or a publish ack. Readers must have it exactly once.
	Sent
	// Refused: a definite answer that no click was recorded (404, 503
	// other than click_unconfirmed).
	// Readers must not have it.
	Refused
	// Uncertain: no answer, or one that says the click's fate is unknown
	// (503 click_unconfirmed). Readers may have it once.
	Uncertain
)

func (o Outcome) String() string {
	switch o {
	case NotSent:
		return "not sent"
	case Sent:
		return "sent"
	case Refused:
		return "refused"
	case Uncertain:
		return "uncertain"
	}
	return fmt.Sprintf("outcome(%d)", o)
}

// Truth is a run's ground truth, as saved to truth.json.
type Truth struct {
	Version int  `json:"version"`
	Mode    Mode `json:"mode"`
	// Tag names the run: link codes, request IDs and event IDs carry it.
	Tag string `json:"tag"`
	// Owner owns the run's links and clicks.
	Owner string        `json:"owner"`
	Spec  workload.Spec `json:"spec"`
	// Started and Ended bound the sending.
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended"`
	// Duration is the sending the run was asked for (--duration).
	Duration time.Duration `json:"duration_ns,omitempty"`
	// LoadCut, when set, says why the sending ended before Duration: the
	// run was stopped (Ctrl-C, SIGTERM) or the driver stopped early. What
	// was sent until then is still known click by click, so the oracle
	// judges those clicks; the load the run was asked for was not offered.
	LoadCut string `json:"load_cut,omitempty"`
	// ForwardedFor says the HTTP driver sent each visitor's address in
	// X-Forwarded-For.
	ForwardedFor bool `json:"forwarded_for,omitempty"`
	// Attempts is the number of clicks tried: sequences 0..Attempts-1.
	Attempts uint64 `json:"attempts"`
	// Refused and Uncertain list, sorted, the sequences with those
	// outcomes; every other sequence below Attempts was sent.
	Refused   []uint64 `json:"refused,omitempty"`
	Uncertain []uint64 `json:"uncertain,omitempty"`
	// Answers counts the answers by kind ("302", "503", "timeout", "ack").
	Answers map[string]uint64 `json:"answers,omitempty"`
}

// RunTag parses Tag.
func (t *Truth) RunTag() (workload.Tag, error) {
	tag, ok := workload.ParseTag(t.Tag)
	if !ok {
		return 0, fmt.Errorf("truth tag %q: %w", t.Tag, ErrBadTruth)
	}
	return tag, nil
}

// Outcome returns what came of click seq.
func (t *Truth) Outcome(seq uint64) Outcome {
	switch {
	case seq >= t.Attempts:
		return NotSent
	case contains(t.Refused, seq):
		return Refused
	case contains(t.Uncertain, seq):
		return Uncertain
	}
	return Sent
}

// SentCount is the number of clicks that must reach every reader.
func (t *Truth) SentCount() uint64 {
	return t.Attempts - uint64(len(t.Refused)) - uint64(len(t.Uncertain))
}

func contains(sorted []uint64, v uint64) bool {
	_, ok := slices.BinarySearch(sorted, v)
	return ok
}

// ErrBadTruth means a truth file cannot be used.
var ErrBadTruth = errors.New("invalid truth file")

// Validate checks what the oracle relies on.
func (t *Truth) Validate() error {
	switch {
	case t.Version != Version:
		return fmt.Errorf("version %d, this build reads %d: %w", t.Version, Version, ErrBadTruth)
	case t.Mode != ModeHTTP && t.Mode != ModeEvents:
		return fmt.Errorf("mode %q: %w", t.Mode, ErrBadTruth)
	case t.Owner == "":
		return fmt.Errorf("no owner: %w", ErrBadTruth)
	}
	if err := t.validExceptions(); err != nil {
		return err
	}
	if _, err := t.RunTag(); err != nil {
		return err
	}
	if err := t.Spec.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadTruth, err)
	}
	return nil
}

// validExceptions checks that each exception list is sorted, names each
// click once, only clicks below Attempts, and none in both lists: SentCount
// subtracts their lengths from Attempts, so a click listed twice, or one
// never attempted, would make the oracle wait for a click that is not
// coming and report a missing count wrapped around below zero.
func (t *Truth) validExceptions() error {
	for _, l := range []struct {
		name string
		seqs []uint64
	}{{"refused", t.Refused}, {"uncertain", t.Uncertain}} {
		if !slices.IsSorted(l.seqs) {
			return fmt.Errorf("%s list is not sorted: %w", l.name, ErrBadTruth)
		}
		for i, seq := range l.seqs {
			if i > 0 && l.seqs[i-1] == seq {
				return fmt.Errorf("%s click %d listed twice: %w", l.name, seq, ErrBadTruth)
			}
			if seq >= t.Attempts {
				return fmt.Errorf("%s click %d beyond the %d attempts: %w", l.name, seq, t.Attempts, ErrBadTruth)
			}
		}
	}
	for _, seq := range t.Refused {
		if contains(t.Uncertain, seq) {
			return fmt.Errorf("click %d both refused and uncertain: %w", seq, ErrBadTruth)
		}
	}
	return nil
}

// Save writes the truth to path as indented JSON.
func (t *Truth) Save(path string) error {
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return fmt.Errorf("save truth: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("save truth: %w", err)
	}
	return nil
}

// Load reads and validates a truth file.
func Load(path string) (*Truth, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load truth: %w", err)
	}
	var t Truth
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("load truth %s: %w: %v", path, ErrBadTruth, err)
	}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("load truth %s: %w", path, err)
	}
	return &t, nil
}

// Recorder collects outcomes while a driver runs. It is safe for concurrent
// use. It keeps one byte per click, so a 60 s run at 100,000 clicks/s holds
// 6 MB.
type Recorder struct {
	mu       sync.Mutex
	outcomes []Outcome
	answers  map[string]uint64
}

// NewRecorder returns an empty recorder with room for expected clicks.
func NewRecorder(expected int) *Recorder {
	return &Recorder{outcomes: make([]Outcome, 0, expected), answers: map[string]uint64{}}
}

// Record notes the outcome of click seq and the answer that decided it. A
// later record of the same click wins (a retried publish that succeeds).
func (r *Recorder) Record(seq uint64, o Outcome, answer string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if seq >= uint64(len(r.outcomes)) {
		if seq >= uint64(cap(r.outcomes)) {
			r.outcomes = slices.Grow(r.outcomes, int(seq+1)-len(r.outcomes))
		}
		r.outcomes = r.outcomes[:seq+1]
	}
	r.outcomes[seq] = o
	r.answers[answer]++
}

// Finish returns the truth for clicks 0..attempts-1. A click with no
// recorded outcome was handed to the network without an answer coming back,
// so it is uncertain.
func (r *Recorder) Finish(attempts uint64) (refused, uncertain []uint64, answers map[string]uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for seq := range attempts {
		o := NotSent
		if seq < uint64(len(r.outcomes)) {
			o = r.outcomes[seq]
		}
		switch o {
		case Refused:
			refused = append(refused, seq)
		case Uncertain, NotSent:
			uncertain = append(uncertain, seq)
		}
	}
	return refused, uncertain, maps.Clone(r.answers)
}
