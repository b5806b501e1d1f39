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
const (
	MaxLagSeconds = 10
	MaxCatchUp    = 10 * time.Second
)

// KeepUp is the keep-up verdict of a run whose readers were watched.
type KeepUp struct {
	Readers []ReaderLag `json:"readers"`
	// KeptUp: every reader bounded and caught up within MaxCatchUp.
	KeptUp bool `json:"kept_up"`
	// MaxLag is the bound on a reader's lag in the second half, in events.
	MaxLag uint64 `json:"max_lag"`
}

// ReaderLag is one reader's peak lag in each half of the load.
type ReaderLag struct {
	Reader     string `json:"reader"`
	FirstHalf  uint64 `json:"first_half_peak"`
	SecondHalf uint64 `json:"second_half_peak"`
	Bounded    bool   `json:"bounded"`
}

// KeepUpOf judges a run by the keep-up rule, from the lag its seconds
// recorded during the load; nil when no reader's lag was recorded.
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
		l := ReaderLag{Reader: name}
		for i, s := range load {
			if i < half {
				l.FirstHalf = max(l.FirstHalf, s.Lag[name])
			} else {
				l.SecondHalf = max(l.SecondHalf, s.Lag[name])
			}
		}
		l.Bounded = l.SecondHalf <= k.MaxLag
		k.KeptUp = k.KeptUp && l.Bounded
		k.Readers = append(k.Readers, l)
	}
	sort.Slice(k.Readers, func(i, j int) bool { return k.Readers[i].Reader < k.Readers[j].Reader })
	return k
}
