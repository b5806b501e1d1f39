package owners

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// Rotate gives the owner a new API key and revokes every other key it has,
// at once: the old key fails at its next use in every service. The new key
// is returned once; only its hash is stored. It is the operator's rotation
// (snipctl owners rotate); an owner's own goes through RotateFrom.
//
// It revokes first (Revoke), then stores the new key, so the new key is the
// owner's only one when Rotate returns: a rotation through the API with a
// key that still worked when Rotate began keeps nothing, and cannot revoke
// the new key either (it revokes only what it read before its own key was
// found revoked). A failure storing the new key leaves the owner without a
// key until Rotate is repeated.
func (s *Store) Rotate(ctx context.Context, id string) (string, error) {
	if _, err := s.Revoke(ctx, id); err != nil {
		return "", fmt.Errorf("rotate key of %q: %w", id, err)
	}
	key := NewAPIKey()
	if err := s.storeKey(ctx, id, key); err != nil {
		return "", fmt.Errorf("rotate key of %q: store the new key (the old ones are revoked; repeat to get one): %w", id, err)
	}
	return key, nil
}

// RotateFrom is Rotate for a caller that authenticated with key, as
// POST /api/key/rotate does: the new key is given only while key is still
// the owner's. It stores the new key first, then revokes the caller's key by
// a compare-and-delete, then the owner's other keys; when the caller's key
// is gone already (revoked, or rotated out by another request, after the
// caller authenticated), the new key is taken back and RotateFrom returns
// ErrUnauthorized. So a request in flight when its key was revoked never
// leaves with a working key, and of two rotations with the same key one
// wins. Once the caller's key is revoked, the new key is returned even when
// revoking the owner's other keys then fails (with that error): the caller
// has no other key.
func (s *Store) RotateFrom(ctx context.Context, id, key string) (string, error) {
	if err := s.exists(ctx, id); err != nil {
		return "", fmt.Errorf("rotate key of %q: %w", id, err)
	}
	old, err := s.keyHashes(ctx, id)
	if err != nil {
		return "", fmt.Errorf("rotate key of %q: %w", id, err)
	}
	fresh := NewAPIKey()
	if err := s.storeKey(ctx, id, fresh); err != nil {
		return "", fmt.Errorf("rotate key of %q: store the new key: %w", id, err)
	}
	// The caller's key, if it still names the owner. The new key was stored
	// first, so a Revoke that deleted the caller's key has either seen the
	// new one in the owner's set or left this delete nothing to find.
	k := apiKeyKey(key)
	var del *redis.Cmd
	err = s.write(ctx, "revoke_key", k, func(p redis.Pipeliner) { del = delIfEquals.Eval(ctx, p, []string{k}, id) })
	if err == nil {
		var n int64
		if n, err = del.Int64(); err == nil && n == 0 {
			err = ErrUnauthorized
		}
	}
	if err != nil {
		if terr := s.revoke(ctx, id, []string{keyHash(fresh)}); terr != nil {
			return "", fmt.Errorf("rotate key of %q: revoke the caller's key: %w (taking the new key back: %v)", id, err, terr)
		}
		return "", fmt.Errorf("rotate key of %q: revoke the caller's key: %w", id, err)
	}
	// The caller has no key but the new one now: from here on it is
	// returned even when revoking the others fails.
	if s.afterClaim != nil {
		s.afterClaim()
	}
	h := keyHash(key)
	old = slices.DeleteFunc(old, func(o string) bool { return o == h })
	err = s.revoke(ctx, id, old)
	if err == nil {
		err = s.rdb.SRem(ctx, ownerKeysKey(id), h).Err()
	}
	if err != nil {
		return fresh, fmt.Errorf("rotate key of %q: revoke the old keys (the new one works; repeat to revoke them): %w", id, err)
	}
	return fresh, nil
}

// maxRevokePasses bounds Revoke's passes over the owner's set: each pass
// after the first finds only keys that rotations stored meanwhile.
const maxRevokePasses = 10

// Revoke revokes every API key of the owner at once and returns how many it
// revoked. The owner and its links stay; Rotate gives it a key again.
//
// A key a rotation stored while Revoke ran is revoked too: Revoke reads the
// owner's set again after each pass until it is empty. A RotateFrom that
// stores its key after that last read finds its caller's key gone and
// takes its own back (see RotateFrom), so no key outlives the call.
func (s *Store) Revoke(ctx context.Context, id string) (int, error) {
	if err := s.exists(ctx, id); err != nil {
		return 0, fmt.Errorf("revoke keys of %q: %w", id, err)
	}
	hashes, err := s.keyHashes(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("revoke keys of %q: %w", id, err)
	}
	revoked := 0
	for pass := 0; len(hashes) > 0; pass++ {
		if pass == maxRevokePasses {
			return revoked, fmt.Errorf("revoke keys of %q: keys were still being added after %d passes; repeat", id, pass)
		}
		if s.beforeRevoke != nil {
			s.beforeRevoke()
		}
		if err := s.revoke(ctx, id, hashes); err != nil {
			return revoked, fmt.Errorf("revoke keys of %q: %w", id, err)
		}
		revoked += len(hashes)
		if hashes, err = s.rdb.SMembers(ctx, ownerKeysKey(id)).Result(); err != nil {
			return revoked, fmt.Errorf("revoke keys of %q: read the keys again: %w", id, err)
		}
	}
	return revoked, nil
}

func (s *Store) exists(ctx context.Context, id string) error {
	n, err := s.rdb.Exists(ctx, ownerKey(id)).Result()
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrUnknownOwner
	}
	return nil
}

// revoke deletes the key entries (one command each: they may live in
// different cluster slots) and their members of the owner's set.
func (s *Store) revoke(ctx context.Context, id string, hashes []string) error {
	for _, h := range hashes {
		// Only an entry that still names this owner.
		k := apiKeyPrefix + h
		if err := s.write(ctx, "revoke_key", k, func(p redis.Pipeliner) { delIfEquals.Eval(ctx, p, []string{k}, id) }); err != nil {
			return err
		}
		if err := s.rdb.SRem(ctx, ownerKeysKey(id), h).Err(); err != nil {
			return err
		}
	}
	return nil
}

var delIfEquals = redis.NewScript(`
if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end
return 0`)

// keyHashes returns the hashes of the owner's keys: its set, and any key
// entry naming it that the set lacks (keys stored before the set existed),
// found by scanning every master.
func (s *Store) keyHashes(ctx context.Context, id string) ([]string, error) {
	hashes, err := s.rdb.SMembers(ctx, ownerKeysKey(id)).Result()
	if err != nil {
		return nil, err
	}
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, apiKeyPrefix+"*", 1000).Result()
			if err != nil {
				return err
			}
			for _, k := range keys {
				v, err := c.Get(ctx, k).Result()
				if errors.Is(err, redis.Nil) {
					continue
				}
				if err != nil {
					return err
				}
				if v == id {
					hashes = append(hashes, k[len(apiKeyPrefix):])
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		var mu = make(chan struct{}, 1)
		err = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			mu <- struct{}{}
			defer func() { <-mu }()
			return scan(ctx, m)
		})
	} else {
		err = scan(ctx, s.rdb)
	}
	if err != nil {
		return nil, fmt.Errorf("scan api keys: %w", err)
	}
	slices.Sort(hashes)
	return slices.Compact(hashes), nil
}
