package counter

import (
	"encoding/hex"
	"fmt"
	"time"
)

// IDBucketWidth is the span of event-ID time that one dedup record key
// covers. The record of a partition is split into keys by the time inside
// the UUIDv7 event ID, so the copy of an event is always looked up in the
// key its first copy was recorded in. The batch script reads each key its
// batch touches whole, so a batch pays for what the partition received in
// those keys' spans, not only for its own events: a reader that keeps up
// reads small batches, and with 100 ms keys a viral link's partition at
// 50,000 events/s scanned up to 5,000 fingerprints for every batch of a few
// hundred. At 20 ms a key holds at most 1,000 there (250 at 100,000/s over
// 8 partitions); with the script's scan turned round (it indexes the batch
// and runs through the key) Redis's CPU per click on that partition fell
// from 4.7-5.2 to about 2 µs (BenchmarkApplyLive, decision 0173). A key
// costs about 150 bytes of Redis memory of its own, and an entry of about
// 120 in its generation's index. A key is dropped once the partition's
// position (the stored time of the events counted) is a window past its
// events, or when its TTL of the window runs out: live, at most
// window/IDBucketWidth keys per partition and generation, 30,000 (8 MB
// with the index) for the default 10-minute window, whatever the rate; in
// a catch-up, which counts hours of clicks in minutes, as many as the last
// window of positions holds (the TTL alone kept every key the catch-up
// touched in its last ten minutes of wall time: one per click of a quiet
// link).
const IDBucketWidth = 20 * time.Millisecond

// FingerprintLen is the size of an event's dedup fingerprint: the last 8
// bytes of its UUIDv7, 62 of them random. Two different events in one 20 ms
// bucket share a fingerprint with probability about n/2^62 (n = events in
// the bucket): at 100k events/s, once in millions of years.
const FingerprintLen = 8

// IDMark is how an event ID is recorded and looked up for deduplication.
type IDMark struct {
	// Time is the millisecond timestamp inside the UUIDv7.
	Time time.Time
	// Bucket is Time in IDBucketWidth units since the epoch.
	Bucket int64
	// Fingerprint is the ID's last 8 bytes.
	Fingerprint [FingerprintLen]byte
}

// ParseID reads the timestamp and fingerprint of a UUIDv7 event ID in its
// canonical 36-character form. The runtime has already validated click IDs;
// verdicts carry validated click IDs too.
func ParseID(id string) (IDMark, error) {
	if len(id) != 36 || id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' {
		return IDMark{}, fmt.Errorf("parse event id %q: not a canonical UUID", id)
	}
	var ts [8]byte
	if _, err := hex.Decode(ts[2:6], []byte(id[0:8])); err != nil {
		return IDMark{}, fmt.Errorf("parse event id %q: %w", id, err)
	}
	if _, err := hex.Decode(ts[6:8], []byte(id[9:13])); err != nil {
		return IDMark{}, fmt.Errorf("parse event id %q: %w", id, err)
	}
	var m IDMark
	if _, err := hex.Decode(m.Fingerprint[0:2], []byte(id[19:23])); err != nil {
		return IDMark{}, fmt.Errorf("parse event id %q: %w", id, err)
	}
	if _, err := hex.Decode(m.Fingerprint[2:8], []byte(id[24:36])); err != nil {
		return IDMark{}, fmt.Errorf("parse event id %q: %w", id, err)
	}
	var ms int64
	for _, b := range ts {
		ms = ms<<8 | int64(b)
	}
	m.Time = time.UnixMilli(ms).UTC()
	m.Bucket = ms / IDBucketWidth.Milliseconds()
	return m, nil
}

// LabelDay is the UTC day a click's verdict label is filed under: the day
// of the time inside its event ID, which the counting path and the verdict
// path both know.
func (m IDMark) LabelDay() Day { return DayOf(m.Time) }
