package events

import (
	"fmt"
	"time"
)

// LinkVersion is the schema version of LinkEvent.
const LinkVersion = 1

// LinkEventKind is the second token of a LINKS subject.
type LinkEventKind string

// The link lifecycle.
const (
	LinkCreated LinkEventKind = "created"
	LinkDeleted LinkEventKind = "deleted"
)

// LinkEvent is a fact about a link's lifecycle, published to LINKS on
// LinkSubject(Kind, Code) through the redirect service's outbox, in the same
// Redis transaction as the change it describes.
type LinkEvent struct {
	V      int           `json:"v"`
	ID     string        `json:"id"`
	Kind   LinkEventKind `json:"kind"`
	Time   time.Time     `json:"ts"`
	Code   string        `json:"code"`
	Owner  string        `json:"owner"`
	Target string        `json:"target,omitempty"`
}

// DecodeLinkEvent parses and validates a link event.
func DecodeLinkEvent(data []byte) (LinkEvent, error) {
	var e LinkEvent
	if err := decodeVersioned(data, LinkVersion, &e); err != nil {
		return LinkEvent{}, fmt.Errorf("decode link event: %w", err)
	}
	switch {
	case !validID(e.ID):
		return LinkEvent{}, fmt.Errorf("decode link event: id %q: %w", e.ID, ErrMalformed)
	case e.Kind != LinkCreated && e.Kind != LinkDeleted:
		return LinkEvent{}, fmt.Errorf("decode link event %s: kind %q: %w", e.ID, e.Kind, ErrMalformed)
	case !ValidToken(e.Code) || !ValidToken(e.Owner):
		return LinkEvent{}, fmt.Errorf("decode link event %s: code %q owner %q: %w", e.ID, e.Code, e.Owner, ErrMalformed)
	}
	return e, nil
}

// PreviewJobVersion is the schema version of PreviewJob.
const PreviewJobVersion = 1

// PreviewJob asks a preview worker to fetch a link's target and store its
// title, description and image. It is queued on PreviewJobSubject through the
// outbox when a link is created. ID is the job ID (a UUIDv7); workers are
// idempotent by it.
type PreviewJob struct {
	V      int       `json:"v"`
	ID     string    `json:"id"`
	Time   time.Time `json:"ts"`
	Code   string    `json:"code"`
	Owner  string    `json:"owner"`
	Target string    `json:"target"`
}

// DecodePreviewJob parses and validates a preview job.
func DecodePreviewJob(data []byte) (PreviewJob, error) {
	var j PreviewJob
	if err := decodeVersioned(data, PreviewJobVersion, &j); err != nil {
		return PreviewJob{}, fmt.Errorf("decode preview job: %w", err)
	}
	switch {
	case !validID(j.ID):
		return PreviewJob{}, fmt.Errorf("decode preview job: id %q: %w", j.ID, ErrMalformed)
	case !ValidToken(j.Code) || !ValidToken(j.Owner):
		return PreviewJob{}, fmt.Errorf("decode preview job %s: code %q owner %q: %w", j.ID, j.Code, j.Owner, ErrMalformed)
	case j.Target == "":
		return PreviewJob{}, fmt.Errorf("decode preview job %s: no target: %w", j.ID, ErrMalformed)
	}
	return j, nil
}
