package events

import (
	"fmt"
	"time"

	"github.com/google/uuid"
)

// NewID returns a new event ID: a UUIDv7, so IDs sort by creation time and
// carry it (IDTime). Assign it once, where the event happens, and never again.
func NewID() string {
	id, err := uuid.NewV7()
	if err != nil {
		// uuid.NewV7 fails only if the system's random source fails, and then
		// nothing else in the process can be trusted either.
		panic(fmt.Sprintf("events: generate UUIDv7: %v", err))
	}
	return id.String()
}

// IDTime returns the millisecond timestamp inside a UUIDv7 event ID.
func IDTime(id string) (time.Time, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return time.Time{}, fmt.Errorf("parse event id %q: %w", id, err)
	}
	if u.Version() != 7 {
		return time.Time{}, fmt.Errorf("event id %q is UUID version %d, want 7", id, u.Version())
	}
	sec, nsec := u.Time().UnixTime()
	return time.Unix(sec, nsec).UTC(), nil
}

func validID(id string) bool {
	u, err := uuid.Parse(id)
	return err == nil && u.Version() == 7 && len(id) == 36
}
