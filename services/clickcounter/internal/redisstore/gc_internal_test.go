package redisstore

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The arguments of an applied batch are kept for the next batch across
// garbage collections, which a catch-up runs every few batches (a
// sync.Pool drops what it holds at each), emptied and with their room.
// (Redis here is an address nothing listens on: Apply fails, after
// building the arguments and before giving them back, as after any call.)
func TestApplyKeepsItsArgumentsAcrossCollections(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	s := New(rdb)
	now := time.Now().UTC()
	w := mixWrite(2000, false, now)
	if _, err := s.Apply(context.Background(), w); err == nil {
		t.Fatal("Apply to an address nothing listens on succeeded")
	}
	runtime.GC()
	runtime.GC()
	if len(s.applies) != 1 {
		t.Fatalf("%d arguments kept after two collections, want 1", len(s.applies))
	}
	a := <-s.applies
	if len(a.keys)+len(a.argv)+len(a.order)+len(a.idx) != 0 {
		t.Errorf("kept arguments hold %d keys, %d arguments, %d marks, %d indexed keys; want none", len(a.keys), len(a.argv), len(a.order), len(a.idx))
	}
	if cap(a.argv) < 9000 || cap(a.keys) < 2000 || len(a.fields) == 0 {
		t.Errorf("kept arguments have room for %d keys and %d arguments and %d cached fields; want the batch's (over 2,000, 9,000, some)", cap(a.keys), cap(a.argv), len(a.fields))
	}
}
