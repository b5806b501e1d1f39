package reader

import (
	"testing"
	"time"
)

// TestAMemberWhoseLeaseLapsedBeforeItLeftHoldsNothing: a member leaving the
// group holds its partitions while its workers drain (it deleted its lease
// on purpose), but only if its lease lived when it left. One whose lease had
// lapsed by its own clock (frozen, or cut off from NATS, and stopped before
// a heartbeat noticed) may have had its partitions taken meanwhile: its
// workers must not ack the batches they hold. Before, leaving made every
// lease count as held.
func TestAMemberWhoseLeaseLapsedBeforeItLeftHoldsNothing(t *testing.T) {
	lapsed := &member{clock: time.Now().Add(-10 * time.Second)}
	lapsed.leaseUntil.Store(int64(3 * time.Second)) // lived until 7 s ago
	if lapsed.leaseHeld() {
		t.Fatal("a lease that lapsed 7 s ago is held")
	}
	lapsed.leave()
	if lapsed.leaseHeld() {
		t.Error("a member whose lease had lapsed when it left holds its partitions while its workers drain")
	}

	live := &member{clock: time.Now()}
	live.leaseUntil.Store(int64(time.Minute))
	live.leave()
	if !live.leaseHeld() {
		t.Error("a member whose lease lived when it left does not hold its partitions while its workers drain")
	}
}
