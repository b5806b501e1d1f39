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
// is returned once; only its hash is stored.
func (s *Store) Rotate(ctx context.Context, id string) (string, error) {
	if err := s.exists(ctx, id); err != nil {
		return "", fmt.Errorf("rotate key of %q: %w", id, err)
	}
	old, err := s.keyHashes(ctx, id)
	if err != nil {
		return "", fmt.Errorf("rotate key of %q: %w", id, err)
	}
	key := NewAPIKey()
	// The new key first: if the revocation below fails, the owner has both
	// and the call can be repeated; never neither.
	if err := s.storeKey(ctx, id, key); err != nil {
		return "", fmt.Errorf("rotate key of %q: store the new key: %w", id, err)
	}
	if err := s.revoke(ctx, id, old); err != nil {
		return "", fmt.Errorf("rotate key of %q: revoke the old keys (the new one works; repeat to revoke them): %w", id, err)
	}
	return key, nil
}

// Revoke revokes every API key of the owner at once and returns how many it
// revoked. The owner and its links stay; Rotate gives it a key again.
func (s *Store) Revoke(ctx context.Context, id string) (int, error) {
	if err := s.exists(ctx, id); err != nil {
		return 0, fmt.Errorf("revoke keys of %q: %w", id, err)
	}
	hashes, err := s.keyHashes(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("revoke keys of %q: %w", id, err)
	}
	if err := s.revoke(ctx, id, hashes); err != nil {
		return 0, fmt.Errorf("revoke keys of %q: %w", id, err)
	}
	return len(hashes), nil
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
