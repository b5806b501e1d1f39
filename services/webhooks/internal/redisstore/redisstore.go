// Package redisstore keeps the webhooks service's state in Redis: endpoints,
// each endpoint's queue of undelivered events (a Redis stream, bounded), its
// in-flight batch, its recent deliveries, and the lease that says which
// instance sends for it.
//
// Keys (the {id} hash tag keeps one endpoint's keys in one cluster slot):
//
//	snip:wh:{<id>}:ep        hash: cfg (endpoint JSON), rev (bumped by each Update), failing_since, last_error, attempts,
//	                         replay (the latest replay's state, JSON), replay_id (its ID)
//	snip:wh:{<id>}:q         stream: undelivered events (with their stream sequence), MAXLEN bounded, oldest dropped
//	snip:wh:{<id>}:hw        hash: highest CLICKS sequence queued, per partition (dedup)
//	snip:wh:{<id>}:seen:<e>  a fraud alert ID queued recently (dedup, expires)
//	snip:wh:{<id>}:inflight  the first and last queue entries of the batch being sent
//	snip:wh:{<id>}:dl        list: the most recent delivery records (JSON)
//	snip:wh:{<id>}:body:<d>  the body of delivery record <d> while it is in dl, for redelivery (expires)
//	snip:wh:{<id>}:lease     the sender's lease token: <instance>/<random>, one per sender run (expires)
//	snip:wh:{<id>}:replay_lease the instance holding the latest replay while it is queued or running (expires
//	                         unless that instance renews it: gone, the replay reads as interrupted)
//	snip:wh:owner:<owner>    set of the owner's endpoint IDs
//	snip:wh:endpoints        set of every endpoint ID
//	snip:wh:version          bumped on every endpoint change; readers reload on change
//	snip:wh:{interest}:lease the instance narrowing the group's consumers now (expires)
//	snip:wh:{owner:<owner>}:lease the create of one of the owner's endpoints in progress (expires)
package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
)

// Store is the webhooks service's Redis state.
type Store struct {
	rdb redis.UniversalClient
	// MaxBacklog bounds each endpoint's queue; when full, the oldest events
	// are dropped (and counted by Enqueue).
	MaxBacklog int64
	// KeepDeliveries is how many delivery records an endpoint keeps.
	KeepDeliveries int64
	// BodyTTL is how long a delivery's body is kept for redelivery.
	BodyTTL time.Duration

	// The replica wait (WaitForReplicas): off when waitN is 0.
	waitN       int
	waitTimeout time.Duration
	short       func(op string, err error)
}

// New returns a Store on rdb.
func New(rdb redis.UniversalClient, maxBacklog int64) *Store {
	return &Store{rdb: rdb, MaxBacklog: maxBacklog, KeepDeliveries: 100, BodyTTL: 72 * time.Hour}
}

func k(id, part string) string     { return "snip:wh:{" + id + "}:" + part }
func ownerKey(owner string) string { return "snip:wh:owner:" + owner }

const (
	allKey     = "snip:wh:endpoints"
	versionKey = "snip:wh:version"
)

// State is an endpoint's delivery state, written by its sender, and the
// state of its latest replay.
type State struct {
	// FailingSince is when the current run of failed attempts began (zero
	// when the last attempt succeeded).
	FailingSince time.Time `json:"failing_since,omitzero"`
	LastError    string    `json:"last_error,omitempty"`
	Attempts     int       `json:"attempts"`
	// Replay is the state of the endpoint's latest replay (zero if it
	// never had one), written by SetReplay.
	Replay Replay `json:"replay,omitzero"`
}

// The states of a replay (Replay.State).
const (
	ReplayQueued  = "queued"  // accepted, waiting for the replays before it
	ReplayRunning = "running" // cutting, clearing the queue up to the cut, copying
	ReplayFailed  = "failed"  // stopped by Error: the queue may lack events up to the cut; ask again
	ReplayDone    = "done"    // every event up to the cut is queued again
	// ReplayInterrupted is never stored: Get reads a queued or running
	// replay whose instance stopped renewing its lease (it crashed) as
	// interrupted, with ReplayInterruptedReason. The queue may lack events
	// up to the cut, as after a failure; ask again.
	ReplayInterrupted = "interrupted"
)

// ReplayInterruptedReason is an interrupted replay's Error, for the owner.
const ReplayInterruptedReason = "the instance running the replay stopped before it finished; ask again"

// ReplayLease is who holds a queued or running replay, and for how long
// unless renewed (RenewReplays): a replay whose instance crashed is read
// as interrupted once its lease lapses, instead of running for ever.
type ReplayLease struct {
	Holder string
	TTL    time.Duration
}

// Replay is the state of an endpoint's latest replay, as its owner sees
// it: a replay runs in the background after its request was answered, so
// this is where a failure shows.
type Replay struct {
	// ID tells one request's replay from the next one's: a replay writes
	// its state only while it is the latest (SetReplay).
	ID          string    `json:"id"`
	State       string    `json:"state"`
	From        time.Time `json:"from"`
	RequestedAt time.Time `json:"requested_at"`
	// UpdatedAt is when State was written.
	UpdatedAt time.Time `json:"updated_at"`
	// Events is how many events a done replay queued.
	Events int    `json:"events,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Put stores a new endpoint (a fresh ID). It never replaces a stored
// configuration: Update changes one, version-checked. The configuration
// and the sets that list the endpoint live in different Redis Cluster
// slots, so they cannot share a MULTI (it was one, and failed with
// CROSSSLOT on a cluster): they are written first, then the version that
// tells every instance to reload, so no instance reloads before the
// endpoint is complete. Each write is idempotent: a Put that failed half
// way is completed by calling it again.
func (s *Store) Put(ctx context.Context, e endpoint.Endpoint) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("put endpoint: %w", err)
	}
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSetNX(ctx, k(e.ID, "ep"), "cfg", b)
		p.SAdd(ctx, ownerKey(e.Owner), e.ID)
		p.SAdd(ctx, allKey, e.ID)
		return nil
	})
	if err == nil {
		err = s.rdb.Incr(ctx, versionKey).Err()
	}
	if err != nil {
		return fmt.Errorf("put endpoint %s: %w", e.ID, err)
	}
	s.replicated(ctx, "put", []string{k(e.ID, "ep"), ownerKey(e.Owner), allKey, versionKey})
	return nil
}

// Get returns an endpoint and its state, or endpoint.ErrNotFound.
func (s *Store) Get(ctx context.Context, id string) (endpoint.Endpoint, State, error) {
	e, st, _, err := s.get(ctx, id)
	return e, st, err
}

// get is Get with the configuration's revision (the hash's rev field,
// absent until the first Update), which Update checks.
func (s *Store) get(ctx context.Context, id string) (endpoint.Endpoint, State, string, error) {
	var e endpoint.Endpoint
	var st State
	// The replay's lease is read with the hash, in one transaction (one
	// slot): a replay that ends deletes its lease as it writes its end, so
	// separate reads could see it running without a lease.
	var hash *redis.MapStringStringCmd
	var lease *redis.StringCmd
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		hash = p.HGetAll(ctx, k(id, "ep"))
		lease = p.Get(ctx, k(id, "replay_lease"))
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return e, st, "", fmt.Errorf("get endpoint %s: %w", id, err)
	}
	m := hash.Val()
	if m["cfg"] == "" {
		return e, st, "", fmt.Errorf("endpoint %s: %w", id, endpoint.ErrNotFound)
	}
	if err := json.Unmarshal([]byte(m["cfg"]), &e); err != nil {
		return e, st, "", fmt.Errorf("decode endpoint %s: %w", id, err)
	}
	st.FailingSince = unixMilli(m["failing_since"])
	st.LastError = m["last_error"]
	st.Attempts, _ = strconv.Atoi(m["attempts"])
	if v := m["replay"]; v != "" && json.Unmarshal([]byte(v), &st.Replay) != nil {
		// Only shown to the owner: an unreadable one must not stop the
		// endpoint's sender or its changes.
		st.Replay = Replay{}
	}
	if r := &st.Replay; (r.State == ReplayQueued || r.State == ReplayRunning) && errors.Is(lease.Err(), redis.Nil) {
		// Its instance stopped renewing the lease: it crashed, or lost
		// Redis for longer than the lease. Nothing renews a lapsed lease.
		r.State, r.Error = ReplayInterrupted, ReplayInterruptedReason
	}
	rev := m["rev"]
	if rev == "" {
		rev = "0"
	}
	return e, st, rev, nil
}

// unixMilli reads a failing_since field: Unix milliseconds, "0" or absent
// for none.
func unixMilli(v string) time.Time {
	ms, _ := strconv.ParseInt(v, 10, 64)
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// GetOwned is Get for an owner: another owner's endpoint is not found.
func (s *Store) GetOwned(ctx context.Context, owner, id string) (endpoint.Endpoint, State, error) {
	e, st, err := s.Get(ctx, id)
	if err == nil && e.Owner != owner {
		return endpoint.Endpoint{}, State{}, fmt.Errorf("endpoint %s: %w", id, endpoint.ErrNotFound)
	}
	return e, st, err
}

// Write says what Update writes once an Edit has changed the endpoint.
type Write int

// What an Edit asks Update to write.
const (
	// WriteConfig writes the edited configuration.
	WriteConfig Write = iota
	// WriteConfigAndResetState also clears the delivery state (failing
	// since, last error, attempts), in the same write: a resumed endpoint
	// starts its retries afresh.
	WriteConfigAndResetState
	// WriteNothing leaves the endpoint as it is (the edit found that
	// nothing is to change, such as a disable the owner's resume overtook).
	WriteNothing
)

// An Edit changes an endpoint that Update read, given its delivery state
// read with it. It runs once per read, so more than once when another
// writer came first: it must start from what it is given each time. An
// error ends the Update with that error, writing nothing.
type Edit func(e *endpoint.Endpoint, st State) (Write, error)

// maxUpdateTries bounds how often Update reads again because another
// writer changed the endpoint between its read and its write.
const maxUpdateTries = 100

// Update changes endpoint id's configuration with edit and returns it as
// written, with its delivery state. Every change of a stored endpoint (a
// rotation, pause and resume, the sender's disable; a replay's cut,
// through UpdateAsReplay) goes through it: the configuration is one JSON
// value, so a change of one field writes them all, and two
// read-modify-writes at once would each write back the other's fields as
// they read them (a disable racing a rotation would bring the old secret
// back). So the write is a compare-and-set: one
// script writes only if the hash's revision is still the one read, and
// bumps it; otherwise Update reads again and edits afresh. The script
// writes nothing once the configuration is gone, so no Update brings a
// deleted endpoint back: it returns endpoint.ErrNotFound. The hash (and
// the replay's lease UpdateAsReplay checks) is in the endpoint's slot; the
// version that tells every instance to reload follows.
func (s *Store) Update(ctx context.Context, id string, edit Edit) (endpoint.Endpoint, State, error) {
	return s.update(ctx, id, ReplayHold{}, "", edit)
}

// UpdateAsSender is Update made by the endpoint's sender (its disable):
// the script writes only while the endpoint's lease still holds token (see
// Leases), and otherwise writes nothing and returns ErrLeaseLost. A sender
// whose lease passed to another sender meanwhile read the failing run
// before that sender's delivery ended it, and a delivery bumps no
// revision: its write would disable an endpoint that takes batches again.
func (s *Store) UpdateAsSender(ctx context.Context, id, token string, edit Edit) (endpoint.Endpoint, State, error) {
	if token == "" {
		return endpoint.Endpoint{}, State{}, fmt.Errorf("update endpoint %s: no lease token", id)
	}
	return s.update(ctx, id, ReplayHold{}, token, edit)
}

// UpdateAsReplay is Update made by replay hold (its cut): the script writes
// only while hold is the endpoint's latest replay and hold.Holder holds its
// lease, and otherwise writes nothing and returns ErrReplaySuperseded or
// ErrReplayLeaseLapsed. A replay superseded between its running write and
// its cut would otherwise cut after the newer replay did, possibly lower
// (it read the streams first), and clear after it.
func (s *Store) UpdateAsReplay(ctx context.Context, id string, hold ReplayHold, edit Edit) (endpoint.Endpoint, State, error) {
	if hold.ID == "" || hold.Holder == "" {
		return endpoint.Endpoint{}, State{}, fmt.Errorf("update endpoint %s: replay %q of holder %q: want both", id, hold.ID, hold.Holder)
	}
	return s.update(ctx, id, hold, "", edit)
}

func (s *Store) update(ctx context.Context, id string, hold ReplayHold, token string, edit Edit) (endpoint.Endpoint, State, error) {
	for range maxUpdateTries {
		e, st, rev, err := s.get(ctx, id)
		if err != nil {
			return e, st, err
		}
		w, err := edit(&e, st)
		if err != nil {
			return endpoint.Endpoint{}, State{}, err
		}
		if w == WriteNothing {
			return e, st, nil
		}
		b, err := json.Marshal(e)
		if err != nil {
			return e, st, fmt.Errorf("update endpoint %s: %w", id, err)
		}
		reset := 0
		if w == WriteConfigAndResetState {
			reset, st = 1, State{}
		}
		n, err := updateScript.Run(ctx, s.rdb, []string{k(id, "ep"), k(id, "replay_lease"), k(id, "lease")}, rev, b, reset, hold.ID, hold.Holder, token).Int()
		if err != nil {
			return e, st, fmt.Errorf("update endpoint %s: %w", id, err)
		}
		switch n {
		case -1:
			return endpoint.Endpoint{}, State{}, fmt.Errorf("endpoint %s: %w", id, endpoint.ErrNotFound)
		case -2:
			return endpoint.Endpoint{}, State{}, fmt.Errorf("replay %s of %s: %w", hold.ID, id, ErrReplaySuperseded)
		case -3:
			return endpoint.Endpoint{}, State{}, fmt.Errorf("replay %s of %s: %w", hold.ID, id, ErrReplayLeaseLapsed)
		case -4:
			return endpoint.Endpoint{}, State{}, fmt.Errorf("update endpoint %s: %w", id, ErrLeaseLost)
		case 0:
			continue // changed since the read
		}
		if err := s.rdb.Incr(ctx, versionKey).Err(); err != nil {
			return e, st, fmt.Errorf("update endpoint %s: %w", id, err)
		}
		s.replicated(ctx, "update", []string{k(id, "ep"), versionKey})
		return e, st, nil
	}
	return endpoint.Endpoint{}, State{}, fmt.Errorf("update endpoint %s: changed by others %d times in a row", id, maxUpdateTries)
}

// updateScript: KEYS = the endpoint, its replay's lease, its sender's
// lease; ARGV = the revision read, the new configuration, 1 to clear the
// delivery state, the replay writing (empty: none) and its lease's holder,
// the sender's lease token (empty: not the sender). Returns -1 when the
// endpoint is gone, -2 when another replay is the latest, -3 when the
// holder no longer holds the replay's lease, -4 when the sender's lease
// holds another token, 0 when its revision changed since the read (nothing
// written in each case), 1 when written.
var updateScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], 'cfg') == 0 then return -1 end
if ARGV[4] ~= '' then
  if (redis.call('HGET', KEYS[1], 'replay_id') or '') ~= ARGV[4] then return -2 end
  if redis.call('GET', KEYS[2]) ~= ARGV[5] then return -3 end
end
if ARGV[6] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[6] then return -4 end
if (redis.call('HGET', KEYS[1], 'rev') or '0') ~= ARGV[1] then return 0 end
redis.call('HINCRBY', KEYS[1], 'rev', 1)
redis.call('HSET', KEYS[1], 'cfg', ARGV[2])
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'failing_since', 0, 'last_error', '', 'attempts', 0)
end
return 1`)

// RecordFailure records a failed attempt to deliver to endpoint id, made at
// now, and returns the delivery state as stored: the failing run's start
// and its attempts. The run's start is the one stored, not the sender's
// copy: the owner may have resumed the endpoint (clearing it) while the
// attempt was on the wire, and the copy would bring back a start the
// resume cleared, old enough to disable the endpoint at once. A stored
// start at or before okAfter (the last time the receiver accepted a batch,
// zero if the sender saw none) is stale too: that success's reset was not
// stored (Delivered failed), and the run starts again at now. Nothing is
// written for an endpoint deleted meanwhile (endpoint.ErrNotFound), nor
// once the endpoint's lease holds another token than the sender's
// (ErrLeaseLost): the failure of a sender whose lease passed to another
// sender, arriving after that sender's own, would count twice in its run,
// or start a run again after its delivery ended it.
func (s *Store) RecordFailure(ctx context.Context, id, token string, now, okAfter time.Time, lastError string) (State, error) {
	ok := int64(0)
	if !okAfter.IsZero() {
		ok = okAfter.UnixMilli()
	}
	r, err := recordFailureScript.Run(ctx, s.rdb, []string{k(id, "ep"), k(id, "lease")}, now.UnixMilli(), ok, lastError, token).Int64Slice()
	if err != nil {
		return State{}, fmt.Errorf("record failure of %s: %w", id, err)
	}
	switch {
	case len(r) != 2:
		return State{}, fmt.Errorf("record failure of %s: answer %v", id, r)
	case r[0] == -2:
		return State{}, fmt.Errorf("record failure of %s: %w", id, ErrLeaseLost)
	case r[0] < 0:
		return State{}, fmt.Errorf("endpoint %s: %w", id, endpoint.ErrNotFound)
	}
	return State{FailingSince: time.UnixMilli(r[0]), LastError: lastError, Attempts: int(r[1])}, nil
}

// recordFailureScript: KEYS = the endpoint, its sender's lease; ARGV = the
// attempt's time and the last success's (Unix ms, 0: none), the error, the
// sender's lease token. Returns {failing since, attempts}, {-1, 0} for a
// deleted endpoint, or {-2, 0} when the lease holds another token
// (nothing written).
var recordFailureScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], 'cfg') == 0 then return {-1, 0} end
if redis.call('GET', KEYS[2]) ~= ARGV[4] then return {-2, 0} end
local st = redis.call('HMGET', KEYS[1], 'failing_since', 'attempts')
local since, n = tonumber(st[1]) or 0, tonumber(st[2]) or 0
if since == 0 or since <= tonumber(ARGV[2]) then since, n = tonumber(ARGV[1]), 0 end
n = n + 1
redis.call('HSET', KEYS[1], 'failing_since', since, 'last_error', ARGV[3], 'attempts', n)
return {since, n}`)

// ErrLeaseLost: the endpoint's lease no longer holds the sender's token
// (it lapsed, and another instance, or another sender of this one, took
// it): the sender's write was refused, and the sender stops.
var ErrLeaseLost = errors.New("the endpoint's lease holds another sender's token")

// ErrReplaySuperseded: a newer replay of the endpoint was requested; the
// older one's state is not written (and it need not run: the newer one
// clears and refills everything it would).
var ErrReplaySuperseded = errors.New("a newer replay was requested")

// ErrReplayLeaseLapsed: the replay's lease lapsed (its instance did not
// renew it in time), so it reads as interrupted and the owner may have
// asked again; it is not brought back to queued or running.
var ErrReplayLeaseLapsed = errors.New("the replay's lease lapsed")

// SetReplay writes the state of endpoint id's latest replay. With latest
// false it writes only while r is still the endpoint's latest replay (the
// stored ID is r.ID), else it returns ErrReplaySuperseded; with latest
// true r becomes the latest (a new request). A queued or running state
// comes with its lease (lease.Holder, for lease.TTL, then renewed with
// RenewReplays), and one that is not a new request is written only while
// lease.Holder still holds it (else ErrReplayLeaseLapsed); an ended one
// (done, failed) is written with a zero lease and drops it. Nothing is
// written for an endpoint deleted meanwhile (endpoint.ErrNotFound): the
// state would outlive it.
func (s *Store) SetReplay(ctx context.Context, id string, r Replay, latest bool, lease ReplayLease) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("set replay state of %s: %w", id, err)
	}
	expect := r.ID
	if latest {
		expect = ""
	}
	n, err := setReplayScript.Run(ctx, s.rdb, []string{k(id, "ep"), k(id, "replay_lease")},
		expect, r.ID, b, lease.Holder, lease.TTL.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("set replay state of %s: %w", id, err)
	}
	switch n {
	case -1:
		return fmt.Errorf("endpoint %s: %w", id, endpoint.ErrNotFound)
	case 0:
		return fmt.Errorf("replay %s of %s: %w", r.ID, id, ErrReplaySuperseded)
	case -2:
		return fmt.Errorf("replay %s of %s: %w", r.ID, id, ErrReplayLeaseLapsed)
	}
	return nil
}

// setReplayScript: KEYS = the endpoint, the replay's lease; ARGV = the
// replay ID that must be the stored one (empty for any), the replay's ID,
// its state (JSON), the lease's holder (empty: the replay ended, drop the
// lease) and TTL in ms. Returns -1 when the endpoint is gone, 0 when another
// replay is the latest, -2 when the holder no longer holds the lease, 1
// when written.
var setReplayScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], 'cfg') == 0 then return -1 end
if ARGV[1] ~= '' and (redis.call('HGET', KEYS[1], 'replay_id') or '') ~= ARGV[1] then return 0 end
if ARGV[1] ~= '' and ARGV[4] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[4] then return -2 end
redis.call('HSET', KEYS[1], 'replay_id', ARGV[2], 'replay', ARGV[3])
if ARGV[4] ~= '' then
  redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[5])
else
  redis.call('DEL', KEYS[2])
end
return 1`)

// RenewReplays extends the leases of the replays holder holds (endpoint ID
// to replay ID) by ttl, every one in one pipeline, and returns those it
// still holds. A replay superseded by a newer request, or whose lease
// lapsed (it reads as interrupted), is not renewed and not returned; one
// whose script failed is not returned either, and the error says why.
func (s *Store) RenewReplays(ctx context.Context, replays map[string]string, holder string, ttl time.Duration) (map[string]bool, error) {
	ids := make([]string, 0, len(replays))
	calls := make([]scriptCall, 0, len(replays))
	for id, replay := range replays {
		ids = append(ids, id)
		calls = append(calls, scriptCall{keys: []string{k(id, "ep"), k(id, "replay_lease")}, args: []any{replay, holder, ttl.Milliseconds()}})
	}
	cmds, err := s.evalEach(ctx, renewReplayScript, calls)
	held := make(map[string]bool, len(ids))
	for i, c := range cmds {
		if n, cerr := c.Int(); cerr == nil && n == 1 {
			held[ids[i]] = true
		}
	}
	if err != nil {
		return held, fmt.Errorf("renew %d replay leases: %w", len(ids), err)
	}
	return held, nil
}

// renewReplayScript: KEYS = the endpoint, the replay's lease; ARGV = the
// replay ID, the holder, the TTL in ms. Returns 1 when renewed, 0 when the
// replay is no longer the latest or the holder's.
var renewReplayScript = redis.NewScript(`
if (redis.call('HGET', KEYS[1], 'replay_id') or '') ~= ARGV[1] then return 0 end
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1`)

// List returns the owner's endpoints.
func (s *Store) List(ctx context.Context, owner string) ([]endpoint.Endpoint, error) {
	ids, err := s.rdb.SMembers(ctx, ownerKey(owner)).Result()
	if err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	return s.load(ctx, ids)
}

// All returns every endpoint.
func (s *Store) All(ctx context.Context) ([]endpoint.Endpoint, error) {
	ids, err := s.rdb.SMembers(ctx, allKey).Result()
	if err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	return s.load(ctx, ids)
}

func (s *Store) load(ctx context.Context, ids []string) ([]endpoint.Endpoint, error) {
	cmds := make([]*redis.StringCmd, len(ids))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.HGet(ctx, k(id, "ep"), "cfg")
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("load endpoints: %w", err)
	}
	out := make([]endpoint.Endpoint, 0, len(ids))
	for _, c := range cmds {
		b, err := c.Bytes()
		if err != nil {
			continue // deleted meanwhile
		}
		var e endpoint.Endpoint
		if err := json.Unmarshal(b, &e); err != nil {
			return nil, fmt.Errorf("decode endpoint: %w", err)
		}
		out = append(out, e)
	}
	return out, nil
}

// Delete removes an endpoint, everything queued for it, its delivery
// records with their bodies, and its sender's and replay's leases. One
// script removes the endpoint's own keys (one slot), finding the bodies
// from the delivery list, not by scanning the keyspace; the sets that list
// the endpoint and the version are other slots and follow.
//
// A sender still running for the endpoint stops: it finds the endpoint
// gone at its next read, its writes made meanwhile write nothing for an
// endpoint whose configuration is gone, and its renewals find no lease to
// renew, so its manager stops it (none is taken again for it: Leases takes
// no lease of a deleted endpoint). Left to expire, the lease would be
// renewed by that sender's manager until its next scan.
func (s *Store) Delete(ctx context.Context, e endpoint.Endpoint) error {
	keys := []string{k(e.ID, "dl"), k(e.ID, "body:"), k(e.ID, "ep"), k(e.ID, "q"), k(e.ID, "inflight"), k(e.ID, "hw"), k(e.ID, "replay_lease"), k(e.ID, "lease")}
	err := deleteScript.Run(ctx, s.rdb, keys).Err()
	if err == nil {
		_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.SRem(ctx, ownerKey(e.Owner), e.ID)
			p.SRem(ctx, allKey, e.ID)
			p.Incr(ctx, versionKey)
			return nil
		})
	}
	if err != nil {
		return fmt.Errorf("delete endpoint %s: %w", e.ID, err)
	}
	return nil
}

// deleteScript: KEYS = the delivery list, the body keys' prefix, then the
// endpoint's other keys.
var deleteScript = redis.NewScript(`
for _, r in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local ok, d = pcall(cjson.decode, r)
  if ok and type(d) == 'table' and type(d.id) == 'string' then
    redis.call('DEL', KEYS[2] .. d.id)
  end
end
redis.call('DEL', KEYS[1], unpack(KEYS, 3))
return 1`)

// Version changes whenever an endpoint is created, changed or deleted.
func (s *Store) Version(ctx context.Context) (int64, error) {
	v, err := s.rdb.Get(ctx, versionKey).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("endpoints version: %w", err)
	}
	return v, nil
}

// Event is one event queued for an endpoint.
type Event struct {
	// Seq is the event's stream sequence: CLICKS' for a click (DedupSeq
	// uses it), FRAUD's for a fraud alert, 0 for a test event. It is kept
	// with the queued event, for a replay's ClearUpTo.
	Seq uint64
	// Entry is the queue entry's ID (set when read).
	Entry string
	// ID is the event's ID, sent in the body (the webhook-id names the
	// whole body).
	ID   string
	Type string
	Time time.Time
	// Data is the event's payload as published.
	Data json.RawMessage
}

// Size is about what the event adds to a request body.
func (e Event) Size() int { return len(e.ID) + len(e.Type) + len(e.Data) + 64 }

// Enqueue appends events to endpoints' queues and returns how many were
// added and how many older events each endpoint dropped to stay within
// MaxBacklog. Duplicates are skipped by Dedup:
//
//   - DedupSeq: events carry their CLICKS sequence (Seq) and all come from
//     one partition; each endpoint remembers the highest sequence it queued
//     per partition and skips events at or below it. A partition is read
//     in order by one member at a time, so a batch handed again (a crash
//     before the ack, a new owner) queues nothing twice, in O(1) memory.
//   - DedupID: each event ID is remembered for DedupTTL (fraud alerts,
//     which are few).
//   - DedupNone: test events (a replay's copies, queued as DedupNone,
//     go through EnqueueReplay).
//
// With DedupSeq and DedupID (live intake) the script also skips an event
// at or below the endpoint's cut for its type (ReplayClicksUpto,
// ReplayAlertsUpto) as stored when it runs. The intake routes a batch by
// the endpoints as it last loaded them, so by an older cut when a replay
// cut since: queued after that replay's clear, the batch's events at or
// below the new cut would sit beside the replay's copies of them, and the
// receiver would get each twice.
//
// An endpoint deleted meanwhile gets nothing (an intake batch routed with
// the endpoints loaded before the delete, a test event): its queue and
// marks would outlive it, and nothing would delete them. A replay still
// copying is refused instead (EnqueueReplay).
func (s *Store) Enqueue(ctx context.Context, mode Dedup, partition int, byEndpoint map[string][]Event) (added, dropped map[string]int64, err error) {
	if len(byEndpoint) == 0 {
		return nil, nil, nil
	}
	added, dropped, err = s.enqueue(ctx, mode, partition, byEndpoint)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// A pipeline does not fall back from EVALSHA to EVAL: load the
		// script (a fresh or flushed server) and try once more.
		if lerr := enqueueScript.Load(ctx, s.rdb).Err(); lerr != nil {
			return nil, nil, fmt.Errorf("enqueue: load script: %w", lerr)
		}
		added, dropped, err = s.enqueue(ctx, mode, partition, byEndpoint)
	}
	if err == nil {
		keys := make([]string, 0, len(byEndpoint))
		for id := range byEndpoint {
			keys = append(keys, k(id, "q"))
		}
		s.replicated(ctx, "enqueue", keys)
	}
	return added, dropped, err
}

func (s *Store) enqueue(ctx context.Context, mode Dedup, partition int, byEndpoint map[string][]Event) (added, dropped map[string]int64, err error) {
	res, err := s.runEnqueue(ctx, mode, partition, byEndpoint, ReplayHold{})
	if err != nil {
		return nil, nil, err
	}
	added, dropped = map[string]int64{}, map[string]int64{}
	for id, r := range res {
		if r[0] > 0 {
			added[id] = r[0]
		}
		if r[1] > 0 {
			dropped[id] = r[1]
		}
	}
	return added, dropped, nil
}

// runEnqueue runs enqueueScript once per endpoint, in one pipeline, for
// replay hold (none when its ID is empty), and returns each endpoint's
// {added, dropped} as the script answered.
func (s *Store) runEnqueue(ctx context.Context, mode Dedup, partition int, byEndpoint map[string][]Event, hold ReplayHold) (map[string][]int64, error) {
	cmds := map[string]*redis.Cmd{}
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for id, evs := range byEndpoint {
			args := []any{int(mode), partition, s.MaxBacklog, int64(DedupTTL / time.Second), hold.ID, hold.Holder}
			for _, e := range evs {
				args = append(args, e.Seq, e.ID, e.Type, e.Time.UnixNano(), []byte(e.Data))
			}
			cmds[id] = enqueueScript.EvalSha(ctx, p, []string{k(id, "q"), k(id, "hw"), k(id, "seen:"), k(id, "ep"), k(id, "replay_lease")}, args...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("enqueue: %w", err)
	}
	res := make(map[string][]int64, len(cmds))
	for id, c := range cmds {
		r, err := c.Int64Slice()
		if err != nil || len(r) != 2 {
			return nil, fmt.Errorf("enqueue for %s: %v", id, err)
		}
		res[id] = r
	}
	return res, nil
}

// ReplayHold names a replay and the instance holding its lease, for the
// writes the replay makes (UpdateAsReplay, ClearUpTo, EnqueueReplay): each
// is made only while that replay is the endpoint's latest and the instance
// still holds its lease.
type ReplayHold struct {
	// ID is the replay's (Replay.ID).
	ID string
	// Holder is the instance holding its lease (ReplayLease.Holder).
	Holder string
}

// EnqueueReplay appends a replay's copied events to endpoint id's queue,
// as Enqueue does with DedupNone, while hold's replay is the endpoint's
// latest and hold.Holder holds its lease; otherwise it queues nothing and
// returns ErrReplaySuperseded or ErrReplayLeaseLapsed, or
// endpoint.ErrNotFound once the endpoint is deleted (a deleted endpoint
// gets nothing, as from Enqueue, and its replay need copy no further). The
// check is the queueing script's own, so it is atomic with the write: a
// replay superseded by a newer request, or whose lease lapsed (it reads
// interrupted, and the owner may have asked again), queues nothing after
// the newer request was stored or the lease lapsed. A superseded replay's
// copies that landed later would survive the newer replay's clear (it
// drops what is queued when it runs) and reach the receiver twice, once
// from each replay.
func (s *Store) EnqueueReplay(ctx context.Context, id string, hold ReplayHold, evs []Event) (added, dropped int64, err error) {
	if hold.ID == "" || hold.Holder == "" {
		return 0, 0, fmt.Errorf("enqueue replay for %s: replay %q of holder %q: want both", id, hold.ID, hold.Holder)
	}
	if len(evs) == 0 {
		return 0, 0, nil
	}
	byEndpoint := map[string][]Event{id: evs}
	res, err := s.runEnqueue(ctx, DedupNone, 0, byEndpoint, hold)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if lerr := enqueueScript.Load(ctx, s.rdb).Err(); lerr != nil {
			return 0, 0, fmt.Errorf("enqueue replay: load script: %w", lerr)
		}
		res, err = s.runEnqueue(ctx, DedupNone, 0, byEndpoint, hold)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("enqueue replay %s: %w", hold.ID, err)
	}
	switch r := res[id]; r[0] {
	case -1:
		return 0, 0, fmt.Errorf("replay %s of %s: %w", hold.ID, id, ErrReplaySuperseded)
	case -2:
		return 0, 0, fmt.Errorf("replay %s of %s: %w", hold.ID, id, ErrReplayLeaseLapsed)
	case -3:
		return 0, 0, fmt.Errorf("endpoint %s: %w", id, endpoint.ErrNotFound)
	default:
		s.replicated(ctx, "enqueue", []string{k(id, "q")})
		return r[0], r[1], nil
	}
}

// Dedup says how Enqueue skips duplicates.
type Dedup int

// Dedup modes (see Enqueue).
const (
	DedupNone Dedup = iota
	DedupSeq
	DedupID
)

// DedupTTL is how long DedupID remembers an event ID.
const DedupTTL = 24 * time.Hour

// enqueueScript: KEYS = the queue, the partition marks, the seen keys'
// prefix, the endpoint (nothing is queued once its configuration is gone),
// the replay's lease; ARGV = mode, partition, maxlen, ttl, the replay
// queueing (empty: none) and its lease's holder, then (seq, id, type, ts,
// data) per event. In modes 1 and 2 (live intake) an event at or below the
// stored configuration's cut for its type (replay_clicks_upto,
// replay_alerts_upto) is skipped. Returns {added, dropped} ({0, 0} once
// the endpoint is gone); for a replay, {-1, 0} when another replay is the
// endpoint's latest, {-2, 0} when the holder no longer holds its lease,
// {-3, 0} when the endpoint is gone (nothing queued).
var enqueueScript = redis.NewScript(`
local cfg = redis.call('HGET', KEYS[4], 'cfg')
if not cfg then
  if ARGV[5] ~= '' then return {-3, 0} end
  return {0, 0}
end
if ARGV[5] ~= '' then
  if (redis.call('HGET', KEYS[4], 'replay_id') or '') ~= ARGV[5] then return {-1, 0} end
  if redis.call('GET', KEYS[5]) ~= ARGV[6] then return {-2, 0} end
end
local mode, part, maxlen, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local cuts = {}
if mode ~= 0 then
  local ok, e = pcall(cjson.decode, cfg)
  if ok and type(e) == 'table' then
    cuts['` + endpoint.TypeClick + `'] = tonumber(e.replay_clicks_upto) or 0
    cuts['` + endpoint.TypeFraudAlert + `'] = tonumber(e.replay_alerts_upto) or 0
  end
end
local hw = 0
if mode == 1 then hw = tonumber(redis.call('HGET', KEYS[2], part) or '0') end
local top, added, dropped = hw, 0, 0
for i = 7, #ARGV, 5 do
  local seq = tonumber(ARGV[i])
  local cut = cuts[ARGV[i+2]] or 0
  local ok = true
  if cut > 0 and seq <= cut then
    ok = false
  elseif mode == 1 then
    ok = seq > hw
    if seq > top then top = seq end
  elseif mode == 2 then
    ok = redis.call('SET', KEYS[3] .. ARGV[i+1], '1', 'NX', 'EX', ttl)
  end
  if ok then
    if redis.call('XLEN', KEYS[1]) >= maxlen then dropped = dropped + 1 end
    redis.call('XADD', KEYS[1], 'MAXLEN', maxlen, '*', 'id', ARGV[i+1], 't', ARGV[i+2], 'ts', ARGV[i+3], 'd', ARGV[i+4], 's', ARGV[i])
    added = added + 1
  end
end
if mode == 1 and top > hw then redis.call('HSET', KEYS[2], part, top) end
return {added, dropped}`)

// Read returns up to count queued events of endpoint id after entry after
// ("0": from the oldest), at most maxBytes in all (at least one event).
// With block > 0 it waits that long for one to arrive.
func (s *Store) Read(ctx context.Context, id, after string, count int, maxBytes int, block time.Duration) ([]Event, error) {
	var msgs []redis.XMessage
	if block > 0 {
		res, err := s.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{k(id, "q"), after}, Count: int64(count), Block: block}).Result()
		if errors.Is(err, redis.Nil) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read queue of %s: %w", id, err)
		}
		for _, r := range res {
			msgs = append(msgs, r.Messages...)
		}
	} else {
		start := "-"
		if after != "0" {
			start = "(" + after
		}
		var err error
		msgs, err = s.rdb.XRangeN(ctx, k(id, "q"), start, "+", int64(count)).Result()
		if err != nil {
			return nil, fmt.Errorf("read queue of %s: %w", id, err)
		}
	}
	out := make([]Event, 0, len(msgs))
	size := 0
	for _, m := range msgs {
		e := decodeEntry(m)
		if len(out) > 0 && size+e.Size() > maxBytes {
			break
		}
		size += e.Size()
		out = append(out, e)
	}
	return out, nil
}

// ReadRange returns the queued events from entry first to entry last,
// inclusive (a batch that was in flight).
func (s *Store) ReadRange(ctx context.Context, id, first, last string) ([]Event, error) {
	msgs, err := s.rdb.XRange(ctx, k(id, "q"), first, last).Result()
	if err != nil {
		return nil, fmt.Errorf("read queue of %s: %w", id, err)
	}
	out := make([]Event, len(msgs))
	for i, m := range msgs {
		out[i] = decodeEntry(m)
	}
	return out, nil
}

func decodeEntry(m redis.XMessage) Event {
	str := func(k string) string { s, _ := m.Values[k].(string); return s }
	ns, _ := strconv.ParseInt(str("ts"), 10, 64)
	seq, _ := strconv.ParseUint(str("s"), 10, 64)
	return Event{Seq: seq, Entry: m.ID, ID: str("id"), Type: str("t"), Time: time.Unix(0, ns).UTC(), Data: json.RawMessage(str("d"))}
}

// Delivered removes delivered events from the queue, clears the in-flight
// mark and clears the endpoint's delivery state (failing since, last error,
// attempts), in one script: the receiver took the batch, so a run of
// failures before it is over. Were the state cleared by a second call that
// could fail alone, a stale failing-since would stay, and the endpoint's
// next failure, however soon, would count from it and could disable it at
// once. The state is written only when a failing run is stored (most
// deliveries follow a success and write nothing more). Nothing is written
// for an endpoint deleted meanwhile.
//
// Nor once the endpoint's lease holds another token than the sender's
// (ErrLeaseLost): the lease passed to another sender (another instance's,
// or this instance's after this one stopped), which finds the batch in
// flight and sends it again (same webhook-id), and may since have marked
// its own next batch in flight and recorded failures of its own, which
// this write would delete.
//
// removed is how many of entries were still queued and are removed now:
// an entry the backlog bound dropped while its batch was in flight (and
// Enqueue counted as dropped then), or a replay's clear removed (the
// replay queues a copy of its event), left the queue before the receiver
// took it, and is not among them. 0 for a deleted endpoint.
func (s *Store) Delivered(ctx context.Context, id, token string, entries []string) (removed int, err error) {
	args := make([]any, 0, 1+len(entries))
	args = append(args, token)
	for _, e := range entries {
		args = append(args, e)
	}
	n, err := deliveredScript.Run(ctx, s.rdb, []string{k(id, "q"), k(id, "inflight"), k(id, "ep"), k(id, "lease")}, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("mark delivered for %s: %w", id, err)
	}
	if n == -2 {
		return 0, fmt.Errorf("mark delivered for %s: %w", id, ErrLeaseLost)
	}
	return n, nil
}

// deliveredScript: KEYS = the queue, the in-flight mark, the endpoint, its
// sender's lease; ARGV = the sender's lease token, then the delivered
// queue entries. Returns -2 when the lease holds another token, otherwise
// how many of the entries the queue still held and XDEL removed (0 for a
// deleted endpoint, whose queue and mark went with it: nothing written).
var deliveredScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[3], 'cfg') == 0 then return 0 end
if redis.call('GET', KEYS[4]) ~= ARGV[1] then return -2 end
local n = 0
if #ARGV > 1 then n = redis.call('XDEL', KEYS[1], unpack(ARGV, 2)) end
redis.call('DEL', KEYS[2])
if (redis.call('HGET', KEYS[3], 'failing_since') or '0') ~= '0' then
  redis.call('HSET', KEYS[3], 'failing_since', 0, 'last_error', '', 'attempts', 0)
end
return n`)

// SetInflight records the first and last queue entries of the batch about
// to be sent, so that after a crash the same batch (same webhook-id) is sent
// again, not a differently cut one. Nothing is recorded for an endpoint
// deleted meanwhile (the mark has no TTL and would outlive it), nor once
// the endpoint's lease holds another token than the sender's
// (ErrLeaseLost): the lease's next holder may have marked its own batch,
// which this mark would replace.
func (s *Store) SetInflight(ctx context.Context, id, token, first, last string) error {
	n, err := setInflightScript.Run(ctx, s.rdb, []string{k(id, "inflight"), k(id, "ep"), k(id, "lease")}, first+" "+last, token).Int()
	if err != nil {
		return fmt.Errorf("set in-flight batch of %s: %w", id, err)
	}
	if n == -2 {
		return fmt.Errorf("set in-flight batch of %s: %w", id, ErrLeaseLost)
	}
	return nil
}

// setInflightScript: KEYS = the in-flight mark, the endpoint, its sender's
// lease; ARGV = the mark, the sender's lease token. Returns -2 when the
// lease holds another token (nothing written), 1 otherwise (nothing
// written for a deleted endpoint).
var setInflightScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[2], 'cfg') == 0 then return 1 end
if redis.call('GET', KEYS[3]) ~= ARGV[2] then return -2 end
redis.call('SET', KEYS[1], ARGV[1])
return 1`)

// Inflight returns the batch recorded by SetInflight, if any.
func (s *Store) Inflight(ctx context.Context, id string) (first, last string, ok bool, err error) {
	v, err := s.rdb.Get(ctx, k(id, "inflight")).Result()
	if errors.Is(err, redis.Nil) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, fmt.Errorf("get in-flight batch of %s: %w", id, err)
	}
	var ok2 bool
	first, last, ok2 = cut(v)
	return first, last, ok2, nil
}

func cut(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == ' ' {
			return s[:i], s[i+1:], true
		}
	}
	return "", "", false
}

// Backlog returns how many events wait for endpoint id and the time of the
// oldest.
func (s *Store) Backlog(ctx context.Context, id string) (int64, time.Time, error) {
	var n *redis.IntCmd
	var first *redis.XMessageSliceCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		n = p.XLen(ctx, k(id, "q"))
		first = p.XRangeN(ctx, k(id, "q"), "-", "+", 1)
		return nil
	})
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("backlog of %s: %w", id, err)
	}
	var oldest time.Time
	if ms := first.Val(); len(ms) > 0 {
		oldest = decodeEntry(ms[0]).Time
	}
	return n.Val(), oldest, nil
}

// ClearUpTo drops what replay hold of endpoint id refills: the in-flight
// mark and every queued event stored at or before the replay's cut (a
// click at or below CLICKS sequence clicks, a fraud alert at or below
// FRAUD sequence alerts, a click or alert queued without its sequence).
// Events stored after the cut stay: live intake queued them, possibly
// before it heard of the replay, and the replay does not copy them. So do
// test events, which are in no stream: the replay would not bring back a
// test event whose ID the owner was answered. It
// reads the queue a chunk at a time (it holds up to MaxBacklog events) and
// needs no atomicity across chunks: what it deletes is never wanted again,
// and intake adds nothing at or below the cut once it has the endpoint's
// new cut. Each chunk is deleted by a script that deletes only while hold
// is the endpoint's latest replay and hold.Holder holds its lease, and
// otherwise deletes nothing and returns ErrReplaySuperseded or
// ErrReplayLeaseLapsed: a replay superseded while it clears would delete
// what the newer replay has copied since (up to the older cut), and the
// newer one would end done without those events. It returns how many it
// dropped.
func (s *Store) ClearUpTo(ctx context.Context, id string, hold ReplayHold, clicks, alerts uint64) (int, error) {
	if hold.ID == "" || hold.Holder == "" {
		return 0, fmt.Errorf("clear queue of %s: replay %q of holder %q: want both", id, hold.ID, hold.Holder)
	}
	del := func(entries []string) error {
		args := []any{hold.ID, hold.Holder}
		for _, e := range entries {
			args = append(args, e)
		}
		n, err := clearScript.Run(ctx, s.rdb, []string{k(id, "q"), k(id, "inflight"), k(id, "ep"), k(id, "replay_lease")}, args...).Int()
		if err != nil {
			return fmt.Errorf("clear queue of %s: %w", id, err)
		}
		switch n {
		case -1:
			return fmt.Errorf("replay %s of %s: %w", hold.ID, id, ErrReplaySuperseded)
		case -2:
			return fmt.Errorf("replay %s of %s: %w", hold.ID, id, ErrReplayLeaseLapsed)
		}
		return nil
	}
	if err := del(nil); err != nil { // the in-flight mark
		return 0, err
	}
	const chunk = 1000
	start, dropped := "-", 0
	for {
		msgs, err := s.rdb.XRangeN(ctx, k(id, "q"), start, "+", chunk).Result()
		if err != nil {
			return dropped, fmt.Errorf("clear queue of %s: %w", id, err)
		}
		var drop []string
		for _, m := range msgs {
			e := decodeEntry(m)
			upto := clicks
			if e.Type == endpoint.TypeFraudAlert {
				upto = alerts
			}
			if e.Type != endpoint.TypeTest && (e.Seq == 0 || e.Seq <= upto) {
				drop = append(drop, m.ID)
			}
		}
		if len(drop) > 0 {
			if err := del(drop); err != nil {
				return dropped, err
			}
			dropped += len(drop)
		}
		if len(msgs) < chunk {
			return dropped, nil
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}

// clearScript: KEYS = the queue, the in-flight mark, the endpoint, the
// replay's lease; ARGV = the replay clearing and its lease's holder, then
// the queue entries to delete (none: delete the in-flight mark). Returns
// -1 when another replay is the latest, -2 when the holder no longer holds
// the replay's lease (nothing deleted in either case), 1 when deleted.
var clearScript = redis.NewScript(`
if (redis.call('HGET', KEYS[3], 'replay_id') or '') ~= ARGV[1] then return -1 end
if redis.call('GET', KEYS[4]) ~= ARGV[2] then return -2 end
if #ARGV == 2 then
  redis.call('DEL', KEYS[2])
else
  redis.call('XDEL', KEYS[1], unpack(ARGV, 3))
end
return 1`)

// Delivery is one attempt to deliver a batch, as the owner sees it.
type Delivery struct {
	ID        string    `json:"id"`
	WebhookID string    `json:"webhook_id"`
	EventIDs  []string  `json:"event_ids"`
	Attempt   int       `json:"attempt"`
	Time      time.Time `json:"time"`
	Status    string    `json:"status"` // "delivered" or "failed"
	Code      int       `json:"response_code,omitempty"`
	// Response is the start of the response body (capped), never all of it.
	Response   string `json:"response,omitempty"`
	Error      string `json:"error,omitempty"`
	DurationMS int64  `json:"duration_ms"`
	Redelivery bool   `json:"redelivery,omitempty"`
}

// AddDelivery records an attempt and keeps its body for redelivery. Only
// the newest KeepDeliveries records are kept, and only a kept record can be
// redelivered, so one script pushes the record, trims the list and deletes
// the bodies of the records the trim evicted: an endpoint holds at most
// KeepDeliveries bodies, each for at most BodyTTL. Every record has its own
// ID (a retry or a redelivery is a new record with a new ID and its own
// body), so an evicted record's body is no other record's. An endpoint
// deleted meanwhile (its sender was mid-attempt) gets nothing recorded:
// the list and body would outlive it.
func (s *Store) AddDelivery(ctx context.Context, id string, d Delivery, body []byte) error {
	b, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("record delivery: %w", err)
	}
	err = addDeliveryScript.Run(ctx, s.rdb, []string{k(id, "dl"), k(id, "body:"), k(id, "ep")},
		b, d.ID, body, s.KeepDeliveries, s.BodyTTL.Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("record delivery for %s: %w", id, err)
	}
	return nil
}

// addDeliveryScript: KEYS = the delivery list, the body keys' prefix, the
// endpoint (nothing is recorded once its configuration is gone); ARGV =
// the record (JSON), its ID, its body, how many records to keep, the body's
// TTL in ms. An evicted record's body key is found from its "id".
var addDeliveryScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[3], 'cfg') == 0 then return 0 end
redis.call('SET', KEYS[2] .. ARGV[2], ARGV[3], 'PX', ARGV[5])
redis.call('LPUSH', KEYS[1], ARGV[1])
local keep = tonumber(ARGV[4])
local gone = redis.call('LRANGE', KEYS[1], keep, -1)
if #gone > 0 then
  if keep > 0 then redis.call('LTRIM', KEYS[1], 0, keep - 1) else redis.call('DEL', KEYS[1]) end
  for _, r in ipairs(gone) do
    local ok, d = pcall(cjson.decode, r)
    if ok and type(d) == 'table' and type(d.id) == 'string' then
      redis.call('DEL', KEYS[2] .. d.id)
    end
  end
end
return 1`)

// Deliveries returns endpoint id's most recent delivery records, newest first.
func (s *Store) Deliveries(ctx context.Context, id string) ([]Delivery, error) {
	raw, err := s.rdb.LRange(ctx, k(id, "dl"), 0, s.KeepDeliveries-1).Result()
	if err != nil {
		return nil, fmt.Errorf("deliveries of %s: %w", id, err)
	}
	out := make([]Delivery, 0, len(raw))
	for _, r := range raw {
		var d Delivery
		if err := json.Unmarshal([]byte(r), &d); err != nil {
			return nil, fmt.Errorf("decode delivery: %w", err)
		}
		out = append(out, d)
	}
	return out, nil
}

// Body returns a recent delivery's body, or endpoint.ErrNotFound once it
// expired.
func (s *Store) Body(ctx context.Context, id, delivery string) ([]byte, error) {
	b, err := s.rdb.Get(ctx, k(id, "body:"+delivery)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("delivery %s body (kept %s): %w", delivery, s.BodyTTL, endpoint.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("delivery %s body: %w", delivery, err)
	}
	return b, nil
}

// Lease takes the lease named id (the key snip:wh:{id}:lease) for holder
// for ttl, if no other holder has it; it extends it when holder already
// has it. The locks (LockInterest, LockOwner) are such leases; an
// endpoint's sender takes its lease with Leases, under a token of its own.
func (s *Store) Lease(ctx context.Context, id, holder string, ttl time.Duration) (bool, error) {
	ok, err := leaseScript.Run(ctx, s.rdb, []string{k(id, "lease")}, holder, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("lease %s: %w", id, err)
	}
	return ok == 1, nil
}

// Leases takes or renews the leases of endpoints ids for instance's
// senders, for ttl: one pipeline, so one round trip on one Redis (one per
// master on a cluster) whatever the count. One call per endpoint, one
// after the other, took a round trip each: an instance holding thousands
// of endpoints renewed the last one that many round trips after the first,
// late enough to lose it to another instance within the TTL.
//
// An endpoint's lease holds a token, "<instance>/<random>", taken afresh
// for each sender: the sender's writes (SetInflight, Delivered,
// RecordFailure, UpdateAsSender) are made only while the lease still holds
// its token, so a sender whose lease passed to another sender, on another
// instance or on its own after it stopped, writes nothing more, however
// late its command reaches Redis. An endpoint in running (its sender runs
// here: the token it was taken with) is renewed only while its lease still
// holds that token, never taken again (a lease that lapsed meanwhile is
// the next scan's to take, for a new sender). Any other endpoint's lease
// is taken with a new token when no one holds it or instance does (a
// sender of it that stopped, or the instance before a restart), and left
// when another instance does. It returns the endpoints whose lease
// instance holds now, with their tokens; one whose script failed is not
// among them, and the error says why. No lease of a deleted endpoint is
// taken or renewed (Delete removes it with the endpoint).
func (s *Store) Leases(ctx context.Context, ids []string, running map[string]string, instance string, ttl time.Duration) (map[string]string, error) {
	calls := make([]scriptCall, len(ids))
	tokens := make([]string, len(ids))
	for i, id := range ids {
		renew := "1"
		tokens[i] = running[id]
		if tokens[i] == "" {
			renew, tokens[i] = "0", instance+"/"+randomToken()
		}
		calls[i] = scriptCall{keys: []string{k(id, "lease"), k(id, "ep")}, args: []any{instance, tokens[i], ttl.Milliseconds(), renew}}
	}
	cmds, err := s.evalEach(ctx, senderLeaseScript, calls)
	held := make(map[string]string, len(ids))
	for i, c := range cmds {
		if n, cerr := c.Int(); cerr == nil && n == 1 {
			held[ids[i]] = tokens[i]
		}
	}
	if err != nil {
		return held, fmt.Errorf("lease %d endpoints: %w", len(ids), err)
	}
	return held, nil
}

// randomToken is the random part of a sender's lease token.
func randomToken() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// senderLeaseScript: KEYS = an endpoint's lease, the endpoint; ARGV = the
// instance, the token, the TTL in ms, 1 to renew only (the lease must hold
// the token). Otherwise the lease is taken under the token when free, or
// held by the instance (its name, or a token of its: "<instance>/" and no
// other slash). Returns 1 when held under the token now, 0 when not, and
// for an endpoint deleted meanwhile (a scan that listed it before the
// delete), whose lease would outlive it.
var senderLeaseScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[2], 'cfg') == 0 then return 0 end
local v = redis.call('GET', KEYS[1])
local ok = v == ARGV[2]
if not ok and ARGV[4] ~= '1' then
  local p = ARGV[1] .. '/'
  ok = v == false or v == ARGV[1] or (string.sub(v, 1, #p) == p and not string.find(v, '/', #p + 1, true))
end
if not ok then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1`)

// scriptCall is one run of a script in evalEach: its keys and arguments.
type scriptCall struct {
	keys []string
	args []any
}

// evalEach runs script once per call in one pipeline and returns each
// call's command, in order, with the first error of any (a call's error
// is also its command's). A pipeline does not fall back from EVALSHA to
// EVAL, so when the server lacks the script (a fresh or flushed server) it
// loads it and runs the pipeline once more.
func (s *Store) evalEach(ctx context.Context, script *redis.Script, calls []scriptCall) ([]*redis.Cmd, error) {
	if len(calls) == 0 {
		return nil, nil
	}
	run := func() ([]*redis.Cmd, error) {
		cmds := make([]*redis.Cmd, len(calls))
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, c := range calls {
				cmds[i] = script.EvalSha(ctx, p, c.keys, c.args...)
			}
			return nil
		})
		return cmds, err
	}
	cmds, err := run()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if lerr := script.Load(ctx, s.rdb).Err(); lerr != nil {
			return cmds, fmt.Errorf("load script: %w", lerr)
		}
		cmds, err = run()
	}
	return cmds, err
}

var leaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0`)

// interestLease is the lease id of the lock that serialises narrowing the
// webhooks group's consumers (see delivery.Narrower).
const interestLease = "interest"

// LockInterest takes the narrowing lock for instance for ttl (or extends
// it); false when another instance holds it.
func (s *Store) LockInterest(ctx context.Context, instance string, ttl time.Duration) (bool, error) {
	return s.Lease(ctx, interestLease, instance, ttl)
}

// UnlockInterest gives the narrowing lock up, if instance holds it.
func (s *Store) UnlockInterest(ctx context.Context, instance string) error {
	return s.Release(ctx, interestLease, instance)
}

// LockOwner takes the lock that serialises owner's endpoint creations for
// holder (one create), for at most ttl; false while another create holds
// it. Under it, a create counts the owner's endpoints and stores its own.
func (s *Store) LockOwner(ctx context.Context, owner, holder string, ttl time.Duration) (bool, error) {
	return s.Lease(ctx, "owner:"+owner, holder, ttl)
}

// UnlockOwner gives the owner's create lock up, if holder holds it.
func (s *Store) UnlockOwner(ctx context.Context, owner, holder string) error {
	return s.Release(ctx, "owner:"+owner, holder)
}

// Release gives up the lease named id if holder (a lock's holder, or a
// sender's token) has it.
func (s *Store) Release(ctx context.Context, id, holder string) error {
	return releaseScript.Run(ctx, s.rdb, []string{k(id, "lease")}, holder).Err()
}

var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1`)
