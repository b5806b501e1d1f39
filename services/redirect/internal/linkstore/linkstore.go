package linkstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/redirect/internal/link"
	"github.com/snipdev/snip/services/redirect/internal/outbox"
)

// generateTries is how often Create draws a new random code after a
// collision before giving up. With 62^7 codes a second collision in a row
// means something else is wrong.
const generateTries = 5

// Store keeps links in Redis. It is safe for concurrent use.
type Store struct {
	rdb    redis.UniversalClient
	layout outbox.Layout
	// maxOutbox is the most entries a shard's links or jobs lane may hold
	// before Create and Delete refuse with outbox.ErrFull.
	maxOutbox int64

	// newCode draws a random code (link.NewCode; tests replace it).
	newCode func() string
	// beforeExec, if set (tests), runs inside WATCH, after the checks and
	// before MULTI/EXEC, with the transaction's connection (Create's and
	// Delete's).
	beforeExec func(ctx context.Context, tx *redis.Tx) error

	// The replica wait (WaitForReplicas): off when waitN is 0.
	waitN       int
	waitTimeout time.Duration
	short       func(op string, got int64, err error)

	// written, if set, is told the stream ID of every outbox entry a
	// transaction stored (NoteWrites).
	written *outbox.Written
}

// NoteWrites makes the store tell w the stream ID of every outbox entry it
// writes, so shutdown can wait for them to be relayed. Call it before the
// store is used.
func (s *Store) NoteWrites(w *outbox.Written) { s.written = w }

// WaitForReplicas makes Create and Delete wait, after their transaction,
// until n replicas of the link's Redis master have it (WAIT on the
// transaction's connection, which counts the replicas that have every write
// of that connection), for at most timeout. Redis replicates
// asynchronously: without the wait, a link answered 201 is lost if its
// master dies before its replica has it. A wait that counts fewer replicas,
// or fails, fails nothing: the write is on the master, as with the wait
// off, and short (if not nil) is told the operation (create_link,
// delete_link), the replicas counted and the error. Call it before the
// store is used.
func (s *Store) WaitForReplicas(n int, timeout time.Duration, short func(op string, got int64, err error)) {
	s.waitN, s.waitTimeout, s.short = n, timeout, short
}

// waitReplicas is the replica wait after a transaction of op on tx.
func (s *Store) waitReplicas(ctx context.Context, tx *redis.Tx, op string) {
	if s.waitN <= 0 {
		return
	}
	got, err := tx.Wait(ctx, s.waitN, s.waitTimeout).Result()
	if (err != nil || got < int64(s.waitN)) && s.short != nil {
		s.short(op, got, err)
	}
}

// New returns a store.
func New(rdb redis.UniversalClient, layout outbox.Layout, maxOutbox int64) *Store {
	return &Store{rdb: rdb, layout: layout, maxOutbox: maxOutbox, newCode: link.NewCode}
}

// Preview states, as the API shows them.
const (
	// PreviewPending: the preview service has not written the link's
	// preview yet (the job is queued or being retried).
	PreviewPending = "pending"
	// PreviewOK: the fields are filled.
	PreviewOK = "ok"
	// PreviewUnavailable: the preview service gave up (Reason says why).
	PreviewUnavailable = "unavailable"
)

// Preview is what the preview service found at a link's target.
type Preview struct {
	Status      string     `json:"status"`
	Title       string     `json:"title,omitempty"`
	Description string     `json:"description,omitempty"`
	Image       string     `json:"image,omitempty"`
	SiteName    string     `json:"site_name,omitempty"`
	FetchedAt   *time.Time `json:"fetched_at,omitempty"`
	Reason      string     `json:"reason,omitempty"`
}

// PreviewKey is where the preview service stores a link's preview.
func PreviewKey(code string) string { return "snip:preview:" + code }

// Create stores a new link for owner. With code == "" it draws random codes
// until one is free and not a reserved word; otherwise code is taken as is (validated by the caller)
// or refused with ErrCodeTaken. The link, its link.created event (LINKS) and
// its preview job (PREVIEW_JOBS) are written in one MULTI/EXEC, under WATCH
// of the link key, so a concurrent create of the same code aborts the whole
// transaction and nothing of it is stored.
func (s *Store) Create(ctx context.Context, owner, target, code string) (link.Link, error) {
	custom := code != ""
	for range generateTries {
		if !custom {
			code = s.newCode()
			if link.IsReserved(code) {
				continue // 7 letters, as healthz and metrics: a path of the service's own
			}
		}
		l := link.Link{Code: code, Owner: owner, Target: target, Created: time.Now().UTC().Truncate(time.Millisecond)}
		err := s.create(ctx, l)
		if errors.Is(err, ErrCodeTaken) && !custom {
			continue
		}
		if err != nil {
			return link.Link{}, err
		}
		return l, nil
	}
	return link.Link{}, fmt.Errorf("create link: %d random codes in a row were taken: %w", generateTries, ErrCodeTaken)
}

func (s *Store) create(ctx context.Context, l link.Link) error {
	shard := s.layout.Shard(l.Code)
	key := s.layout.LinkKey(l.Code)
	ev := events.LinkEvent{V: events.LinkVersion, ID: events.NewID(), Kind: events.LinkCreated, Time: l.Created, Code: l.Code, Owner: l.Owner, Target: l.Target}
	job := events.PreviewJob{V: events.PreviewJobVersion, ID: events.NewID(), Time: l.Created, Code: l.Code, Owner: l.Owner, Target: l.Target}
	evData, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("create link %q: encode event: %w", l.Code, err)
	}
	jobData, err := json.Marshal(job)
	if err != nil {
		return fmt.Errorf("create link %q: encode job: %w", l.Code, err)
	}
	err = s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		n, err := tx.Exists(ctx, key).Result()
		if err != nil {
			return err
		}
		if n > 0 {
			return ErrCodeTaken
		}
		if err := s.checkRoom(ctx, tx, shard, outbox.LaneLinks, outbox.LaneJobs); err != nil {
			return err
		}
		if s.beforeExec != nil {
			if err := s.beforeExec(ctx, tx); err != nil {
				return err
			}
		}
		// Everything is validated and encoded before MULTI: Redis does not
		// roll back a command that fails inside EXEC, so nothing here may.
		var evAdd, jobAdd *redis.StringCmd
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.HSet(ctx, key, "owner", l.Owner, "target", l.Target, "created", l.Created.UnixMilli())
			evAdd = outbox.Add(ctx, p, s.layout.OutboxKey(shard, outbox.LaneLinks), ev.ID, events.LinkSubject(events.LinkCreated, l.Code), evData)
			jobAdd = outbox.Add(ctx, p, s.layout.OutboxKey(shard, outbox.LaneJobs), job.ID, events.PreviewJobSubject, jobData)
			return nil
		})
		if err == nil {
			s.written.Note(shard, outbox.LaneLinks, evAdd.Val())
			s.written.Note(shard, outbox.LaneJobs, jobAdd.Val())
			s.waitReplicas(ctx, tx, "create_link")
		}
		return err
	}, key)
	switch {
	case errors.Is(err, redis.TxFailedErr):
		// The link key changed between WATCH and EXEC: someone created (or
		// deleted) this code concurrently. EXEC ran nothing.
		return fmt.Errorf("create link %q: %w", l.Code, ErrCodeTaken)
	case errors.Is(err, ErrCodeTaken), errors.Is(err, outbox.ErrFull):
		return fmt.Errorf("create link %q: %w", l.Code, err)
	case err != nil:
		return fmt.Errorf("create link %q: %w: %w", l.Code, ErrUnavailable, err)
	}
	return nil
}

// checkRoom refuses with outbox.ErrFull when a lane the transaction writes
// is at its limit.
func (s *Store) checkRoom(ctx context.Context, tx *redis.Tx, shard int, lanes ...outbox.Lane) error {
	for _, lane := range lanes {
		n, err := tx.XLen(ctx, s.layout.OutboxKey(shard, lane)).Result()
		if err != nil {
			return err
		}
		if n >= s.maxOutbox {
			return fmt.Errorf("%s lane of shard %d holds %d entries: %w", lane.Name, shard, n, outbox.ErrFull)
		}
	}
	return nil
}

// Get returns the live link with code, or ErrNotFound.
func (s *Store) Get(ctx context.Context, code string) (link.Link, error) {
	m, err := s.rdb.HGetAll(ctx, s.layout.LinkKey(code)).Result()
	if err != nil {
		return link.Link{}, fmt.Errorf("get link %q: %w: %w", code, ErrUnavailable, err)
	}
	l, live := parse(code, m)
	if !live {
		return link.Link{}, fmt.Errorf("get link %q: %w", code, ErrNotFound)
	}
	return l, nil
}

func parse(code string, m map[string]string) (link.Link, bool) {
	if len(m) == 0 || m["deleted"] != "" || m["owner"] == "" {
		return link.Link{}, false
	}
	ms, _ := strconv.ParseInt(m["created"], 10, 64)
	return link.Link{Code: code, Owner: m["owner"], Target: m["target"], Created: time.UnixMilli(ms).UTC()}, true
}

// GetOwned returns owner's live link with code. Another owner's link is
// ErrNotFound too, so nobody can probe which codes exist.
func (s *Store) GetOwned(ctx context.Context, owner, code string) (link.Link, error) {
	l, err := s.Get(ctx, code)
	if err != nil {
		return link.Link{}, err
	}
	if l.Owner != owner {
		return link.Link{}, fmt.Errorf("get link %q: %w", code, ErrNotFound)
	}
	return l, nil
}

// Preview returns the state of a link's preview as the preview service
// left it in snip:preview:<code>: no hash is pending; status "failed" is
// unavailable (with its reason); status "ok", or no status with a title
// (an older writer), is ok with the fields.
func (s *Store) Preview(ctx context.Context, code string) (Preview, error) {
	m, err := s.rdb.HGetAll(ctx, PreviewKey(code)).Result()
	if err != nil {
		return Preview{}, fmt.Errorf("get preview %q: %w: %w", code, ErrUnavailable, err)
	}
	switch {
	case len(m) == 0:
		return Preview{Status: PreviewPending}, nil
	case m["status"] == "failed":
		return Preview{Status: PreviewUnavailable, Reason: m["reason"]}, nil
	case m["status"] != "" && m["status"] != "ok":
		return Preview{Status: PreviewPending}, nil
	}
	p := Preview{Status: PreviewOK, Title: m["title"], Description: m["description"], Image: m["image"], SiteName: m["site_name"]}
	if t := parseTime(m["fetched_at"]); !t.IsZero() {
		p.FetchedAt = &t
	}
	return p, nil
}

// parseTime accepts RFC 3339 or Unix seconds/milliseconds, so the preview
// service may write either.
func parseTime(s string) time.Time {
	if s == "" {
		return time.Time{}
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC()
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n > 1e12 {
			return time.UnixMilli(n).UTC()
		}
		return time.Unix(n, 0).UTC()
	}
	return time.Time{}
}

// deleteTries is how often Delete runs its transaction when a concurrent
// change of the link aborted it.
const deleteTries = 3

// Delete turns owner's link into a tombstone and writes link.deleted into
// the outbox, in one MULTI/EXEC under WATCH. Another owner's link, an
// unknown code and an already deleted link are all ErrNotFound, also one
// that a concurrent delete removed while this one ran (its transaction,
// aborted, runs again).
func (s *Store) Delete(ctx context.Context, owner, code string) error {
	shard := s.layout.Shard(code)
	key := s.layout.LinkKey(code)
	txf := func(tx *redis.Tx) error {
		m, err := tx.HGetAll(ctx, key).Result()
		if err != nil {
			return err
		}
		l, live := parse(code, m)
		if !live || l.Owner != owner {
			return ErrNotFound
		}
		if err := s.checkRoom(ctx, tx, shard, outbox.LaneLinks); err != nil {
			return err
		}
		if s.beforeExec != nil {
			if err := s.beforeExec(ctx, tx); err != nil {
				return err
			}
		}
		now := time.Now().UTC()
		ev := events.LinkEvent{V: events.LinkVersion, ID: events.NewID(), Kind: events.LinkDeleted, Time: now, Code: code, Owner: owner, Target: l.Target}
		data, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		var evAdd *redis.StringCmd
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.HSet(ctx, key, "deleted", now.UnixMilli())
			evAdd = outbox.Add(ctx, p, s.layout.OutboxKey(shard, outbox.LaneLinks), ev.ID, events.LinkSubject(events.LinkDeleted, code), data)
			return nil
		})
		if err == nil {
			s.written.Note(shard, outbox.LaneLinks, evAdd.Val())
			s.waitReplicas(ctx, tx, "delete_link")
		}
		return err
	}
	// The only other write to a live link's key is another delete of it:
	// a transaction it got ahead of runs again and finds the tombstone.
	var err error
	for range deleteTries {
		if err = s.rdb.Watch(ctx, txf, key); !errors.Is(err, redis.TxFailedErr) {
			break
		}
	}
	switch {
	case errors.Is(err, redis.TxFailedErr):
		return fmt.Errorf("delete link %q: changed concurrently, try again: %w", code, ErrUnavailable)
	case errors.Is(err, ErrNotFound), errors.Is(err, outbox.ErrFull):
		return fmt.Errorf("delete link %q: %w", code, err)
	case err != nil:
		return fmt.Errorf("delete link %q: %w: %w", code, ErrUnavailable, err)
	}
	return nil
}
