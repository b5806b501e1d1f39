// Package consolesessions records the console sessions ended before their
// expiry, in the snip_console_sessions bucket every console instance reads:
// a logout writes revoked.<session ID>, "revoke every session" raises
// not_before (unix milliseconds) to its time. Every entry expires with the
// bucket's TTL, the sessions' lifetime (topology.ConsoleSessionTTL): by then
// the sessions it ends have expired by themselves. The bucket is
// topology.Apply's; the console reads and writes its keys, and `snipctl
// console revoke-sessions` raises not_before as the console's
// POST /api/sessions/revoke does, with this package's RevokeAll.
package consolesessions

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/topology"
)

// ErrEnded is a session logged out, or issued before every session was
// revoked.
var ErrEnded = errors.New("this session was ended (logged out, or every session was revoked): log in again")

// ErrNoBucket is a revocation asked for while the bucket does not exist.
var ErrNoBucket = errors.New("bucket " + topology.ConsoleSessionsBucket + " does not exist: apply the topology (snipctl topology apply)")

const notBeforeKey = "not_before"

func revokedKey(id string) string { return "revoked." + id }

// Store reads and writes the bucket.
type Store struct {
	b *topology.Bucket
}

// New is a Store on js.
func New(js jetstream.JetStream) *Store {
	return &Store{b: topology.NewBucket(js, topology.ConsoleSessionsBucket)}
}

// bucket is the bucket, looked up until it is found once.
func (s *Store) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := s.b.Get(ctx)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, ErrNoBucket
	}
	return kv, err
}

// Check is nil for a session the bucket does not say was ended, ErrEnded for
// one it does, or why the bucket could not be read. A missing bucket ends
// nothing: no session could have been revoked without it.
func (s *Store) Check(ctx context.Context, id string, issued time.Time) error {
	kv, err := s.bucket(ctx)
	if errors.Is(err, ErrNoBucket) {
		return nil
	}
	if err != nil {
		return err
	}
	nb, _, err := notBefore(ctx, kv)
	if err != nil {
		return err
	}
	if issued.UnixMilli() < nb {
		return ErrEnded
	}
	_, err = kv.Get(ctx, revokedKey(id))
	switch {
	case err == nil:
		return ErrEnded
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil
	}
	return fmt.Errorf("read session %s: %w", id, err)
}

// notBefore is the bucket's not_before (0 without one) and its revision.
func notBefore(ctx context.Context, kv jetstream.KeyValue) (int64, uint64, error) {
	e, err := kv.Get(ctx, notBeforeKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("read %s: %w", notBeforeKey, err)
	}
	ms, err := strconv.ParseInt(string(e.Value()), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("read %s: %q is no unix time in milliseconds", notBeforeKey, e.Value())
	}
	return ms, e.Revision(), nil
}

// Revoke ends the session id on every instance.
func (s *Store) Revoke(ctx context.Context, id string) error {
	kv, err := s.bucket(ctx)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, revokedKey(id), []byte(strconv.FormatInt(time.Now().UnixMilli(), 10))); err != nil {
		return fmt.Errorf("revoke session %s: %w", id, err)
	}
	return nil
}

// RevokeAll ends every session issued before at, on every instance, and
// returns the not_before in force: at, or a later one already there (two
// revocations at once, or an instance whose clock is ahead, never move it
// back).
func (s *Store) RevokeAll(ctx context.Context, at time.Time) (time.Time, error) {
	kv, err := s.bucket(ctx)
	if err != nil {
		return time.Time{}, err
	}
	want := at.UnixMilli()
	for {
		have, rev, err := notBefore(ctx, kv)
		if err != nil {
			return time.Time{}, err
		}
		if have >= want {
			return time.UnixMilli(have), nil
		}
		v := []byte(strconv.FormatInt(want, 10))
		if rev == 0 {
			_, err = kv.Create(ctx, notBeforeKey, v)
		} else {
			_, err = kv.Update(ctx, notBeforeKey, v, rev)
		}
		switch {
		case err == nil:
			return time.UnixMilli(want), nil
		case errors.Is(err, jetstream.ErrKeyExists): // written meanwhile: read it again
			continue
		}
		return time.Time{}, fmt.Errorf("revoke every session: %w", err)
	}
}
