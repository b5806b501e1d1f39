package workload

import (
	"crypto/rand"
	"encoding/binary"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Tag names one run. Everything a run creates carries it (link codes,
// request IDs, event IDs), so the oracle can tell the run's clicks from any
// other traffic, and a second run with the same seed is not mistaken for a
// duplicate of the first by JetStream's duplicate window.
type Tag uint64

// TagBits is the size of a tag: it must fit in a UUIDv7 next to a sequence.
const TagBits = 34

// SeqBits is the largest click sequence an event ID can carry: 2^40 clicks,
// four months at 100,000 a second.
const SeqBits = 40

// NewTag returns a random tag.
func NewTag() Tag {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return Tag(binary.BigEndian.Uint64(b[:]) & (1<<TagBits - 1))
}

// String is the tag in base 36, as it appears in codes and request IDs.
func (t Tag) String() string { return strconv.FormatUint(uint64(t), 36) }

// ParseTag reads a tag written by String.
func ParseTag(s string) (Tag, bool) {
	n, err := strconv.ParseUint(s, 36, 64)
	if err != nil || n >= 1<<TagBits {
		return 0, false
	}
	return Tag(n), true
}

// LinkCode is the code of link i of the run: "lt-<tag>-<i>" in base 36, at
// most 18 characters, valid as a custom code and as a subject token.
func (t Tag) LinkCode(i int) string {
	return "lt-" + t.String() + "-" + strconv.FormatUint(uint64(i), 36)
}

// RequestID is the X-Request-ID the HTTP driver sends with click seq; the
// redirect copies it into the click, so every click in the log names the
// request that made it.
func (t Tag) RequestID(seq uint64) string {
	return "lt-" + t.String() + "-" + strconv.FormatUint(seq, 10)
}

// ParseRequestID returns the click sequence of a request ID of this run.
func (t Tag) ParseRequestID(id string) (uint64, bool) {
	rest, ok := strings.CutPrefix(id, "lt-"+t.String()+"-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(rest, 10, 64)
	return n, err == nil
}

// EventID is the event ID the events driver gives click seq published at
// at: a valid UUIDv7 (millisecond time, version and variant bits as RFC 9562
// says) whose 74 random bits are the tag and the sequence instead. That
// makes the set of a run's IDs checkable without storing it: any ID maps
// back to its click, or is not the run's.
func (t Tag) EventID(seq uint64, at time.Time) string {
	var u uuid.UUID
	ms := uint64(at.UnixMilli())
	u[0], u[1], u[2], u[3], u[4], u[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	a := uint64(t) >> (TagBits - 12) // the tag's top 12 bits
	b := (uint64(t)&(1<<(TagBits-12)-1))<<SeqBits | seq&(1<<SeqBits-1)
	u[6] = 0x70 | byte(a>>8)
	u[7] = byte(a)
	u[8] = 0x80 | byte(b>>56)&0x3f
	for i := range 7 {
		u[9+i] = byte(b >> (48 - 8*i))
	}
	return u.String()
}

// ParseEventID returns the click sequence of an event ID made by EventID
// with this tag.
func (t Tag) ParseEventID(id string) (uint64, bool) {
	u, err := uuid.Parse(id)
	if err != nil {
		return 0, false
	}
	return t.SeqOfUUID(u)
}

// SeqOfUUID is ParseEventID for a parsed ID.
func (t Tag) SeqOfUUID(u uuid.UUID) (uint64, bool) {
	if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
		return 0, false
	}
	a := uint64(u[6]&0x0f)<<8 | uint64(u[7])
	b := uint64(u[8]&0x3f) << 56
	for i := range 7 {
		b |= uint64(u[9+i]) << (48 - 8*i)
	}
	tag := a<<(TagBits-12) | b>>SeqBits
	if Tag(tag) != t {
		return 0, false
	}
	return b & (1<<SeqBits - 1), true
}
