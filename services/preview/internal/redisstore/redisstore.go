// Package redisstore keeps link previews in Redis, one hash per link:
//
//	snip:preview:<code>
//	  status       ok | failed
//	  job_id       the preview job that wrote the hash (a UUIDv7, lower case)
//	  title, description, image, site_name, fetched_at (RFC 3339), url   when ok
//	  reason, error, failed_at                                           when failed
//
// The redirect service's GET /api/links/:code reads title, description,
// image, site_name and fetched_at, and status to tell "unavailable" from
// "pending" (no hash yet).
//
// Idempotency lives in the same hash: job_id says which job wrote it, and
// every write is a compare-and-set in one Lua script, so a redelivered job
// and a stale job of the same link can never overwrite a newer result, and
// the marker cannot disagree with the preview it describes. "Newer" is by
// the UUIDv7's value: IDs are compared in lower case, the form NewID writes,
// since the hex digits of either case are valid and "0193B..." sorts before
// "0193a..." as a string although it is the greater ID.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/services/preview/internal/preview"
)

// KeyPrefix is the prefix of preview keys.
const KeyPrefix = "snip:preview:"

// Key is the hash of code's preview.
func Key(code string) string { return KeyPrefix + code }

// Store is the Redis implementation of preview.Store.
type Store struct {
	rdb redis.UniversalClient
}

var _ preview.Store = (*Store)(nil)

// New returns a Store on rdb.
func New(rdb redis.UniversalClient) *Store { return &Store{rdb: rdb} }

// write replaces the hash with ARGV[3...] (field/value pairs, status
// ARGV[2], job ARGV[1]) and returns 1, unless a newer job wrote it or (for a
// failure marker) a preview is stored (0), or this job already stored its
// preview (2).
// UUIDv7 job IDs compare as strings in creation order once in one case:
// ARGV[1] is lower case (run), and a stored ID is lowered here, in case a
// writer stored another case.
var write = redis.NewScript(`
local cur = redis.call('HMGET', KEYS[1], 'job_id', 'status')
local job, status = cur[1], cur[2]
if job then
  job = string.lower(job)
  if job > ARGV[1] then return 0 end
  if job == ARGV[1] and status == 'ok' then return 2 end
end
if ARGV[2] == 'failed' and status == 'ok' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'job_id', ARGV[1], 'status', ARGV[2], unpack(ARGV, 3))
return 1
`)

// Done implements preview.Store.
func (s *Store) Done(ctx context.Context, code, jobID string) (bool, error) {
	v, err := s.rdb.HMGet(ctx, Key(code), "job_id", "status").Result()
	if err != nil {
		return false, fmt.Errorf("read preview %s: %w", code, err)
	}
	job, _ := v[0].(string)
	status, _ := v[1].(string)
	job, jobID = strings.ToLower(job), strings.ToLower(jobID)
	return job > jobID || job == jobID && status == "ok", nil
}

// Save implements preview.Store.
func (s *Store) Save(ctx context.Context, code string, r preview.Record) (preview.SaveResult, error) {
	n, err := s.run(ctx, code, r.JobID, "ok",
		"title", r.Title, "description", r.Description, "image", r.Image, "site_name", r.SiteName,
		"url", r.URL, "fetched_at", r.FetchedAt.UTC().Format(time.RFC3339))
	switch {
	case err != nil:
		return 0, err
	case n == 1:
		return preview.Stored, nil
	case n == 2:
		return preview.AlreadyStored, nil
	}
	return preview.Superseded, nil
}

// MarkFailed implements preview.Store.
func (s *Store) MarkFailed(ctx context.Context, code, jobID, reason, detail string, at time.Time) error {
	_, err := s.run(ctx, code, jobID, "failed", "reason", reason, "error", detail, "failed_at", at.UTC().Format(time.RFC3339))
	return err
}

// run runs write and returns its answer.
func (s *Store) run(ctx context.Context, code, jobID, status string, fields ...any) (int, error) {
	if jobID == "" {
		return 0, errors.New("write preview: no job id")
	}
	n, err := write.Run(ctx, s.rdb, []string{Key(code)}, append([]any{strings.ToLower(jobID), status}, fields...)...).Int()
	if err != nil {
		return 0, fmt.Errorf("write preview %s: %w", code, err)
	}
	return n, nil
}
