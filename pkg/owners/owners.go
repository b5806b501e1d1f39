// Package owners stores Snip's owners and their API keys in Redis. Every
// service that answers an owner's API call (redirect, click counter, fraud,
// webhooks, console) authenticates with it, and snipctl creates owners with it.
//
// API keys are stored hashed: Redis holds SHA-256(key), never the key. The
// keys are 160 random bits, so a fast hash is enough (no bcrypt needed: there
// is nothing to brute-force), and a lookup is one GET.
//
// Keys in Redis:
//
//	snip:owner:<id>          hash {name, created}
//	snip:owner:<id>:keys     set of <sha256hex>, the owner's keys
//	snip:apikey:<sha256hex>  string <id>
//
// Create stores the new owner's key first and the owner last, so an owner
// never exists without a key; the Create that makes an owner revokes the
// keys that earlier Creates of its ID, cut off before they made it, left.
// Ensure (SNIP_BOOTSTRAP_OWNERS) stores its known key the same way, so a
// Create of the same ID racing it can take that key for a leftover: see
// Ensure. Rotate and Revoke delete key entries, and no service caches
// them: every check is a GET, so a revoked key fails at its next use everywhere. A
// request in flight with a key revoked meanwhile gets no new key from
// RotateFrom, and Revoke (and so Rotate, which revokes first) also revokes
// keys that rotations stored while it ran.
// On a replicated Redis, Store.WaitForReplicas makes those writes wait for
// the replicas, so a failover cannot bring a revoked key back.
package owners

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
)

// Errors.
var (
	// ErrUnauthorized means the API key is missing, malformed or unknown.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrExists means an owner with that ID already exists.
	ErrExists = errors.New("owner already exists")
	// ErrInvalidID means the owner ID is not a subject token.
	ErrInvalidID = errors.New("owner id must be 1-64 letters, digits, '-' or '_'")
	// ErrUnknownOwner means no owner has that ID.
	ErrUnknownOwner = errors.New("no such owner")
	// ErrKeyTaken means the API key already belongs to another owner. A
	// key is never moved from one owner to another: the first owner's
	// integrations would then act as the second.
	ErrKeyTaken = errors.New("api key belongs to another owner")
	// ErrLeftoverKeys means a Create made the owner, and its key works,
	// but could not revoke the keys an earlier Create of the same ID,
	// cut off before it made the owner, had stored: keys never printed,
	// which a rotation or a revocation removes with the others.
	ErrLeftoverKeys = errors.New("keys left by an earlier create that was cut off could not be revoked")
)

// KeyPrefix starts every API key, so a leaked key is recognisable (secret
// scanners look for such prefixes).
const KeyPrefix = "snip_"

// Owner is an account that owns links.
type Owner struct {
	ID      string
	Name    string
	Created time.Time
}

// Store reads and writes owners. It is safe for concurrent use.
type Store struct {
	rdb redis.UniversalClient

	// The replica wait (WaitForReplicas): off when waitN is 0.
	waitN       int
	waitTimeout time.Duration
	short       func(op string, got int64, err error)

	// Set by tests: beforeRevoke runs in Revoke before each pass,
	// afterClaim in RotateFrom once the caller's key is revoked.
	beforeRevoke, afterClaim func()
}

// NewStore returns a store on rdb.
func NewStore(rdb redis.UniversalClient) *Store { return &Store{rdb: rdb} }

func ownerKey(id string) string { return "snip:owner:" + id }

func ownerKeysKey(id string) string { return "snip:owner:" + id + ":keys" }

const apiKeyPrefix = "snip:apikey:"

func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

func apiKeyKey(key string) string { return apiKeyPrefix + keyHash(key) }

// NewAPIKey returns a fresh random API key.
func NewAPIKey() string {
	var b [20]byte
	_, _ = rand.Read(b[:])
	return KeyPrefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// Create makes a new owner and returns its first API key, which is shown
// once and never stored in clear.
//
// The key is stored first and the owner last, in one script (the owner's
// name and creation time together, only if no owner has that ID), so an
// owner never exists without its key: a Create that fails on the way
// (Redis out of reach between two writes) leaves no owner, and the same
// Create again succeeds, where it was ErrExists for an owner with no key.
// What it stored of the key is taken back (if Redis lets it). A key left
// behind (the take-back could not reach Redis, or the process died first)
// authenticates no one while there is no owner, and the next Create of the
// ID that makes the owner revokes it: once the owner is made, the keys its
// set held before this Create stored its own are those of creates that
// never made it. Should that revocation fail, the owner is made and its
// key returned with ErrLeftoverKeys; a rotation or a revocation removes
// them then.
func (s *Store) Create(ctx context.Context, id, name string) (string, error) {
	key := NewAPIKey()
	if err := s.create(ctx, id, name, key, true); err != nil {
		if errors.Is(err, ErrLeftoverKeys) {
			return key, err
		}
		return "", err
	}
	return key, nil
}

// create stores key for id, then the owner (createOwner): ErrExists, with
// nothing written, when the owner exists already. takeBack: a failure
// after the key was stored revokes it (Create's fresh key; Ensure stores
// its key anyway). Once it has made the owner, it revokes the keys the
// owner's set held before it stored key (leftovers): with no owner then,
// they are keys of creates that were cut off before they made it (or of
// one that lost the race to this one and takes its key back itself),
// never printed; ErrLeftoverKeys when that fails.
func (s *Store) create(ctx context.Context, id, name, key string, takeBack bool) (err error) {
	if !events.ValidToken(id) {
		return fmt.Errorf("create owner %q: %w", id, ErrInvalidID)
	}
	switch err := s.exists(ctx, id); {
	case err == nil:
		return fmt.Errorf("create owner %q: %w", id, ErrExists)
	case !errors.Is(err, ErrUnknownOwner):
		return fmt.Errorf("create owner %q: %w", id, err)
	}
	before, err := s.rdb.SMembers(ctx, ownerKeysKey(id)).Result()
	if err != nil {
		return fmt.Errorf("create owner %q: read its key set: %w", id, err)
	}
	leftovers := slices.DeleteFunc(before, func(h string) bool { return h == keyHash(key) })
	if takeBack {
		defer func() {
			// storeKey took a taken key back itself; with leftovers the
			// owner is made, and the key is its.
			if err != nil && !errors.Is(err, ErrKeyTaken) && !errors.Is(err, ErrLeftoverKeys) {
				if rerr := s.revoke(ctx, id, []string{keyHash(key)}); rerr != nil {
					err = fmt.Errorf("%w (taking the key back: %v)", err, rerr)
				}
			}
		}()
	}
	if err := s.storeKey(ctx, id, key); err != nil {
		return fmt.Errorf("create owner %q: store key: %w", id, err)
	}
	var made *redis.Cmd
	err = s.write(ctx, "create_owner", ownerKey(id), func(p redis.Pipeliner) {
		made = createOwner.Eval(ctx, p, []string{ownerKey(id)}, name, time.Now().UTC().Format(time.RFC3339))
	})
	if err == nil {
		var n int64
		if n, err = made.Int64(); err == nil && n == 0 {
			err = ErrExists // created meanwhile
		}
	}
	if err != nil {
		return fmt.Errorf("create owner %q: %w", id, err)
	}
	if len(leftovers) > 0 {
		if err := s.revoke(ctx, id, leftovers); err != nil {
			return fmt.Errorf("create owner %q: made, with its key; %d %w (snipctl owners rotate %s revokes them): %v", id, len(leftovers), ErrLeftoverKeys, cliID(id), err)
		}
	}
	return nil
}

// createOwner writes the owner KEYS[1] (name ARGV[1], created ARGV[2])
// unless it exists: 1 when it wrote it, 0 when it was there.
var createOwner = redis.NewScript(`
if redis.call("EXISTS", KEYS[1]) == 1 then return 0 end
redis.call("HSET", KEYS[1], "name", ARGV[1], "created", ARGV[2])
return 1`)

// storeKey records key as one of owner id's keys: first as a member of the
// owner's set (what Revoke reads), then as the lookup entry. The two live in
// different Redis Cluster slots, so they cannot share a MULTI; written in
// this order, a failure between them leaves a set member without an entry
// (nothing authenticates with it, and Revoke removes it), never a working key
// that Revoke cannot find. Repeating the call completes it.
//
// The entry is written only while it is absent or already names id (a
// script, so no other writer comes between the check and the write): a key
// of another owner is ErrKeyTaken, and the set member is taken back.
func (s *Store) storeKey(ctx context.Context, id, key string) error {
	if err := s.rdb.SAdd(ctx, ownerKeysKey(id), keyHash(key)).Err(); err != nil {
		return err
	}
	var set *redis.Cmd
	if err := s.write(ctx, "store_key", apiKeyKey(key), func(p redis.Pipeliner) {
		set = setUnlessOther.Eval(ctx, p, []string{apiKeyKey(key)}, id)
	}); err != nil {
		return err
	}
	if owner, _ := set.Text(); owner != "" {
		if err := s.rdb.SRem(ctx, ownerKeysKey(id), keyHash(key)).Err(); err != nil {
			return fmt.Errorf("%w: %s (taking it back from %s's set: %v)", ErrKeyTaken, owner, id, err)
		}
		return fmt.Errorf("%w: %s", ErrKeyTaken, owner)
	}
	return nil
}

// setUnlessOther sets KEYS[1] to ARGV[1] unless it holds another value,
// which it returns ("" when it set it).
var setUnlessOther = redis.NewScript(`
local cur = redis.call("GET", KEYS[1])
if cur and cur ~= ARGV[1] then return cur end
redis.call("SET", KEYS[1], ARGV[1])
return ""`)

// keyFree returns ErrKeyTaken if key already belongs to an owner other than
// id; absent, or id's, it is free for id.
func (s *Store) keyFree(ctx context.Context, id, key string) error {
	owner, err := s.rdb.Get(ctx, apiKeyKey(key)).Result()
	switch {
	case errors.Is(err, redis.Nil), err == nil && owner == id:
		return nil
	case err != nil:
		return fmt.Errorf("look up the key's owner: %w", err)
	}
	return fmt.Errorf("%w: %s", ErrKeyTaken, owner)
}

// Ensure creates the owner with the given API key if it does not exist, and
// makes sure the key maps to it. It is for demos and tests, which need a
// known key (SNIP_BOOTSTRAP_OWNERS). Ensuring an owner's own key again
// changes nothing; a key that belongs to another owner is refused
// (ErrKeyTaken) before anything is written, never moved.
//
// A race it does not close: Ensure stores its key before the owner, as
// Create does, so a Create of the same ID that reads the owner's set after
// that, and then makes the owner first, revokes the known key as a
// leftover of a cut-off create. When that revocation lands after Ensure
// has found the owner made and stored its key again, Ensure has returned
// nil and the known key no longer works. It takes an operator creating a
// bootstrap owner's ID by hand while a service starts; the service's next
// start (Ensure again) or a rotation gives the owner a working key.
func (s *Store) Ensure(ctx context.Context, id, key string) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("ensure owner %q: %w", id, err)
	}
	if err := s.keyFree(ctx, id, key); err != nil {
		return fmt.Errorf("ensure owner %q: %w", id, err)
	}
	err := s.create(ctx, id, id, key, false)
	if err == nil || !errors.Is(err, ErrExists) {
		return err
	}
	if err := s.storeKey(ctx, id, key); err != nil {
		return fmt.Errorf("ensure owner %q: %w", id, err)
	}
	return nil
}

// MaxKeyLen is the longest API key Authenticate accepts.
const MaxKeyLen = 128

// checkKey refuses a key Ensure must not store: one without KeyPrefix, too
// short to be a secret, or too long for Authenticate to accept.
func checkKey(key string) error {
	if !strings.HasPrefix(key, KeyPrefix) || len(key) < len(KeyPrefix)+16 || len(key) > MaxKeyLen {
		return fmt.Errorf("key must start with %q and have 16 to %d more characters", KeyPrefix, MaxKeyLen-len(KeyPrefix))
	}
	return nil
}

// CheckSpec reports whether spec, a comma-separated list of "id:key" pairs
// (the format of SNIP_BOOTSTRAP_OWNERS), is one EnsureFromSpec can apply:
// every ID valid, every key one Ensure stores, no key given to two owners.
// Its errors name an entry by its place ("entry 2"), never by its text,
// which holds a key. Whether a key belongs to another owner already is for
// EnsureFromSpec to find, in Redis.
func CheckSpec(spec string) error {
	_, err := parseSpec(spec)
	return err
}

// specEntry is one "id:key" pair of a spec and its place in it (1-based).
type specEntry struct {
	place   int
	id, key string
}

func parseSpec(spec string) ([]specEntry, error) {
	var pairs []specEntry
	for i, pair := range strings.Split(spec, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		id, key, ok := strings.Cut(pair, ":")
		switch {
		case !ok:
			return nil, fmt.Errorf("entry %d is not id:key", i+1)
		case !events.ValidToken(id):
			return nil, fmt.Errorf("entry %d: %w", i+1, ErrInvalidID)
		}
		if err := checkKey(key); err != nil {
			return nil, fmt.Errorf("entry %d: %w", i+1, err)
		}
		for _, p := range pairs {
			if p.key == key && p.id != id {
				return nil, fmt.Errorf("entry %d: %w: %s, in entry %d", i+1, ErrKeyTaken, p.id, p.place)
			}
		}
		pairs = append(pairs, specEntry{place: i + 1, id: id, key: key})
	}
	return pairs, nil
}

// EnsureFromSpec calls Ensure for each "id:key" pair of a comma-separated
// spec, the format of SNIP_BOOTSTRAP_OWNERS, once every pair has passed
// CheckSpec and no key of it belongs to another owner in Redis
// (ErrKeyTaken, naming the entry by its place): a bad entry changes
// nothing. An empty spec does nothing.
func (s *Store) EnsureFromSpec(ctx context.Context, spec string) error {
	pairs, err := parseSpec(spec)
	if err != nil {
		return fmt.Errorf("bootstrap owners: %w", err)
	}
	for _, p := range pairs {
		if err := s.keyFree(ctx, p.id, p.key); err != nil {
			return fmt.Errorf("bootstrap owners: entry %d: %w", p.place, err)
		}
	}
	for _, p := range pairs {
		if err := s.Ensure(ctx, p.id, p.key); err != nil {
			return fmt.Errorf("bootstrap owners: entry %d: %w", p.place, err)
		}
	}
	return nil
}

// Authenticate returns the owner an API key belongs to, or ErrUnauthorized.
func (s *Store) Authenticate(ctx context.Context, key string) (Owner, error) {
	if !strings.HasPrefix(key, KeyPrefix) || len(key) > MaxKeyLen {
		return Owner{}, ErrUnauthorized
	}
	id, err := s.rdb.Get(ctx, apiKeyKey(key)).Result()
	if errors.Is(err, redis.Nil) {
		return Owner{}, ErrUnauthorized
	}
	if err != nil {
		return Owner{}, fmt.Errorf("authenticate: %w", err)
	}
	return s.Get(ctx, id)
}

// Get returns an owner by ID; an unknown ID is ErrUnauthorized, because the
// only way to ask is with a key that pointed at it.
func (s *Store) Get(ctx context.Context, id string) (Owner, error) {
	m, err := s.rdb.HGetAll(ctx, ownerKey(id)).Result()
	if err != nil {
		return Owner{}, fmt.Errorf("get owner %q: %w", id, err)
	}
	if len(m) == 0 {
		return Owner{}, ErrUnauthorized
	}
	created, _ := time.Parse(time.RFC3339, m["created"])
	return Owner{ID: id, Name: m["name"], Created: created}, nil
}

// BearerKey extracts the key from an "Authorization: Bearer <key>" header
// value; it returns "" when there is none.
func BearerKey(header string) string {
	const p = "Bearer "
	if len(header) > len(p) && strings.EqualFold(header[:len(p)], p) {
		return strings.TrimSpace(header[len(p):])
	}
	return ""
}

// cliID is id as a snipctl command line takes it: after "--" when it starts
// with "-", which snipctl would otherwise read as a flag.
func cliID(id string) string {
	if strings.HasPrefix(id, "-") {
		return "-- " + id
	}
	return id
}
