package topology_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

func TestApplyIsIdempotentAndKeepsData(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatalf("first apply: %v", err)
	}
	if _, err := js.Publish(ctx, events.ClickSubject("acme", "abc"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	o.ClicksMaxAge = 10 * 24 * time.Hour // a mutable change that discards nothing
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatalf("second apply: %v", err)
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().State.Msgs; got != 1 {
		t.Fatalf("CLICKS has %d messages after re-apply, want 1", got)
	}
	if got := s.CachedInfo().Config.MaxAge; got != o.ClicksMaxAge {
		t.Fatalf("CLICKS MaxAge = %s after re-apply, want %s", got, o.ClicksMaxAge)
	}
	for _, cfg := range topology.Streams(o) {
		if _, err := js.Stream(ctx, cfg.Name); err != nil {
			t.Errorf("stream %s: %v", cfg.Name, err)
		}
	}
	n, err := topology.Partitions(ctx, js)
	if err != nil || n != o.Partitions {
		t.Fatalf("Partitions() = %d, %v; want %d", n, err, o.Partitions)
	}
	// The outbox relay's bucket of untrimmed batches: one value per key,
	// each expiring after OutboxUntrimmedTTL.
	kv, err := js.KeyValue(ctx, topology.OutboxUntrimmedBucket)
	if err != nil {
		t.Fatalf("bucket %s: %v", topology.OutboxUntrimmedBucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != topology.OutboxUntrimmedTTL || st.History() != 1 {
		t.Fatalf("bucket %s: TTL %s, history %d; want %s, 1", topology.OutboxUntrimmedBucket, st.TTL(), st.History(), topology.OutboxUntrimmedTTL)
	}
}

func TestApplyRefusesPartitionChange(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	o := topology.Defaults()
	if err := topology.Apply(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	o.Partitions = 12
	if err := topology.Apply(t.Context(), js, o); !errors.Is(err, topology.ErrPartitionsChanged) {
		t.Fatalf("apply with other partition count: err = %v, want ErrPartitionsChanged", err)
	}
}

// The server's partition() mapping and events.Partition must agree, or tools
// would look for a link's clicks in the wrong partition.
func TestPartitionMatchesServer(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Partitions = 6
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		if _, err := js.Publish(ctx, events.ClickSubject("acme", fmt.Sprintf("code%d", i)), nil); err != nil {
			t.Fatal(err)
		}
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]int{}
	for seq := uint64(1); seq <= n; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		code := fmt.Sprintf("code%d", seq-1)
		want := events.PartitionedClickSubject(o.Partitions, "acme", code)
		if m.Subject != want {
			t.Fatalf("stored subject %q, events.PartitionedClickSubject says %q", m.Subject, want)
		}
		seen[events.PartitionOf(m.Subject)]++
	}
	if len(seen) != o.Partitions {
		t.Fatalf("300 codes landed in %d partitions, want all %d: %v", len(seen), o.Partitions, seen)
	}
}

func TestPreviewConsumerRetryPolicy(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	if err := topology.Apply(t.Context(), js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	c, err := js.Consumer(t.Context(), events.PreviewJobsStream, topology.PreviewConsumer)
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.CachedInfo().Config
	got, _ := json.Marshal(struct {
		MaxDeliver int
		BackOff    []time.Duration
		Ack        jetstream.AckPolicy
	}{cfg.MaxDeliver, cfg.BackOff, cfg.AckPolicy})
	want, _ := json.Marshal(struct {
		MaxDeliver int
		BackOff    []time.Duration
		Ack        jetstream.AckPolicy
	}{5, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}, jetstream.AckExplicitPolicy})
	if string(got) != string(want) {
		t.Fatalf("preview consumer = %s, want %s", got, want)
	}
}

// The MAX_DELIVERIES advisories of the workers' consumer are kept on
// PREVIEW_ADVISORIES, a bounded work queue, for one shared rescuers'
// consumer that retries without a limit.
func TestPreviewAdvisoriesAreKeptForTheRescuers(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, events.PreviewAdvisoriesStream)
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	if sc.Retention != jetstream.WorkQueuePolicy || sc.MaxAge != topology.PreviewJobsMaxAge || sc.MaxMsgs <= 0 || sc.MaxBytes <= 0 ||
		len(sc.Subjects) != 1 || sc.Subjects[0] != events.PreviewAdvisorySubjects {
		t.Fatalf("%s = %+v; want a work queue on %s kept as long as a job, with a count and a byte cap", events.PreviewAdvisoriesStream, sc, events.PreviewAdvisorySubjects)
	}
	c, err := js.Consumer(ctx, events.PreviewAdvisoriesStream, topology.PreviewRescueConsumer)
	if err != nil {
		t.Fatal(err)
	}
	cc := c.CachedInfo().Config
	if want := events.MaxDeliveriesAdvisorySubject(events.PreviewJobsStream, topology.PreviewConsumer); cc.FilterSubject != want ||
		cc.AckPolicy != jetstream.AckExplicitPolicy || cc.MaxDeliver != -1 || cc.MaxAckPending != -1 {
		t.Fatalf("rescuers' consumer = %+v; want explicit acks, unlimited deliveries and ack pending, filtered to %s", cc, want)
	}
	// An advisory published in the account lands there for the rescuers.
	if _, err := js.Conn().Request(events.MaxDeliveriesAdvisorySubject(events.PreviewJobsStream, topology.PreviewConsumer), []byte(`{"stream_seq":1}`), 5*time.Second); err != nil {
		t.Fatalf("advisory not stored: %v", err)
	}
	if !topology.ConsumerUpToDate(cc, topology.PreviewRescueConsumerConfig()) {
		t.Fatal("the rescuers' consumer is reported out of date right after Apply: Apply would update it every time")
	}
}

// A second Apply with nothing to change must not update any stream: services
// whose NATS user may only read stream info rely on it. A second connection
// sees every JetStream API request the second Apply makes: lookups only, no
// create, update or delete of a stream, consumer or bucket.
func TestApplyTwiceUpdatesNothing(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	ctx := t.Context()
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	sniffer := ns.Connect(t)
	requests := make(chan *nats.Msg, 1000)
	if _, err := sniffer.ChanSubscribe("$JS.API.>", requests); err != nil {
		t.Fatal(err)
	}
	if err := sniffer.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatalf("second apply: %v", err)
	}
	// Apply's requests were answered, so the server has routed them; the
	// flush's answer comes after them on the sniffer's connection.
	if err := sniffer.Flush(); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for len(requests) > 0 {
		m := <-requests
		seen++
		for _, verb := range []string{".CREATE.", ".UPDATE.", ".DELETE.", ".PURGE."} {
			if strings.Contains(m.Subject, verb) {
				t.Errorf("the second Apply sent %s", m.Subject)
			}
		}
	}
	if seen == 0 {
		t.Fatal("saw no JetStream API request of the second Apply")
	}
	for _, cfg := range topology.Streams(topology.Defaults()) {
		s, err := js.Stream(ctx, cfg.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !topology.StreamUpToDate(s.CachedInfo().Config, cfg) {
			t.Errorf("stream %s is reported out of date right after Apply: Apply would update it every time", cfg.Name)
		}
	}
}

// A deployment made before verdicts had a stream of their own has FRAUD
// listing the verdict subjects, the counter's verdict consumer on FRAUD and
// verdicts stored there. Apply gives the subjects up on FRAUD first, then
// creates FRAUD_VERDICTS on them; FRAUD keeps what it stored.
func TestApplyMovesVerdictsOffAnExistingFraudStream(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: events.FraudStream, Subjects: []string{events.FraudAlertSubjects, "fraud.verdicts.*.*"},
		Duplicates: 24 * time.Hour, MaxAge: topology.FraudMaxAge, Storage: o.Storage,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, events.FraudStream, jetstream.ConsumerConfig{
		Durable: topology.ClickCounterVerdictsConsumer, FilterSubject: "fraud.verdicts.*.*", AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{events.FraudAlertSubject("abc"), events.FraudVerdictSubject("acme", "abc")} {
		if _, err := js.Publish(ctx, subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}

	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatalf("apply over the old FRAUD: %v", err)
	}
	fraud, err := js.Stream(ctx, events.FraudStream)
	if err != nil {
		t.Fatal(err)
	}
	if got := fraud.CachedInfo().Config.Subjects; len(got) != 1 || got[0] != events.FraudAlertSubjects {
		t.Errorf("FRAUD subjects %q, want only %q", got, events.FraudAlertSubjects)
	}
	if got := fraud.CachedInfo().State.Msgs; got != 2 {
		t.Errorf("FRAUD holds %d messages after the move, want the 2 it had", got)
	}
	verdicts, err := js.Stream(ctx, events.FraudVerdictsStream)
	if err != nil {
		t.Fatalf("FRAUD_VERDICTS after the move: %v", err)
	}
	cfg := verdicts.CachedInfo().Config
	if len(cfg.Subjects) != 1 || cfg.Subjects[0] != events.FraudVerdictSubjects || cfg.Duplicates != topology.FraudVerdictsDuplicates {
		t.Errorf("FRAUD_VERDICTS subjects %q, duplicates %s", cfg.Subjects, cfg.Duplicates)
	}
	if _, err := js.Consumer(ctx, events.FraudVerdictsStream, topology.ClickCounterVerdictsConsumer); err != nil {
		t.Errorf("the counter's consumer on FRAUD_VERDICTS: %v", err)
	}
	// The counter's retired consumer on FRAUD still has a verdict to hand
	// over (an earlier counter may still be reading it): it stays until it
	// has drained, and the next Apply deletes it.
	old, err := js.Consumer(ctx, events.FraudStream, topology.ClickCounterVerdictsConsumer)
	if err != nil {
		t.Fatalf("the retired consumer on FRAUD was deleted with a verdict still pending: %v", err)
	}
	batch, err := old.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatalf("apply after the retired consumer drained: %v", err)
	}
	if _, err := js.Consumer(ctx, events.FraudStream, topology.ClickCounterVerdictsConsumer); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("the counter's retired consumer on FRAUD, drained: %v, want it deleted", err)
	}
	// Verdicts, bulk or single, now land in FRAUD_VERDICTS; alerts in FRAUD.
	for _, subj := range []string{events.FraudVerdictBatchSubject(2), events.FraudVerdictSubject("acme", "abc"), events.FraudAlertSubject("abd")} {
		ack, err := js.Publish(ctx, subj, []byte(`{}`))
		if err != nil {
			t.Fatalf("publish %s: %v", subj, err)
		}
		want := events.FraudVerdictsStream
		if subj == events.FraudAlertSubject("abd") {
			want = events.FraudStream
		}
		if ack.Stream != want {
			t.Errorf("%s stored in %s, want %s", subj, ack.Stream, want)
		}
	}
	// And a second Apply has nothing to change.
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatalf("apply again: %v", err)
	}
}

// A preview consumer created with an older configuration (MaxAckPending
// 1000, which waiting retries fill up) is updated by Apply, and a second
// Apply finds it up to date.
func TestApplyUpdatesAnExistingPreviewConsumer(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	old := topology.PreviewConsumerConfig()
	old.MaxAckPending = 1000
	if _, err := js.UpdateConsumer(ctx, events.PreviewJobsStream, old); err != nil {
		t.Fatal(err)
	}
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	c, err := js.Consumer(ctx, events.PreviewJobsStream, topology.PreviewConsumer)
	if err != nil {
		t.Fatal(err)
	}
	want := topology.PreviewConsumerConfig().MaxAckPending
	if got := c.CachedInfo().Config.MaxAckPending; got != want {
		t.Fatalf("MaxAckPending = %d after Apply, want %d", got, want)
	}
	if !topology.ConsumerUpToDate(c.CachedInfo().Config, topology.PreviewConsumerConfig()) {
		t.Fatal("the preview consumer is reported out of date right after Apply: Apply would update it every time")
	}
}

// An Apply whose options keep less than the existing stream does (a shorter
// age, a smaller byte cap: a service started with the default
// SNIP_CLICKS_MAX_AGE where the operator applied a longer one) is refused,
// naming what it would shrink: the server would discard at once what falls
// outside. The stream keeps its events and limits. With ShrinkRetention
// (`snipctl topology apply --shrink-retention`) the operator means it, and
// Apply shrinks it.
func TestApplyRefusesToShrinkRetentionUnlessAsked(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	long := topology.Defaults()
	long.ClicksMaxAge = 30 * 24 * time.Hour
	if err := topology.Apply(ctx, js, long); err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := range n {
		if _, err := js.Publish(ctx, events.ClickSubject("acme", fmt.Sprintf("c%d", i)), []byte(`{"padding":"0123456789012345678901234567890123456789"}`)); err != nil {
			t.Fatal(err)
		}
	}
	clicks := func() jetstream.StreamConfig {
		t.Helper()
		s, err := js.Stream(ctx, events.ClicksStream)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().State.Msgs; got != n {
			t.Fatalf("CLICKS holds %d events, want the %d published", got, n)
		}
		return s.CachedInfo().Config
	}

	for _, tc := range []struct {
		name string
		o    func(o *topology.Options)
		what string
	}{
		{"byte cap", func(o *topology.Options) { o.ClicksMaxBytes = 256 }, "max bytes"},
		{"shorter age", func(o *topology.Options) { o.ClicksMaxAge = topology.DefaultClicksMaxAge }, "max age"},
	} {
		o := long
		tc.o(&o)
		err := topology.Apply(ctx, js, o)
		if !errors.Is(err, topology.ErrRetentionShrinks) || !strings.Contains(err.Error(), tc.what) {
			t.Errorf("%s: apply = %v, want ErrRetentionShrinks naming %q", tc.name, err, tc.what)
		}
		if cfg := clicks(); cfg.MaxAge != long.ClicksMaxAge || cfg.MaxBytes != -1 {
			t.Fatalf("%s: CLICKS max age %s, max bytes %d after the refused apply, want %s and -1", tc.name, cfg.MaxAge, cfg.MaxBytes, long.ClicksMaxAge)
		}
	}

	shorter := long
	shorter.ClicksMaxAge = topology.DefaultClicksMaxAge
	shorter.ShrinkRetention = true
	if err := topology.Apply(ctx, js, shorter); err != nil {
		t.Fatalf("apply with ShrinkRetention: %v", err)
	}
	if got := clicks().MaxAge; got != topology.DefaultClicksMaxAge {
		t.Fatalf("CLICKS max age %s after the apply that means it, want %s", got, topology.DefaultClicksMaxAge)
	}
	// Now the stream keeps what the services ask for: their applies pass.
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatalf("apply of the defaults after the shrink: %v", err)
	}
}

// TestTheReplicaChecksCoverEverythingApplyDeclares: on a fresh server,
// Apply makes exactly the streams the cluster tests' replica checks name
// (replicated: Streams and Buckets) and the consumers they check
// (Consumers), and reports each as applied: a stream, bucket or consumer
// added to Apply but not to those lists fails here, where it would
// otherwise go unchecked for its replicas.
func TestTheReplicaChecksCoverEverythingApplyDeclares(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	var applied []string
	o.Applied = func(kind, name, stream string) { applied = append(applied, kind+" "+name+" "+stream) }
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}

	var onServer []string
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		onServer = append(onServer, name)
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sorted(replicated(o)), sorted(onServer)); diff != "" {
		t.Errorf("streams the replica checks name (-) and streams on the server after Apply (+):\n%s", diff)
	}

	var declared, consumersOnServer []string
	for _, c := range topology.Consumers() {
		declared = append(declared, c.Stream+" "+c.Config.Durable)
	}
	for _, stream := range onServer {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		cs := s.ConsumerNames(ctx)
		for name := range cs.Name() {
			consumersOnServer = append(consumersOnServer, stream+" "+name)
		}
		if err := cs.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(sorted(declared), sorted(consumersOnServer)); diff != "" {
		t.Errorf("consumers the replica checks name (-) and consumers on the server after Apply (+):\n%s", diff)
	}

	var want []string
	for _, cfg := range topology.Streams(o) {
		want = append(want, "stream "+cfg.Name+" ")
	}
	for _, c := range topology.Consumers() {
		want = append(want, "consumer "+c.Config.Durable+" "+c.Stream)
	}
	for _, b := range topology.Buckets(o) {
		want = append(want, "bucket "+b.Bucket+" ")
	}
	if diff := cmp.Diff(sorted(want), sorted(applied)); diff != "" {
		t.Errorf("declared (-) and reported applied by Apply (+):\n%s", diff)
	}
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }
