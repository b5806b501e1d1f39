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

// validID reports whether id is a UUIDv7 in the 36-character text form:
// what uuid.Parse accepts at that length (hex digits of either case, hyphens
// at 8, 13, 18 and 23) with version digit 7, checked without decoding it
// (every reader checks every click's ID; TestValidIDAgreesWithUUIDParse).
func validID(id string) bool {
	if len(id) != 36 || id[14] != '7' {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	return true
}
