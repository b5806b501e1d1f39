// Package preview turns a preview job into a stored link preview: it checks
// that the job was not done already, fetches the link's target (safely, see
// package fetch), extracts title, description, image and site name (package
// unfurl), and stores them under the link's code.
//
// Process is idempotent by job ID, because the work queue delivers at least
// once: a job whose preview is stored, or one that a newer job of the same
// link superseded, does nothing. Its errors are *failure.Error values (the
// failure contract every Snip consumer shares) that say why
// and whether to retry; package workqueue turns them into acks, retries and
// dead letters.
package preview

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/preview/internal/fetch"
	"github.com/snipdev/snip/services/preview/internal/unfurl"
)

// Record is a stored preview: what unfurl found, where, when, and for which
// job.
type Record struct {
	JobID string
	unfurl.Preview
	// URL is the page's URL after redirects.
	URL       string
	FetchedAt time.Time
}

// Store keeps one preview per link code.
type Store interface {
	// Done reports whether the preview of code is stored by job jobID, or
	// by a newer job (job IDs are UUIDv7s: they sort by creation time,
	// compared by value, so in one case).
	Done(ctx context.Context, code, jobID string) (bool, error)
	// Save stores r as code's preview unless a newer job's result is
	// there, or this job's preview already is; it reports which.
	Save(ctx context.Context, code string, r Record) (SaveResult, error)
	// MarkFailed records that job jobID could not get code's preview, so
	// readers can say "unavailable"; a stored preview of an older job is
	// kept rather than replaced by the marker.
	MarkFailed(ctx context.Context, code, jobID, reason, detail string, at time.Time) error
}

// SaveResult is what Store.Save did.
type SaveResult int

const (
	// Stored: r is code's preview now.
	Stored SaveResult = iota
	// AlreadyStored: this job's preview was stored before (another copy of
	// the job, in hand at the same time, stored first); nothing written.
	AlreadyStored
	// Superseded: a newer job's result is there; nothing written.
	Superseded
)

// Fetcher gets pages; *fetch.Fetcher implements it.
type Fetcher interface {
	Get(ctx context.Context, url string) (*fetch.Response, error)
}

// Service processes preview jobs.
type Service struct {
	store   Store
	fetcher Fetcher
	log     *slog.Logger
	now     func() time.Time

	results *prometheus.CounterVec
	fetches *prometheus.HistogramVec
}

// New returns a Service; its metrics go to reg (nil: not registered).
func New(store Store, fetcher Fetcher, log *slog.Logger, reg prometheus.Registerer) *Service {
	s := &Service{
		store: store, fetcher: fetcher, log: log, now: time.Now,
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "snip_preview", Name: "jobs_total",
			Help: "Jobs processed to the end, by result: stored, duplicate (already done, or stored by another copy of the job first), superseded (a newer job of the link won).",
		}, []string{"result"}),
		fetches: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "snip_preview", Name: "fetch_duration_seconds",
			Help:    "Page fetch and parse time, by outcome (ok or the failure reason).",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12),
		}, []string{"outcome"}),
	}
	if reg != nil {
		reg.MustRegister(s.results, s.fetches)
	}
	return s
}

// Process handles one job payload from the queue.
func (s *Service) Process(ctx context.Context, data []byte) error {
	job, err := events.DecodePreviewJob(data)
	if err != nil {
		return classifyDecode(err)
	}
	done, err := s.store.Done(ctx, job.Code, job.ID)
	if err != nil {
		return transient(ReasonStore, 0, fmt.Errorf("check job %s: %w", job.ID, err))
	}
	if done {
		s.results.WithLabelValues("duplicate").Inc()
		return nil
	}
	start := time.Now()
	rec, err := s.fetch(ctx, job)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("fetch %s: %w", job.Code, ctx.Err()) // aborted: handed back
		}
		f := classifyFetch(err)
		s.fetches.WithLabelValues(f.Reason()).Observe(time.Since(start).Seconds())
		return f
	}
	s.fetches.WithLabelValues("ok").Observe(time.Since(start).Seconds())
	saved, err := s.store.Save(ctx, job.Code, rec)
	if err != nil {
		return transient(ReasonStore, 0, fmt.Errorf("save preview of %s: %w", job.Code, err))
	}
	switch saved {
	case Stored:
		s.results.WithLabelValues("stored").Inc()
		s.log.Debug("preview stored", "code", job.Code, "job", job.ID, "title", rec.Title)
	case AlreadyStored:
		s.results.WithLabelValues("duplicate").Inc()
	default:
		s.results.WithLabelValues("superseded").Inc()
	}
	return nil
}

func (s *Service) fetch(ctx context.Context, job events.PreviewJob) (Record, error) {
	resp, err := s.fetcher.Get(ctx, job.Target)
	if err != nil {
		return Record{}, err
	}
	defer resp.Body.Close()
	p, err := unfurl.Parse(resp.Body, resp.ContentType, resp.URL)
	if err != nil {
		return Record{}, fmt.Errorf("parse %s: %w", resp.URL.Redacted(), err)
	}
	return Record{JobID: job.ID, Preview: p, URL: resp.URL.String(), FetchedAt: s.now().UTC()}, nil
}

// Done reports whether the job in data needs no run: its link's preview is
// stored by this job or a newer one, the record Process skips it by. The
// queue's rescuer asks it before parking a job that ran out of deliveries,
// so a job whose last try succeeded and whose ack was lost leaves no dead
// letter. A malformed job is not done (it is parked).
func (s *Service) Done(ctx context.Context, data []byte) (bool, error) {
	job, err := events.DecodePreviewJob(data)
	if err != nil {
		return false, nil
	}
	done, err := s.store.Done(ctx, job.Code, job.ID)
	if err != nil {
		return false, fmt.Errorf("check job %s: %w", job.ID, err)
	}
	return done, nil
}

// OnDead records a dead-lettered job's failure on its link's preview, so
// the API can say "unavailable" instead of "pending". A malformed job names
// no link; a Redis failure is logged and the marker missing (the dead letter
// is the record that counts).
func (s *Service) OnDead(ctx context.Context, data []byte, reason, detail string) {
	job, err := events.DecodePreviewJob(data)
	if err != nil {
		return
	}
	if err := s.store.MarkFailed(ctx, job.Code, job.ID, reason, detail, s.now().UTC()); err != nil {
		s.log.Error("record failed preview", "code", job.Code, "job", job.ID, "err", err)
	}
}
