package events

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// Stream names. Their configuration (retention, limits, consumers) is in
// package topology; the names are here because publishers and readers both
// need them.
const (
	// ClicksStream is the log of every click, partitioned by link code.
	ClicksStream = "CLICKS"
	// LinksStream is the link lifecycle as facts: created and deleted.
	LinksStream = "LINKS"
	// PreviewJobsStream is the work queue of preview fetches.
	PreviewJobsStream = "PREVIEW_JOBS"
	// PreviewAdvisoriesStream keeps the server's MAX_DELIVERIES advisories
	// about PREVIEW_JOBS until a preview instance has parked the job each
	// one names: the server announces such a job once, on core NATS.
	PreviewAdvisoriesStream = "PREVIEW_ADVISORIES"
	// DeadLetterStream holds what could not be processed: preview jobs that
	// ran out of tries and log events a reader parked.
	DeadLetterStream = "DEAD_LETTER"
	// FraudStream holds fraud alerts.
	FraudStream = "FRAUD"
	// FraudVerdictsStream holds fraud verdicts, many labels a message
	// (FraudVerdictBatch): a correction log with a duplicate window that
	// fits its volume, apart from the alerts' long one.
	FraudVerdictsStream = "FRAUD_VERDICTS"
)

// Subjects and subject patterns.
const (
	// ClicksSubjects is what CLICKS listens on: clicks.<owner>.<code>.
	ClicksSubjects = "clicks.*.*"
	// LinksSubjects is what LINKS listens on: links.<event>.<code>.
	LinksSubjects = "links.*.*"
	// PreviewJobSubject is the one subject of the preview work queue.
	PreviewJobSubject = "jobs.preview"
	// PreviewAdvisorySubjects is what PREVIEW_ADVISORIES captures: the
	// MAX_DELIVERIES advisories of every consumer of PREVIEW_JOBS
	// (MaxDeliveriesAdvisorySubject).
	PreviewAdvisorySubjects = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + PreviewJobsStream + ".>"
	// DeadLetterSubjects is what DEAD_LETTER listens on: dead.<source>.<reason>.
	DeadLetterSubjects = "dead.*.*"
	// FraudAlertSubjects is where alerts go: fraud.alerts.<code>.
	FraudAlertSubjects = "fraud.alerts.*"
	// FraudVerdictSubjects is what FRAUD_VERDICTS listens on: verdict
	// messages on fraud.verdicts.<partition> (FraudVerdictBatchSubject), and
	// the single verdicts of older detectors on fraud.verdicts.<owner>.<code>.
	FraudVerdictSubjects = "fraud.verdicts.>"
)

// Headers Snip sets besides Nats-Msg-Id.
const (
	// HeaderMsgID is JetStream's deduplication header; Snip puts the event ID in it.
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderDeadReason says why a message was dead-lettered (a short token).
	HeaderDeadReason = "Snip-Dead-Reason"
	// HeaderDeadError carries the last error text of a dead-lettered message.
	HeaderDeadError = "Snip-Dead-Error"
	// HeaderDeadSource names the stream the dead-lettered message came from.
	HeaderDeadSource = "Snip-Dead-Stream"
	// HeaderDeadSubject is the subject the dead-lettered message had.
	HeaderDeadSubject = "Snip-Dead-Subject"
	// HeaderDeadSeq is the stream sequence the dead-lettered message had.
	HeaderDeadSeq = "Snip-Dead-Seq"
	// HeaderDeadAttempts is how many deliveries were tried before giving up.
	HeaderDeadAttempts = "Snip-Dead-Attempts"
	// HeaderDeadGroup names the consumer group or consumer that gave up.
	HeaderDeadGroup = "Snip-Dead-Consumer"
)

// ClickSubject is the subject a click is published on. The stream stores it
// with the partition number in front (see PartitionedClickSubject).
func ClickSubject(owner, code string) string {
	return "clicks." + owner + "." + code
}

// PartitionedClickSubject is the subject CLICKS stores a click under once its
// subject transform has put the partition number in front:
// <partition>.clicks.<owner>.<code>.
func PartitionedClickSubject(partitions int, owner, code string) string {
	return strconv.Itoa(Partition(code, partitions)) + "." + ClickSubject(owner, code)
}

// ClicksTransformSource and ClicksTransformDest are the CLICKS subject
// transform: the partition is a hash of the link code (token 2), so every
// click of one link lands in one partition and keeps its order there.
const ClicksTransformSource = "clicks.*.*"

// ClicksTransformDest returns the transform destination for n partitions.
func ClicksTransformDest(n int) string {
	return "{{partition(" + strconv.Itoa(n) + ",2)}}.clicks.{{wildcard(1)}}.{{wildcard(2)}}"
}

// PartitionFilter is the filter subject of partition p of CLICKS.
func PartitionFilter(p int) string {
	return strconv.Itoa(p) + ".clicks.>"
}

// PartitionOf returns the partition number a stored CLICKS subject carries, or
// -1 if the subject is not a partitioned click subject.
func PartitionOf(storedSubject string) int {
	i := strings.IndexByte(storedSubject, '.')
	if i <= 0 {
		return -1
	}
	p, err := strconv.Atoi(storedSubject[:i])
	if err != nil || p < 0 {
		return -1
	}
	return p
}

// Partition computes the partition of a link code exactly as nats-server's
// partition() mapping does (FNV-1a 32 of the token, modulo n), so tools and
// tests can know where a link's clicks are stored without asking the server.
func Partition(code string, n int) int {
	if n <= 0 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(code))
	return int(h.Sum32() % uint32(n))
}

// LinkSubject is the subject of a link lifecycle event.
func LinkSubject(kind LinkEventKind, code string) string {
	return "links." + string(kind) + "." + code
}

// DeadLetterSubject is the subject a dead letter from source is parked on,
// for example dead.preview.max_deliveries or dead.click-counter.malformed.
func DeadLetterSubject(source, reason string) string {
	return "dead." + source + "." + reason
}

// MaxDeliveriesAdvisorySubject is where the server announces, in the
// account of the stream, that a message of stream's consumer ran out of
// deliveries (io.nats.jetstream.advisory.v1.max_deliver).
func MaxDeliveriesAdvisorySubject(stream, consumer string) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + stream + "." + consumer
}

// FraudAlertSubject is the subject of an alert about one link.
func FraudAlertSubject(code string) string {
	return "fraud.alerts." + code
}

// FraudVerdictSubject is the subject of a single per-click verdict on one
// link, as detectors published it before verdicts came in bulk
// (FraudVerdictBatchSubject).
func FraudVerdictSubject(owner, code string) string {
	return "fraud.verdicts." + owner + "." + code
}

// MaxTokenLen bounds owner IDs and link codes.
const MaxTokenLen = 64

// ValidToken reports whether s can be used as one subject token: 1 to
// MaxTokenLen characters, each a letter, digit, '-' or '_'.
func ValidToken(s string) bool {
	if len(s) == 0 || len(s) > MaxTokenLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}
