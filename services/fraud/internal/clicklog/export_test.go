package clicklog

import "github.com/nats-io/nats.go/jetstream"

// NewWithFetch is New with a smaller fetch, so a test makes many pulls.
func NewWithFetch(js jetstream.JetStream, partitions, fetch int) *Log {
	l := New(js, partitions)
	l.fetch = fetch
	return l
}
