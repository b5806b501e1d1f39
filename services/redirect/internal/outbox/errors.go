package outbox

import "errors"

var (
	// ErrFull means the shard's outbox holds its maximum number of entries
	// (NATS has been away for a while); the write was not attempted.
	ErrFull = errors.New("outbox full")
	// ErrUnavailable means the outbox could not be written (Redis down or
	// too slow); the entry may or may not be stored.
	ErrUnavailable = errors.New("outbox unavailable")
	// ErrNotReplicated means Redis stored the entry (on the master), but
	// fewer replicas than CommitterConfig.WaitReplicas acknowledged it within
	// WaitTimeout: the entry is lost if that master dies before its replicas
	// catch up.
	ErrNotReplicated = errors.New("outbox entry not acknowledged by enough replicas")
	// ErrClosed means the committer is shut down.
	ErrClosed = errors.New("outbox committer closed")
	// ErrShardsChanged means Redis already holds an outbox with a different
	// shard count; changing it would strand links and events in old shards.
	ErrShardsChanged = errors.New("outbox shard count differs from the one in Redis")
)
