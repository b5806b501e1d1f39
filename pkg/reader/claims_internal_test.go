package reader

import (
	"slices"
	"testing"
	"time"
)

// TestAHeartbeatClaimsNothingOnceTheLeaseMayHaveLapsed: the partitions a
// heartbeat claims are the control loop's, whose tick can come after the
// heartbeat's. A process frozen past its lease (or one whose heartbeats
// went unanswered) sends its first heartbeat back claiming nothing, as it
// gives everything up, and so does one whose heartbeat was stored after a
// lapse the control loop has not yet acted on. Before, it claimed what it
// held before the lapse, which others had taken meanwhile.
func TestAHeartbeatClaimsNothingOnceTheLeaseMayHaveLapsed(t *testing.T) {
	m := &member{clock: time.Now().Add(-10 * time.Second)}
	m.published.Store(&claim{owned: []int{0, 2}})
	m.leaseUntil.Store(int64(time.Minute))
	if got := m.heartbeatClaims(); !slices.Equal(got, []int{0, 2}) {
		t.Fatalf("a member whose lease lives claims %v, want [0 2]", got)
	}

	m.leaseUntil.Store(int64(3 * time.Second)) // lived until 7 s ago
	if got := m.heartbeatClaims(); len(got) != 0 {
		t.Errorf("a member whose lease lapsed 7 s ago claims %v, want nothing", got)
	}

	m.leaseUntil.Store(int64(time.Minute))
	m.lapses.Add(1) // a heartbeat stored after a lapse; the control loop has not acted on it
	if got := m.heartbeatClaims(); len(got) != 0 {
		t.Errorf("a member back from a lapse its control loop has not acted on claims %v, want nothing", got)
	}
	m.published.Store(&claim{owned: []int{1}, lapses: 1}) // assigned afresh after it
	if got := m.heartbeatClaims(); !slices.Equal(got, []int{1}) {
		t.Errorf("a member that took partitions afresh after a lapse claims %v, want [1]", got)
	}
}
