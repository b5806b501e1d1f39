package kvorigin_test

import (
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/fraud/internal/kvorigin"
)

// A partition's origin is 0 until recorded, then only ever lowered: members
// racing to record theirs leave the lowest, and each partition and group has
// its own.
func TestOriginIsOnlyLowered(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	origins := kvorigin.New(js, topology.GroupFraudDetection)
	if got, err := origins.Origin(ctx, 2); err != nil || got != 0 {
		t.Fatalf("Origin before any record = %d, %v; want 0", got, err)
	}
	var wg sync.WaitGroup
	for _, seq := range []uint64{90, 40, 70, 55, 41} {
		wg.Go(func() {
			if err := kvorigin.New(js, topology.GroupFraudDetection).Lower(ctx, 2, seq); err != nil {
				t.Errorf("Lower(2, %d): %v", seq, err)
			}
		})
	}
	wg.Wait()
	if err := origins.Lower(ctx, 2, 60); err != nil { // later than the record: kept
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		origins   *kvorigin.Origins
		partition int
		want      uint64
	}{
		{"the_lowest_of_the_race", origins, 2, 40},
		{"another_partition", origins, 3, 0},
		{"another_group", kvorigin.New(js, "other-group"), 2, 0},
	} {
		if got, err := tc.origins.Origin(ctx, tc.partition); err != nil || got != tc.want {
			t.Errorf("%s: Origin = %d, %v; want %d", tc.name, got, err, tc.want)
		}
	}
	if err := origins.Lower(ctx, 2, 0); err == nil {
		t.Fatal("Lower(2, 0) succeeded; 0 means none recorded")
	}
}

// Raise moves a partition's origin up only from the record it names (the
// origin whose statistics were lost for good): a record another writer
// changed meanwhile, or none, is left alone.
func TestOriginIsRaisedOnlyFromTheRecordItNames(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	origins := kvorigin.New(js, topology.GroupFraudDetection)
	if err := origins.Raise(ctx, 1, 10, 30); err != nil { // none recorded: left so
		t.Fatal(err)
	}
	if got, err := origins.Origin(ctx, 1); err != nil || got != 0 {
		t.Fatalf("Origin after raising none = %d, %v; want 0", got, err)
	}
	if err := origins.Lower(ctx, 1, 10); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		from, to, want uint64
	}{
		{from: 5, to: 30, want: 10},  // not the record: left alone
		{from: 10, to: 30, want: 30}, // the record: raised
		{from: 30, to: 20, want: 30}, // never lowered by Raise
	} {
		if err := origins.Raise(ctx, 1, step.from, step.to); err != nil {
			t.Fatal(err)
		}
		if got, err := origins.Origin(ctx, 1); err != nil || got != step.want {
			t.Fatalf("Raise(1, %d, %d): Origin = %d, %v; want %d", step.from, step.to, got, err, step.want)
		}
	}
}
