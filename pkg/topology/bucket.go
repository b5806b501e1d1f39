package topology

import (
	"context"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Bucket is one of the KV buckets Apply declares, as a service uses it: looked
// up by name on each use until a lookup finds it, then kept. Forget drops it,
// so the next use looks it up again (after an error that may mean the bucket
// was deleted and created again, or the connection's JetStream domain moved).
type Bucket struct {
	js   KeyValues
	name string

	mu sync.Mutex
	kv jetstream.KeyValue // once found
}

// KeyValues is what a Bucket needs of a JetStream context (jetstream.JetStream
// has it).
type KeyValues interface {
	KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error)
}

// NewBucket is the bucket name (MembersBucket, ConsoleSessionsBucket, ...) on js.
func NewBucket(js KeyValues, name string) *Bucket {
	return &Bucket{js: js, name: name}
}

// Get returns the bucket. Where it does not exist (the topology was not
// applied since the bucket was declared) the error wraps
// jetstream.ErrBucketNotFound and says to apply the topology.
func (b *Bucket) Get(ctx context.Context) (jetstream.KeyValue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kv != nil {
		return b.kv, nil
	}
	kv, err := b.js.KeyValue(ctx, b.name)
	if err != nil {
		return nil, fmt.Errorf("bucket %s (apply the topology: snipctl topology apply): %w", b.name, err)
	}
	b.kv = kv
	return kv, nil
}

// Forget drops the bucket found, so the next Get looks it up again.
func (b *Bucket) Forget() {
	b.mu.Lock()
	b.kv = nil
	b.mu.Unlock()
}
