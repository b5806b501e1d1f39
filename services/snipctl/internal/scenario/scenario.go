// Package scenario runs Snip's messaging lessons as experiments: each
// scenario starts real components (an embedded nats-server, a redis-server
// where it needs one), runs the naive design next to Snip's where the idea has
// one, and compares what it measured with what the lesson predicts.
//
// Scenarios reuse Snip's own packages (pkg/reader consumer groups,
// pkg/topology's stream and consumer declarations, pkg/deadletter, pkg/events
// partitioning), so what a scenario teaches is what runs in production.
//
// # Speed
//
// Every scenario is written in "lesson time": rates in events per second and
// durations in seconds, as the lesson states them. Speed X multiplies every
// rate by X and divides every duration by X, so counts (rate x duration),
// ratios and orderings are unchanged. Measured rates are divided by X and
// measured durations multiplied by X before they are compared, so the
// predicted column is the same at every speed. Server-side timers that a
// scenario sets itself (ack waits, backoff schedules) are scaled too; timers
// that the production code fixes (a reader's one-second lease granularity)
// are not, and the scenarios that meet one say so.
package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sort"
	"strings"
	"time"
)

// ErrUnknown is returned for a scenario name that is not in the list.
var ErrUnknown = errors.New("unknown scenario")

// ErrBadSpeed is returned for a speed outside [MinSpeed, MaxSpeed].
var ErrBadSpeed = errors.New("speed out of range")

// Speed bounds. Above MaxSpeed the rates of the busier scenarios exceed what
// one small machine can publish and consume while measuring itself.
const (
	MinSpeed = 0.1
	MaxSpeed = 20.0
)

// Scenario is one runnable lesson.
type Scenario struct {
	// Name is what `snipctl scenario run NAME` takes.
	Name string
	// Claim is the lesson in one sentence.
	Claim string
	// Needs lists the servers it starts, for the list command.
	Needs string
	// Lesson is the scenario's nominal length in lesson time.
	Lesson time.Duration
	run    func(ctx context.Context, e *Env) error
}

// All returns every scenario, in the order of the lessons.
func All() []Scenario {
	return []Scenario{
		kitchen, rush, thursday, sixOfTen, poison, crashPoints, outbox, hotPartition, repartition, backpressure,
	}
}

// Lookup finds a scenario by name.
func Lookup(name string) (Scenario, error) {
	for _, s := range All() {
		if s.Name == name {
			return s, nil
		}
	}
	names := make([]string, 0, 10)
	for _, s := range All() {
		names = append(names, s.Name)
	}
	return Scenario{}, fmt.Errorf("%w %q (have: %v)", ErrUnknown, name, names)
}

// Options configure a run.
type Options struct {
	// Speed compresses time (see the package doc); 1 is lesson time.
	Speed float64
	// Progress, if set, receives a line per phase while the scenario runs.
	Progress io.Writer
	// Log receives the components' logs (default: discard).
	Log *slog.Logger
}

// Run runs one scenario and returns its result. The result's Pass says
// whether every measurement was within its tolerance; an error means the
// scenario could not run at all.
func Run(ctx context.Context, s Scenario, o Options) (*Result, error) {
	if o.Speed == 0 {
		o.Speed = 1
	}
	if math.IsNaN(o.Speed) || o.Speed < MinSpeed || o.Speed > MaxSpeed {
		return nil, fmt.Errorf("speed %g, want %g..%g: %w", o.Speed, MinSpeed, MaxSpeed, ErrBadSpeed)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	e := &Env{speed: o.Speed, progress: o.Progress, log: o.Log, res: &Result{Scenario: s.Name, Claim: s.Claim, Speed: o.Speed}}
	defer e.close()
	start := time.Now()
	if err := s.run(ctx, e); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", s.Name, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", s.Name, err)
	}
	e.res.Wall = time.Since(start).Round(time.Millisecond).String()
	e.res.judge()
	return e.res, nil
}

// judge sets Pass and Inconclusive from the checks. A premise row not met
// makes the run inconclusive: the rows that hold only on a machine that met
// it are then not judged, and Pass says whether the rows that hold at any
// speed are within their tolerances.
func (r *Result) judge() {
	var unmet []string
	for _, c := range r.Checks {
		if c.Premise && !c.OK {
			unmet = append(unmet, c.Name)
		}
	}
	r.Inconclusive = ""
	if len(unmet) > 0 {
		r.Inconclusive = "the machine was too busy for the lesson's premise (" + strings.Join(unmet, "; ") + ")"
	}
	for i := range r.Checks {
		r.Checks[i].Unjudged = len(unmet) > 0 && r.Checks[i].NeedsPremise
	}
	r.Pass = len(r.failed()) == 0
}

// failed returns the names of the rows that count against the run: judged,
// not a premise, and outside their tolerance.
func (r *Result) failed() []string {
	var names []string
	for _, c := range r.Checks {
		if !c.OK && !c.Premise && !c.Unjudged {
			names = append(names, c.Name)
		}
	}
	return names
}

// Result is what a run measured.
type Result struct {
	Scenario string   `json:"scenario"`
	Claim    string   `json:"claim"`
	Speed    float64  `json:"speed"`
	Checks   []Check  `json:"checks"`
	Series   []Series `json:"series,omitempty"`
	Notes    []string `json:"notes,omitempty"`
	// Pass is true when every judged check is within its tolerance.
	Pass bool `json:"pass"`
	// Inconclusive, when set, names the premises the machine did not meet
	// (it was too busy to offer the load, or to let a member run at its
	// capacity): the rows that need them were not judged, and Pass covers
	// only the rows that hold at any speed.
	Inconclusive string `json:"inconclusive,omitempty"`
	// Wall is how long the run took in real time.
	Wall string `json:"wall"`
}

// Check is one predicted-vs-measured row.
type Check struct {
	Name      string  `json:"name"`
	Unit      string  `json:"unit,omitempty"`
	Predicted float64 `json:"predicted"`
	Measured  float64 `json:"measured"`
	// Tolerance says how far Measured may be from Predicted, in words
	// ("±20%", "exact", "≤ 3"), and why in Why.
	Tolerance string `json:"tolerance"`
	Why       string `json:"why,omitempty"`
	OK        bool   `json:"ok"`
	// Premise marks a row that measures the machine, not the lesson: a
	// premise not met makes the run inconclusive instead of failed.
	Premise bool `json:"premise,omitempty"`
	// NeedsPremise marks a row that is valid only when every premise row
	// was met (a rate or a ratio that a starved machine would distort);
	// the other rows hold at any speed and are judged always.
	NeedsPremise bool `json:"needs_premise,omitempty"`
	// Unjudged is set on a NeedsPremise row when a premise was not met: its
	// OK is shown but not counted.
	Unjudged bool `json:"unjudged,omitempty"`
}

// Series is a quantity sampled over lesson time, for the chart.
type Series struct {
	Name string `json:"name"`
	Unit string `json:"unit,omitempty"`
	// Step is the lesson time between samples, in seconds.
	Step   float64   `json:"step_s"`
	Values []float64 `json:"values"`
}

// jsonFloat is a float64 that JSON encodes as null where it has no number
// for it: NaN (an alarm that never fired, a lead between two alarms one of
// which never did) and the infinities. encoding/json refuses them, and
// `scenario run --json` printed nothing but the encoder's error for a run
// whose result held one.
type jsonFloat float64

func (f jsonFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(v)
}

// MarshalJSON encodes the check with a Predicted or Measured that is not a
// number as null.
func (c Check) MarshalJSON() ([]byte, error) {
	type plain Check // without this method
	return json.Marshal(struct {
		plain
		Predicted jsonFloat `json:"predicted"`
		Measured  jsonFloat `json:"measured"`
	}{plain(c), jsonFloat(c.Predicted), jsonFloat(c.Measured)})
}

// MarshalJSON encodes the series with a value that is not a number as null.
func (s Series) MarshalJSON() ([]byte, error) {
	type plain Series // without this method
	vals := make([]jsonFloat, len(s.Values))
	for i, v := range s.Values {
		vals[i] = jsonFloat(v)
	}
	return json.Marshal(struct {
		plain
		Values []jsonFloat `json:"values"`
	}{plain(s), vals})
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}
