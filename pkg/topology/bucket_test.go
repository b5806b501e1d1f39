package topology_test

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// TestABucketIsLookedUpUntilFoundThenKept: before Apply the bucket is not
// found (the error says so, and what to do); after it, Get finds it and
// keeps it, so a bucket deleted meanwhile is still the one handed out until
// Forget, after which Get looks it up again.
func TestABucketIsLookedUpUntilFoundThenKept(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	b := topology.NewBucket(js, topology.ConsoleSessionsBucket)
	if _, err := b.Get(ctx); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("Get before Apply: %v, want ErrBucketNotFound", err)
	}
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	kv, err := b.Get(ctx)
	if err != nil || kv.Bucket() != topology.ConsoleSessionsBucket {
		t.Fatalf("Get after Apply: %v, %v", kv, err)
	}
	if err := js.DeleteKeyValue(ctx, topology.ConsoleSessionsBucket); err != nil {
		t.Fatal(err)
	}
	if again, err := b.Get(ctx); err != nil || again != kv {
		t.Fatalf("Get after the bucket was deleted: %v, %v; want the one kept", again, err)
	}
	b.Forget()
	if _, err := b.Get(ctx); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("Get after Forget: %v, want ErrBucketNotFound: looked up again", err)
	}
}
