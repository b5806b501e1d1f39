package report

import (
	"sort"
	"time"

	"github.com/snipdev/snip/loadtest/internal/series"
)

// The keep-up rule: a reader kept up with a run when its lag stayed
// bounded, read as "at most MaxLagSeconds of the offered load at any second
// of the load's second half", and the run caught up (every reader had its
// last event) within MaxCatchUp of the load's end. The first half is
// reported but not judged: a reader starting cold (a new group, a GC) may
// fall behind early and catch up, which is not falling behind.
//
// A reader is judged only on backlog reads: a second in which no read of
// its backlog finished (series.Second.LagRead false, or the reader absent
// from the read) is unknown, not within bounds. A reader whose lag is
// unknown in more than a quarter of the second half's seconds (fresh in
// fewer than MinFreshPercent of them) has an unknown verdict, and the run
// is not kept up. The allowance is for a read that outlasts its second on
// a loaded machine (reads run back to back, one a second at most, so one
// such read leaves a second without one); a run whose reads fail for long
// is not judged on the figures of before.
//
// A run that did not get to the judgement has an unknown verdict, neither
// kept up nor not: one whose load ended before its --duration (stopped
// during it, or the driver stopped early: its second half is not the
// load's), or one stopped before its catch-up was seen (it stopped
// waiting; no reader was seen behind).
const (
	MaxLagSeconds   = 10
	MaxCatchUp      = 10 * time.Second
	MinFreshPercent = 75
)

// KeepUp is the keep-up verdict of a run whose readers were watched.
type KeepUp struct {
	Readers []ReaderLag `json:"readers"`
	// KeptUp: every reader bounded and caught up within MaxCatchUp.
	// False when Unknown says why the run was not judged.
	KeptUp bool `json:"kept_up"`
	// Unknown, if set, says why the run was not judged: it was stopped
	// or cut short before the rule could be applied. The readers' lags
	// are still reported.
	Unknown string `json:"unknown,omitempty"`
	// MaxLag is the bound on a reader's lag in the second half, in events.
	MaxLag uint64 `json:"max_lag"`
}

// ReaderLag is one reader's peak lag in each half of the load, of the
// seconds in which its backlog was read.
type ReaderLag struct {
	Reader     string `json:"reader"`
	FirstHalf  uint64 `json:"first_half_peak"`
	SecondHalf uint64 `json:"second_half_peak"`
	// Read is in how many of the second half's Seconds a read of the
	// reader's backlog finished.
	Read    int `json:"second_half_seconds_read"`
	Seconds int `json:"second_half_seconds"`
	// Unknown: read in fewer than MinFreshPercent of the seconds; the
	// reader is not Bounded, whatever its peak.
	Unknown bool `json:"unknown,omitempty"`
	Bounded bool `json:"bounded"`
}

// KeepUpOf judges a run by the keep-up rule, from the lag its seconds
// recorded during the load, each second's only where a backlog read
// finished in it; nil when no reader's lag was recorded.
func KeepUpOf(r *Report) *KeepUp {
	var load []series.Second
	for _, s := range r.Summary.Seconds {
		if s.Phase == series.PhaseLoad {
			load = append(load, s)
		}
	}
	names := map[string]bool{}
	for _, s := range load {
		for k := range s.Lag {
			names[k] = true
		}
	}
	if len(names) == 0 {
		return nil
	}
	k := &KeepUp{MaxLag: uint64(r.Rate) * MaxLagSeconds, KeptUp: r.CatchUp >= 0 && r.CatchUp <= MaxCatchUp}
	half := len(load) / 2
	for name := range names {
		l := ReaderLag{Reader: name, Seconds: len(load) - half}
		for i, s := range load {
			lag, ok := s.Lag[name]
			if !ok || !s.LagRead {
				continue // an earlier read's figure, or none: unknown
			}
			if i < half {
				l.FirstHalf = max(l.FirstHalf, lag)
			} else {
				l.SecondHalf = max(l.SecondHalf, lag)
				l.Read++
			}
		}
		l.Unknown = l.Read*100 < l.Seconds*MinFreshPercent
		l.Bounded = !l.Unknown && l.SecondHalf <= k.MaxLag
		k.KeptUp = k.KeptUp && l.Bounded
		k.Readers = append(k.Readers, l)
	}
	sort.Slice(k.Readers, func(i, j int) bool { return k.Readers[i].Reader < k.Readers[j].Reader })
	switch {
	case r.LoadCut && r.Stopped:
		k.Unknown = "the run was stopped during the load"
	case r.LoadCut:
		k.Unknown = "the load ended before its duration (the driver stopped early)"
	case r.Stopped && r.CatchUp < 0:
		k.Unknown = "the run was stopped before its catch-up was seen"
	}
	if k.Unknown != "" {
		k.KeptUp = false
	}
	return k
}
