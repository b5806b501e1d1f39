// Package topology declares every JetStream stream, consumer and KV bucket
// Snip uses, in one place, and applies them idempotently: Apply creates what
// is missing and updates what changed, and never deletes a stream or its data.
//
// Services call Apply at start (so a fresh server works without a separate
// step) and `snipctl topology apply` does the same for operators who give
// services no stream-admin permissions. Changing the number of CLICKS
// partitions of an existing stream is refused (ErrPartitionsChanged): it would
// move links between partitions and break order per link. So is shrinking an
// existing stream's retention (ErrRetentionShrinks), which would discard
// events at once, unless Options.ShrinkRetention says the operator means it,
// and scaling an existing stream down to fewer replicas (ErrReplicasLowered)
// unless Options.LowerReplicas does. A consumer that exists with a setting
// the server cannot update in place is refused too (ErrConsumerImmutable),
// naming it and what the operator can do; where it began is kept.
package topology

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
)

// Defaults. Each is explained where it is used.
const (
	DefaultPartitions = 8
	DefaultReplicas   = 1
	// DefaultClicksMaxAge is how long CLICKS keeps events: long enough to
	// replay a week, and for a reader that was down for days to catch up.
	DefaultClicksMaxAge = 7 * 24 * time.Hour
	// DefaultClicksDuplicates is the CLICKS duplicate window. It must cover the
	// outbox relay's longest retry of an entry whose publish outcome it does
	// not know: a lease handover (seconds) plus publish timeouts. Two minutes
	// also bounds the server's memory for message IDs (about rate x window).
	DefaultClicksDuplicates = 2 * time.Minute
	// DeadLetterMaxAge is how long parked messages wait for a human.
	DeadLetterMaxAge = 14 * 24 * time.Hour
	// FraudMaxAge keeps alerts and verdicts as long as the clicks they judge,
	// and a little longer so a replay of CLICKS meets its verdicts.
	FraudMaxAge = 8 * 24 * time.Hour
	// FraudVerdictsDuplicates is the FRAUD_VERDICTS duplicate window. A
	// verdict message's ID comes from its detector batch's partition and
	// sequence range, and only the member holding that batch re-sends it:
	// when a publish or the Redis write fails, the runtime retries the
	// batch after a backoff of at most 10s, each try waiting up to the 10s
	// publish timeout, so two minutes covers six tries of one batch. A
	// re-send after the window (a longer outage) is stored twice and still
	// counted once: readers apply labels keyed by click ID. The server keeps
	// about 165 B per ID in the window: at one message per 500 labels, a
	// flood of 100,000 labelled clicks a second holds 24,000 IDs, 4 MB.
	FraudVerdictsDuplicates = 2 * time.Minute
	// DefaultVerdictsMaxBytes is no cap on FRAUD_VERDICTS, as on CLICKS: a
	// cap reserves its size on the server's store when the stream is created
	// (a 16 GiB cap does not fit a test server's 8 GiB). The stream is a
	// correction log its readers apply within seconds, kept FraudMaxAge, as
	// long as the clicks it labels; a deployment that wants a cap sets
	// Options.VerdictsMaxBytes (oldest verdicts, long since applied, go
	// first).
	DefaultVerdictsMaxBytes = -1
)

// Names of consumers and buckets declared here.
const (
	// PreviewConsumer is the one durable consumer all preview workers share.
	PreviewConsumer = "preview-workers"
	// PreviewRescueConsumer is the one durable consumer on
	// PREVIEW_ADVISORIES all preview instances share: each advisory goes to
	// one of them, which parks the job it names.
	PreviewRescueConsumer = "preview-rescuers"
	// MembersBucket is the KV bucket where consumer-group members keep their
	// heartbeat leases.
	MembersBucket = "snip_members"
	// ConsoleSessionsBucket is the KV bucket where the console records the
	// sessions it ended: revoked.<session ID> for a logout, not_before for
	// "revoke every session" (decision 0078).
	ConsoleSessionsBucket = "snip_console_sessions"
	// OutboxUntrimmedBucket is the KV bucket where the redirect's outbox
	// relay records a batch JetStream acknowledged whose trim from the
	// Redis outbox failed, per shard and lane (<shard>.<lane>), so that
	// an instance taking the shard over trims the batch instead of
	// publishing it again (decision 0177).
	OutboxUntrimmedBucket = "snip_outbox_untrimmed"
)

// ConsoleSessionTTL is how long a console session lasts, and so how long
// the sessions bucket keeps an entry: a revocation outlives the session it
// ends, and no session outlives a not_before it predates.
const ConsoleSessionTTL = 12 * time.Hour

// OutboxUntrimmedTTL is how long the outbox relay's bucket keeps a record
// of an untrimmed batch. A record is applied, or found stale and dropped,
// by the first relay that takes its shard while Redis answers: seconds
// after Redis is back (a lease lives 5 s). It waits longer only while
// Redis (or every redirect instance) stays away, and a day is past any
// such outage the redirect rides out otherwise (its cached links stop
// redirecting an hour past their TTL without Redis). A record that
// outlives its batch trims nothing (the relay's trim checks the lane's
// entries by event ID), so the TTL only bounds how long a forgotten one
// (its delete failed) lingers; one that expires before its batch is
// trimmed leaves that batch to be published again, as without records.
const OutboxUntrimmedTTL = 24 * time.Hour

// Consumer groups on CLICKS. Each has one durable consumer per partition.
const (
	GroupClickCounter    = "click-counter"
	GroupFraudDetection  = "fraud-detection"
	GroupWarehouseLoader = "warehouse-loader"
)

// Preview job retry policy (the contract in docs/architecture.md): five deliveries; the ack deadline of
// delivery n is PreviewBackOff[n-1] (the last value repeats), so a worker that
// crashes mid-fetch hands the job on after a short, growing wait.
var PreviewBackOff = []time.Duration{1 * time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}

// PreviewMaxDeliver is the number of tries a preview job gets.
const PreviewMaxDeliver = 5

// PreviewJobsMaxAge is how long PREVIEW_JOBS keeps a job nobody acked.
const PreviewJobsMaxAge = 7 * 24 * time.Hour

// PREVIEW_ADVISORIES limits. An advisory is a few hundred bytes of JSON and
// is deleted once its job is parked; one waits only while no preview
// instance runs, or while its rescue fails (DEAD_LETTER away). It is kept as long as the job it names can be in PREVIEW_JOBS
// (PreviewJobsMaxAge): a week with every instance down is ridden out. The
// count and byte caps bound the stream whatever happens (100,000 jobs that
// crashed their worker on the last try are a fault to fix, not a load):
// the oldest advisories go first, and their jobs stay in PREVIEW_JOBS until
// MaxAge, as every job did before the advisories were kept.
const (
	PreviewAdvisoriesMaxMsgs  = 100_000
	PreviewAdvisoriesMaxBytes = 64 << 20
)

// PreviewRescueAckWait is how long a preview instance may hold an advisory
// without a word before the server hands it to another. The rescuer says
// "in progress" three times per AckWait while it parks the job (bounded by
// twice the queue's operation timeout, 5s by default).
const PreviewRescueAckWait = 30 * time.Second

// ErrPartitionsChanged is returned by Apply when CLICKS exists with a different
// number of partitions than asked for.
var ErrPartitionsChanged = errors.New("CLICKS partition count differs from the existing stream")

// ErrRetentionShrinks is returned by Apply when an existing stream would keep
// less than it does: a shorter MaxAge, or a cap on bytes or messages where it
// has none or a larger one. The server would discard at once what falls
// outside the new limit, so a service started with a shorter
// SNIP_CLICKS_MAX_AGE than the operator applied would delete clicks. An
// operator who means it applies with Options.ShrinkRetention (`snipctl
// topology apply --shrink-retention`).
var ErrRetentionShrinks = errors.New("an existing stream would keep less than it does and discard the rest; apply with --shrink-retention (snipctl) to mean it")

// ErrReplicasLowered is returned by Apply when an existing stream or a KV
// bucket (the members', the console's sessions') has more replicas than
// asked for: scaling it down would drop copies of every event, so that the
// loss of one server then loses what only it held. A service started
// without the deployment's SNIP_REPLICAS would do so to every stream. An
// operator who means it applies with Options.LowerReplicas (`snipctl
// topology apply --lower-replicas`).
var ErrReplicasLowered = errors.New("an existing stream has more replicas than asked for; apply with --lower-replicas (snipctl) to scale it down")

// ErrConsumerImmutable is returned by Apply when a consumer it declares
// exists with a setting that differs from the declared one and that the
// server cannot update in place (its ack policy, say, made by hand or by
// another version): every Apply would otherwise fail with the server's
// refusal, and every service retry it at start for ever. The error names
// the consumer, the setting and what the operator can do: delete the
// consumer and apply again where that is safe, or recreate it by hand
// where deleting it would lose its position. Where the consumer began
// (deliver policy, start sequence or time) is not refused: an update keeps
// the existing consumer's.
var ErrConsumerImmutable = errors.New("an existing consumer has a setting the server cannot update in place")

// The ranges Apply accepts for Options.Partitions and Options.Replicas
// (JetStream replicates a stream on at most 5 servers).
const (
	MaxPartitions = 1024
	MaxReplicas   = 5
)

// Options are the deployment's choices. The zero value is not valid; start
// from Defaults().
type Options struct {
	// Partitions is the number of CLICKS partitions: the most members of one
	// consumer group that can work at once.
	Partitions int
	// Replicas is the stream replication factor: 1 on one machine, 3 in a cluster.
	Replicas int
	// ClicksMaxAge is CLICKS retention.
	ClicksMaxAge time.Duration
	// ClicksMaxBytes caps CLICKS on disk (oldest discarded first); -1 is no cap.
	ClicksMaxBytes int64
	// ClicksDuplicates is the CLICKS duplicate window.
	ClicksDuplicates time.Duration
	// VerdictsMaxBytes caps FRAUD_VERDICTS on disk (oldest discarded
	// first); -1 is no cap.
	VerdictsMaxBytes int64
	// Storage is file in every deployment; tests may use memory.
	Storage jetstream.StorageType
	// ShrinkRetention lets Apply lower an existing stream's retention
	// (ErrRetentionShrinks otherwise), discarding what falls outside: an
	// operator's deliberate `snipctl topology apply --shrink-retention`,
	// never a service's start.
	ShrinkRetention bool
	// LowerReplicas lets Apply scale an existing stream or a KV bucket
	// down to Replicas (ErrReplicasLowered otherwise): an
	// operator's deliberate `snipctl topology apply --lower-replicas`,
	// never a service's start.
	LowerReplicas bool
	// Applied, when set, is told of each stream, consumer and bucket as
	// Apply has applied it (kind "stream", "consumer" or "bucket"; stream
	// is a consumer's stream), so that what was applied before a failure
	// partway can be said: snipctl topology apply prints each.
	Applied func(kind, name, stream string)
}

func (o Options) applied(kind, name, stream string) {
	if o.Applied != nil {
		o.Applied(kind, name, stream)
	}
}

// Defaults returns the options of a single-node deployment.
func Defaults() Options {
	return Options{
		Partitions:       DefaultPartitions,
		Replicas:         DefaultReplicas,
		ClicksMaxAge:     DefaultClicksMaxAge,
		ClicksMaxBytes:   -1,
		ClicksDuplicates: DefaultClicksDuplicates,
		VerdictsMaxBytes: DefaultVerdictsMaxBytes,
		Storage:          jetstream.FileStorage,
	}
}

func (o Options) validate() error {
	switch {
	case o.Partitions < 1 || o.Partitions > MaxPartitions:
		return fmt.Errorf("partitions %d: want 1..%d", o.Partitions, MaxPartitions)
	case o.Replicas < 1 || o.Replicas > MaxReplicas:
		return fmt.Errorf("replicas %d: want 1..%d", o.Replicas, MaxReplicas)
	case o.ClicksMaxAge <= 0:
		return fmt.Errorf("clicks max age %s: want > 0", o.ClicksMaxAge)
	case o.ClicksDuplicates <= 0 || o.ClicksDuplicates > o.ClicksMaxAge:
		return fmt.Errorf("clicks duplicate window %s: want > 0 and <= max age", o.ClicksDuplicates)
	case o.VerdictsMaxBytes == 0 || o.VerdictsMaxBytes < -1:
		return fmt.Errorf("verdicts max bytes %d: want > 0, or -1 for no cap", o.VerdictsMaxBytes)
	}
	return nil
}

// Streams returns the configuration of every stream, in the order Apply
// creates them.
func Streams(o Options) []jetstream.StreamConfig {
	return []jetstream.StreamConfig{
		{
			Name:        events.ClicksStream,
			Description: "Every click, partitioned by link code: <partition>.clicks.<owner>.<code>",
			Subjects:    []string{events.ClicksSubjects},
			SubjectTransform: &jetstream.SubjectTransformConfig{
				Source:      events.ClicksTransformSource,
				Destination: events.ClicksTransformDest(o.Partitions),
			},
			Retention:  jetstream.LimitsPolicy,
			Discard:    jetstream.DiscardOld,
			MaxAge:     o.ClicksMaxAge,
			MaxBytes:   o.ClicksMaxBytes,
			MaxMsgs:    -1,
			Duplicates: o.ClicksDuplicates,
			Storage:    o.Storage,
			Replicas:   o.Replicas,
			// One click is well under 2 KiB; anything much larger is not a click.
			MaxMsgSize: 16 << 10,
			Metadata:   map[string]string{"snip.partitions": strconv.Itoa(o.Partitions)},
		},
		{
			Name:        events.LinksStream,
			Description: "Link lifecycle facts: links.<created|deleted>.<code>",
			Subjects:    []string{events.LinksSubjects},
			Retention:   jetstream.LimitsPolicy,
			Discard:     jetstream.DiscardOld,
			MaxAge:      0, // kept: the history of every link
			MaxBytes:    -1,
			MaxMsgs:     -1,
			Duplicates:  DefaultClicksDuplicates,
			Storage:     o.Storage,
			Replicas:    o.Replicas,
			MaxMsgSize:  16 << 10,
		},
		{
			Name:        events.PreviewJobsStream,
			Description: "Work queue of preview fetches; a job is removed when a worker acks it",
			Subjects:    []string{events.PreviewJobSubject},
			Retention:   jetstream.WorkQueuePolicy,
			// The queue refuses new jobs rather than dropping queued ones; the
			// outbox keeps a refused job and retries it.
			Discard:    jetstream.DiscardNew,
			MaxMsgs:    1_000_000,
			MaxBytes:   -1,
			MaxAge:     PreviewJobsMaxAge,
			Duplicates: DefaultClicksDuplicates,
			Storage:    o.Storage,
			Replicas:   o.Replicas,
			MaxMsgSize: 16 << 10,
		},
		{
			// The server announces a job that ran out of deliveries without
			// a worker's decision once, on core NATS, in the account of
			// PREVIEW_JOBS. This stream, in the same account, keeps each
			// announcement until a preview instance has parked the job
			// (decision 0052): none is lost to an instance that stopped, or
			// to no instance listening.
			Name:        events.PreviewAdvisoriesStream,
			Description: "MAX_DELIVERIES advisories of PREVIEW_JOBS; one is removed when a preview instance has parked its job",
			Subjects:    []string{events.PreviewAdvisorySubjects},
			Retention:   jetstream.WorkQueuePolicy,
			Discard:     jetstream.DiscardOld,
			MaxAge:      PreviewJobsMaxAge,
			MaxMsgs:     PreviewAdvisoriesMaxMsgs,
			MaxBytes:    PreviewAdvisoriesMaxBytes,
			Duplicates:  DefaultClicksDuplicates,
			Storage:     o.Storage,
			Replicas:    o.Replicas,
			MaxMsgSize:  16 << 10,
		},
		{
			Name:        events.DeadLetterStream,
			Description: "Dead letters: dead.<source>.<reason>, with Snip-Dead-* headers",
			Subjects:    []string{events.DeadLetterSubjects},
			Retention:   jetstream.LimitsPolicy,
			Discard:     jetstream.DiscardOld,
			MaxAge:      DeadLetterMaxAge,
			MaxBytes:    -1,
			MaxMsgs:     -1,
			Duplicates:  DefaultClicksDuplicates,
			Storage:     o.Storage,
			Replicas:    o.Replicas,
		},
		// FRAUD comes before FRAUD_VERDICTS: on a deployment where FRAUD
		// still lists the verdict subjects, its update gives them up before
		// FRAUD_VERDICTS takes them (two streams may not overlap).
		{
			Name:        events.FraudStream,
			Description: "Fraud alerts: fraud.alerts.<code>",
			Subjects:    []string{events.FraudAlertSubjects},
			Retention:   jetstream.LimitsPolicy,
			Discard:     jetstream.DiscardOld,
			MaxAge:      FraudMaxAge,
			MaxBytes:    -1,
			MaxMsgs:     -1,
			// Alert IDs are deterministic (rule, key, window); a long window
			// keeps a replayed detector from raising the same alert twice.
			// Alerts are few (at most one per rule, link, key and hour).
			Duplicates: 24 * time.Hour,
			Storage:    o.Storage,
			Replicas:   o.Replicas,
		},
		{
			Name:        events.FraudVerdictsStream,
			Description: "Fraud verdicts, many labels a message: fraud.verdicts.<partition>",
			Subjects:    []string{events.FraudVerdictSubjects},
			Retention:   jetstream.LimitsPolicy,
			Discard:     jetstream.DiscardOld,
			MaxAge:      FraudMaxAge,
			MaxBytes:    o.VerdictsMaxBytes,
			MaxMsgs:     -1,
			Duplicates:  FraudVerdictsDuplicates,
			Storage:     o.Storage,
			Replicas:    o.Replicas,
			// A message is at most events.MaxVerdictBatchBytes.
			MaxMsgSize: 1 << 20,
		},
	}
}

// PreviewConsumerConfig is the shared durable consumer of the preview workers.
// AckWait is overridden per delivery by BackOff; workers that take longer
// than the current backoff step call InProgress.
func PreviewConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       PreviewConsumer,
		Description:   "Competing preview workers; MaxDeliver tries, then DEAD_LETTER",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       PreviewBackOff[0],
		BackOff:       PreviewBackOff,
		MaxDeliver:    PreviewMaxDeliver,
		// Unlimited: a job NAKed with a delay (a retry, up to a 5-minute
		// Retry-After) stays ack-pending while it waits, so a finite limit
		// fills up with waiting retries and then the server delivers
		// nothing else: one rate-limited site would stall every owner's
		// previews. The workers' pull slots (PREVIEW_CONCURRENCY per
		// instance) already bound the jobs in hand; this limit would add no
		// back-pressure, only that stall.
		MaxAckPending: -1,
		FilterSubject: events.PreviewJobSubject,
	}
}

// PreviewRescueConsumerConfig is the durable consumer the preview instances
// share on PREVIEW_ADVISORIES: competing rescuers, as the workers compete
// for jobs. It reads only the advisories of the workers' consumer. An
// advisory is acked once its job is parked and deleted from PREVIEW_JOBS
// (or found gone); a failed rescue is NAKed with the queue's backoff and
// tried again, without limit: MaxDeliver unlimited, since giving up would
// strand the job, and a rescue that can never succeed ends when its job
// leaves PREVIEW_JOBS at MaxAge (then the rescue finds it gone) or the
// advisory does. MaxAckPending unlimited, as on the workers' consumer: the
// advisories waiting out a retry delay must not stop the others.
func PreviewRescueConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       PreviewRescueConsumer,
		Description:   "Preview instances park the jobs these advisories name on DEAD_LETTER",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       PreviewRescueAckWait,
		MaxDeliver:    -1,
		MaxAckPending: -1,
		FilterSubject: events.MaxDeliveriesAdvisorySubject(events.PreviewJobsStream, PreviewConsumer),
	}
}

// MembersBucketConfig is the KV bucket of consumer-group member leases. Each
// member writes its key with a per-key TTL and refreshes it; when a member
// dies its key expires and the server leaves a delete marker that the other
// members' watchers see. Fraud detection also keeps here, with no TTL, where
// each partition's statistics began (<group>.origin.<partition>): a record
// that must outlive Redis.
func MembersBucketConfig(o Options) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:         MembersBucket,
		Description:    "Consumer-group member leases <group>.members.<member>; replay requests <group>.rewind and <group>.rewound.<partition>; fraud detection's <group>.origin.<partition>",
		History:        1,
		Storage:        o.Storage,
		Replicas:       o.Replicas,
		LimitMarkerTTL: time.Minute,
	}
}

// ConsoleSessionsBucketConfig is the console's bucket of ended sessions.
// Every entry expires ConsoleSessionTTL after it was written (the stream's
// MaxAge), when the sessions it ends have expired by themselves.
func ConsoleSessionsBucketConfig(o Options) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      ConsoleSessionsBucket,
		Description: "Console sessions ended before their expiry: revoked.<session ID> (a logout), not_before (every session issued before it, unix ms)",
		History:     1,
		TTL:         ConsoleSessionTTL,
		Storage:     o.Storage,
		Replicas:    o.Replicas,
	}
}

// OutboxUntrimmedBucketConfig is the outbox relay's bucket of batches
// acknowledged but not trimmed: one key per shard and lane, written only
// when a trim fails, every entry expiring OutboxUntrimmedTTL after it was
// written.
func OutboxUntrimmedBucketConfig(o Options) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      OutboxUntrimmedBucket,
		Description: "The redirect outbox relay's batches acknowledged by JetStream but not trimmed from Redis: <shard>.<lane>",
		History:     1,
		TTL:         OutboxUntrimmedTTL,
		Storage:     o.Storage,
		Replicas:    o.Replicas,
	}
}

// Buckets returns the configuration of every KV bucket, in the order Apply
// creates them: the members bucket, the console's sessions and the outbox's
// untrimmed batches.
func Buckets(o Options) []jetstream.KeyValueConfig {
	return []jetstream.KeyValueConfig{MembersBucketConfig(o), ConsoleSessionsBucketConfig(o), OutboxUntrimmedBucketConfig(o)}
}

// Apply creates or updates every stream, the preview consumers (the
// workers' and the rescuers'), the members bucket, the console's
// sessions bucket and the outbox relay's bucket of untrimmed batches. It is safe to call
// from many processes at once and at every start.
func Apply(ctx context.Context, js jetstream.JetStream, o Options) error {
	if err := o.validate(); err != nil {
		return fmt.Errorf("apply topology: %w", err)
	}
	for _, cfg := range Streams(o) {
		if err := applyStreamAgain(ctx, js, cfg, o); err != nil {
			return fmt.Errorf("apply topology: %w", err)
		}
		o.applied("stream", cfg.Name, "")
	}
	// The preview consumers (the workers' and the rescuers'), then
	// ApplyClickCounter's and ApplyWebhooks'.
	if err := applyConsumers(ctx, js, Consumers(), o); err != nil {
		return err
	}
	for _, r := range retiredConsumers {
		if err := deleteRetired(ctx, js, r.stream, r.durable); err != nil {
			return fmt.Errorf("apply topology: %w", err)
		}
	}
	for _, want := range Buckets(o) {
		if err := applyBucket(ctx, js, want, o.LowerReplicas); err != nil {
			return fmt.Errorf("apply topology: bucket %s: %w", want.Bucket, err)
		}
		o.applied("bucket", want.Bucket, "")
	}
	return nil
}

// Consumer is a durable consumer Apply declares, on its stream (the
// consumer groups' are the readers' own, created as they join).
type Consumer struct {
	Stream string
	Config jetstream.ConsumerConfig
}

// Consumers are the durable consumers Apply declares, in the order it
// applies them.
func Consumers() []Consumer {
	cs := []Consumer{
		{events.PreviewJobsStream, PreviewConsumerConfig()},
		{events.PreviewAdvisoriesStream, PreviewRescueConsumerConfig()},
	}
	cs = append(cs, clickCounterConsumers()...)
	return append(cs, webhooksConsumers()...)
}

// applyBucket creates a bucket (the members bucket, the console's
// sessions, the outbox relay's untrimmed batches), or updates it when it is
// not as wanted (a deployment grown to a cluster asks for more replicas),
// and does nothing when it is, so a service whose NATS user may only read
// stream info passes without admin rights.
func applyBucket(ctx context.Context, js jetstream.JetStream, want jetstream.KeyValueConfig, lower bool) error {
	kv, err := js.KeyValue(ctx, want.Bucket)
	if err == nil {
		st, err := kv.Status(ctx)
		if err != nil {
			return err
		}
		if have := st.Config().Replicas; have > want.Replicas && !lower {
			return fmt.Errorf("%d replicas, want %d: %w", have, want.Replicas, ErrReplicasLowered)
		}
		if bucketUpToDate(st.Config(), want) {
			return nil
		}
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return err
	}
	_, err = js.CreateOrUpdateKeyValue(ctx, want)
	return err
}

// bucketUpToDate compares the fields of a KV bucket that decide how it
// works. The description is left out: a bucket made by an earlier version
// keeps its wording rather than have every service whose user may not
// update it wait for an operator's apply.
func bucketUpToDate(have, want jetstream.KeyValueConfig) bool {
	return have.Replicas == want.Replicas && have.History == want.History &&
		have.LimitMarkerTTL == want.LimitMarkerTTL && have.TTL == want.TTL
}

// errCodeNoPeers is JetStream's error code for "insufficient resources" when
// no peer set can be chosen (JSClusterNoPeersErrF): "no suitable peers for
// placement".
const errCodeNoPeers = 10005

// NoPeersYet reports whether err is JetStream's answer that it cannot place a
// replicated stream or consumer: "no suitable peers for placement". A
// cluster's meta leader places an asset only on peers whose statistics it
// has heard, and for some seconds after the cluster starts (and whenever a
// peer's report goes missing) it can answer so although every node is up.
// Worth retrying; a service's start does (pkg/service, Prepare), and so do
// the demo and the tests that start a cluster.
func NoPeersYet(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeNoPeers
}

// retiredConsumers are durable consumers earlier versions of Snip declared
// and this one does not read: Apply deletes them, since a durable consumer
// nobody reads still costs the server its state (and, on a limits stream,
// its pending count grows for ever in every dashboard).
var retiredConsumers = []struct{ stream, durable string }{
	// The counter read single verdicts from FRAUD until verdicts moved to
	// FRAUD_VERDICTS (in bulk, with a duplicate window that fits their
	// volume); its consumer there now has the same name on FRAUD_VERDICTS.
	{events.FraudStream, ClickCounterVerdictsConsumer},
}

// deleteRetired deletes a retired durable consumer once it has drained:
// nothing left to deliver and nothing delivered unacknowledged. One that
// has not (an instance of the earlier version is still working through it
// during a rolling upgrade) is left for a later Apply, since deleting it
// would drop what it has not yet handed over. Looking first keeps Apply
// working for a service whose NATS user may only read consumer info.
func deleteRetired(ctx context.Context, js jetstream.JetStream, stream, durable string) error {
	c, err := js.Consumer(ctx, stream, durable)
	if err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil
		}
		return fmt.Errorf("retired consumer %s on %s: %w", durable, stream, err)
	}
	if info := c.CachedInfo(); info.NumPending > 0 || info.NumAckPending > 0 {
		return nil
	}
	if err := js.DeleteConsumer(ctx, stream, durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("delete retired consumer %s on %s: %w", durable, stream, err)
	}
	return nil
}

// streamTries is how many times Apply sends a stream's request whose answer
// did not come within the JetStream client's request timeout.
const streamTries = 3

// applyStreamAgain is applyStream, again (up to streamTries in all) when a
// request timed out while ctx is live. On a cluster a replicated stream's
// create waits for a meta-leader proposal and its own Raft group's
// election; on a busy machine (or while the meta group elects a leader,
// when no server answers) that outlasts the client's request timeout
// (jetstream.New's 5 s), although the server goes on and creates the
// stream. The next try looks the stream up first, so it finds the stream
// the unanswered create made, or sends the create to the leader there is
// now.
func applyStreamAgain(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, o Options) error {
	for try := 1; ; try++ {
		err := applyStream(ctx, js, cfg, o)
		if err == nil || try == streamTries || !requestTimedOut(ctx, err) {
			return err
		}
	}
}

// requestTimedOut reports whether err is a JetStream request that went
// unanswered for the client's request timeout while ctx, the caller's, is
// still live: the server may have done what was asked, or may do it yet.
func requestTimedOut(ctx context.Context, err error) bool {
	return ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout))
}

// applyStream creates the stream cfg, or updates it when it differs, except
// that an update that would shrink its retention (ErrRetentionShrinks) or
// lower its replicas (ErrReplicasLowered) is refused unless o says the
// operator means it.
func applyStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, o Options) error {
	s, err := js.Stream(ctx, cfg.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if _, err := js.CreateStream(ctx, cfg); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("create stream %s: %w", cfg.Name, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("look up stream %s: %w", cfg.Name, err)
	}
	have := s.CachedInfo().Config
	if cfg.SubjectTransform != nil && have.SubjectTransform != nil &&
		have.SubjectTransform.Destination != cfg.SubjectTransform.Destination {
		return fmt.Errorf("stream %s: have %q, want %q: %w", cfg.Name,
			have.SubjectTransform.Destination, cfg.SubjectTransform.Destination, ErrPartitionsChanged)
	}
	if what := retentionShrinks(have, cfg); len(what) > 0 && !o.ShrinkRetention {
		return fmt.Errorf("stream %s: %s: %w", cfg.Name, strings.Join(what, ", "), ErrRetentionShrinks)
	}
	if have.Replicas > cfg.Replicas && !o.LowerReplicas {
		return fmt.Errorf("stream %s: %d replicas, want %d: %w", cfg.Name, have.Replicas, cfg.Replicas, ErrReplicasLowered)
	}
	if streamUpToDate(have, cfg) {
		// Nothing to change: a service whose NATS user may only read stream
		// info (deploy/nats) passes here without admin rights.
		return nil
	}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("update stream %s: %w", cfg.Name, err)
	}
	return nil
}

// unlimited maps the two spellings of "no limit" (0 and -1) to one.
func unlimited[T int32 | int64](v T) T {
	if v <= 0 {
		return -1
	}
	return v
}

// retentionShrinks lists the limits of want that would keep less of the
// stream than have does: the server discards what falls outside them as
// soon as the update is made.
func retentionShrinks(have, want jetstream.StreamConfig) []string {
	var what []string
	if want.MaxAge > 0 && (have.MaxAge <= 0 || want.MaxAge < have.MaxAge) {
		what = append(what, fmt.Sprintf("max age %s, want %s", limitString(int64(have.MaxAge), time.Duration(have.MaxAge).String()), want.MaxAge))
	}
	if lowers(have.MaxBytes, want.MaxBytes) {
		what = append(what, fmt.Sprintf("max bytes %s, want %d", limitString(have.MaxBytes, strconv.FormatInt(have.MaxBytes, 10)), want.MaxBytes))
	}
	if lowers(have.MaxMsgs, want.MaxMsgs) {
		what = append(what, fmt.Sprintf("max messages %s, want %d", limitString(have.MaxMsgs, strconv.FormatInt(have.MaxMsgs, 10)), want.MaxMsgs))
	}
	return what
}

// lowers reports whether the limit want is below have, where 0 and -1 are
// no limit.
func lowers(have, want int64) bool {
	have, want = unlimited(have), unlimited(want)
	return want != -1 && (have == -1 || want < have)
}

// limitString is s, or "none" for a limit of 0 or less.
func limitString(v int64, s string) string {
	if v <= 0 {
		return "none"
	}
	return s
}

// streamUpToDate compares the fields Snip sets; the server fills in others.
func streamUpToDate(have, want jetstream.StreamConfig) bool {
	same := slices.Equal(have.Subjects, want.Subjects) &&
		have.Retention == want.Retention && have.Discard == want.Discard &&
		have.MaxAge == want.MaxAge && unlimited(have.MaxBytes) == unlimited(want.MaxBytes) && unlimited(have.MaxMsgs) == unlimited(want.MaxMsgs) &&
		have.Duplicates == want.Duplicates && have.Replicas == want.Replicas &&
		unlimited(have.MaxMsgSize) == unlimited(want.MaxMsgSize) && have.Storage == want.Storage &&
		have.Description == want.Description
	if !same {
		return false
	}
	for k, v := range want.Metadata {
		if have.Metadata[k] != v {
			return false
		}
	}
	return (have.SubjectTransform == nil) == (want.SubjectTransform == nil)
}

// Partitions reads the number of partitions of the existing CLICKS stream, so
// readers and tools follow the stream rather than their own configuration.
func Partitions(ctx context.Context, js jetstream.JetStream) (int, error) {
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return 0, fmt.Errorf("look up stream %s: %w", events.ClicksStream, err)
	}
	v, ok := s.CachedInfo().Config.Metadata["snip.partitions"]
	if !ok {
		return 0, fmt.Errorf("stream %s has no snip.partitions metadata; apply the topology", events.ClicksStream)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("stream %s: bad snip.partitions %q", events.ClicksStream, v)
	}
	return n, nil
}
