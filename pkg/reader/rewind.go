package reader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/topology"
)

// rewindRequest is what Rewind stores in the members bucket under
// "<group>.rewind". Each partition's owner carries it out and records
// "<group>.rewound.<p>" = ID.
type rewindRequest struct {
	ID        string            `json:"id"`
	Requested time.Time         `json:"requested"`
	From      map[string]uint64 `json:"from"`
	Until     map[string]uint64 `json:"until"`
	// Consumers is when each partition's consumer the request was made for
	// was created (a partition without a consumer then has none). The
	// request is for those consumers only: the group's consumers deleted
	// and created again (a group re-created by a later deploy) are another
	// group, which a request left pending by the old one must not move
	// back. A request without it (stored by an older version) is for
	// whatever consumers there are.
	Consumers map[string]time.Time `json:"consumers,omitempty"`
	// AtStart marks the partitions whose From was moved up to where the
	// group's consumer starts (lowestRewind): the replay asked for events
	// before the group's first, which the server will not move it back to.
	AtStart map[string]bool `json:"at_start,omitempty"`
	// rev is the request's revision in the bucket, as read (not stored):
	// a request stored later has a higher one.
	rev uint64
}

func (r rewindRequest) info(p int) RewindInfo {
	k := strconv.Itoa(p)
	return RewindInfo{ID: r.ID, From: r.From[k], Until: r.Until[k], Requested: r.Requested}
}

// madeFor reports whether the request was made for partition p's consumer
// created at created: the consumer it recorded, or none recorded.
func (r rewindRequest) madeFor(p int, created time.Time) bool {
	c, ok := r.Consumers[strconv.Itoa(p)]
	return !ok || c.Equal(created)
}

func rewindKey(group string) string         { return group + ".rewind" }
func rewoundKey(group string, p int) string { return group + ".rewound." + strconv.Itoa(p) }
func memberKey(group, member string) string { return group + ".members." + member }
func memberPrefix(group string) string      { return group + ".members." }
func groupWatchPattern(group string) string { return group + ".>" }
func memberSubject(group, member string) string {
	return "$KV." + topology.MembersBucket + "." + memberKey(group, member)
}

// Rewind asks a group to replay CLICKS from pos. It records the request and
// returns its ID at once; each partition's owner then stops, acks what it
// handled, decides whether the partition moves back, calls Config.OnRewind
// with that decision, moves its consumer back if so, records that it did
// (what WaitRewind waits for) and goes on from there. A partition with no
// live owner is rewound by whoever takes it next. Rewinding never moves a
// partition forward: where pos is past what the group has handled, that
// partition is left alone. The request is for the group's consumers as they
// are now: if they are deleted and the group is created again before a
// partition carried it out, the new group ignores it (the request is void:
// RewindStatus.Void, ErrRewindVoid).
//
// A replay goes back no further than where the group started: the server
// moves a consumer created at a sequence or a time no further back than
// it (nor one at the oldest event before sequence 1), so a partition's
// From before that is moved up to it (RewindStatus's
// PartitionRewind.AtGroupStart). A group whose consumers were created at
// new events (StartAtNew, the webhooks group) or at the last ones the
// server moves back only to their ack floor: Rewind stores nothing and
// returns ErrNotReplayable.
func Rewind(ctx context.Context, js jetstream.JetStream, group string, pos Position) (string, error) {
	return rewind(ctx, js, group, pos, nil)
}

// RewindAfter is Rewind, storing the request only if the group's latest
// request is still the one CheckReplay read (rev, ReplayWarnings.Revision:
// 0 when there was none): a create, or an update at that revision, of the
// request's key. Otherwise another replay was requested between the check
// and this request, and CheckReplay did not say this one replaces it:
// RewindAfter stores nothing and returns ErrReplayRequestedMeanwhile,
// naming that replay. Asked again, the check says it replaces it. Two
// operators asking at once (the console and snipctl, two runs) so never
// both miss that warning: the second one is told.
func RewindAfter(ctx context.Context, js jetstream.JetStream, group string, pos Position, rev uint64) (string, error) {
	return rewind(ctx, js, group, pos, &rev)
}

// rewind is Rewind, and RewindAfter when after is not nil.
func rewind(ctx context.Context, js jetstream.JetStream, group string, pos Position, after *uint64) (string, error) {
	n, err := topology.Partitions(ctx, js)
	if err != nil {
		return "", fmt.Errorf("rewind %s: %w", group, err)
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return "", fmt.Errorf("rewind %s: %w", group, err)
	}
	if err := groupExists(ctx, s, group); err != nil {
		return "", fmt.Errorf("rewind %s: %w", group, err)
	}
	req := rewindRequest{ID: events.NewID(), Requested: time.Now().UTC(), From: map[string]uint64{}, Until: map[string]uint64{},
		Consumers: map[string]time.Time{}, AtStart: map[string]bool{}}
	for p := range n {
		k := strconv.Itoa(p)
		lowest := uint64(1)
		switch c, err := s.Consumer(ctx, topology.GroupConsumerName(group, p)); {
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			// Not created yet: whoever creates it carries the request out
			// (and goes by its own start, planRewind).
		case err != nil:
			return "", fmt.Errorf("rewind %s: consumer of partition %d: %w", group, p, err)
		default:
			ci := c.CachedInfo()
			req.Consumers[k] = ci.Created
			var seqs bool
			if lowest, seqs, err = lowestRewind(ctx, js, p, ci.Config); err != nil {
				return "", fmt.Errorf("rewind %s: where partition %d started: %w", group, p, err)
			}
			if !seqs {
				return "", fmt.Errorf("rewind %s: %w", group, notReplayable(group, ci.Config.DeliverPolicy))
			}
		}
		filter := events.PartitionFilter(p)
		var until, from uint64
		last, err := s.GetLastMsgForSubject(ctx, filter)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return "", fmt.Errorf("rewind %s: last event of partition %d: %w", group, p, err)
		default:
			until = last.Sequence
		}
		// A partition whose last event was stored before the time has
		// nothing after it: answered here, not by waiting for a fetch
		// that finds nothing.
		if until > 0 && (pos.time.IsZero() || !last.Time.Before(pos.time)) {
			if from, err = firstAt(ctx, js, s, filter, pos); err != nil {
				return "", fmt.Errorf("rewind %s: start of partition %d: %w", group, p, err)
			}
		}
		if from != 0 && from < lowest {
			// Before the group's first event: the replay starts there.
			from, req.AtStart[k] = lowest, true
		}
		if from == 0 || from > until {
			from = until + 1 // nothing to replay in this partition
		}
		req.From[k], req.Until[k] = from, until
	}
	kv, err := js.KeyValue(ctx, topology.MembersBucket)
	if err != nil {
		return "", fmt.Errorf("rewind %s: %w", group, err)
	}
	b, _ := json.Marshal(req)
	switch {
	case after == nil:
		_, err = kv.Put(ctx, rewindKey(group), b)
	case *after == 0:
		_, err = kv.Create(ctx, rewindKey(group), b)
	default:
		_, err = kv.Update(ctx, rewindKey(group), b, *after)
	}
	if after != nil && (errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)) {
		return "", requestedMeanwhile(ctx, kv, group)
	}
	if err != nil {
		return "", fmt.Errorf("rewind %s: record request: %w", group, err)
	}
	return req.ID, nil
}

// requestedMeanwhile is ErrReplayRequestedMeanwhile for group, naming the
// replay stored since the check, as far as it can be read.
func requestedMeanwhile(ctx context.Context, kv jetstream.KeyValue, group string) error {
	which := "another replay"
	if other, err := readRewind(ctx, kv, group); err == nil && other.ID != "" {
		which = fmt.Sprintf("replay %s (requested %s)", other.ID, other.Requested.UTC().Format(time.RFC3339))
	}
	return fmt.Errorf("rewind %s: %w: %s was stored after this one's checks, so this one was not requested; asked again, it replaces that one and says so",
		group, ErrReplayRequestedMeanwhile, which)
}

// lowestRewind returns the lowest stream sequence the server moves
// partition p's consumer (of config cfg) back to, as its reset to a
// sequence allows (resetStartingSeq): 1 for one created at the oldest
// event, its start sequence for one created at a sequence, and for one
// created at a time the partition's first event stored at or after it (the
// server's bound is the stream's first at that time, which is at or
// before it; the event after the partition's last if none is). seqs is
// false for a consumer the server moves back only to its ack floor (one
// created at new events, or at the last ones: resetsToSeq).
func lowestRewind(ctx context.Context, js jetstream.JetStream, p int, cfg jetstream.ConsumerConfig) (lowest uint64, seqs bool, err error) {
	switch cfg.DeliverPolicy {
	case jetstream.DeliverAllPolicy:
		return 1, true, nil
	case jetstream.DeliverByStartSequencePolicy:
		return max(cfg.OptStartSeq, 1), true, nil
	case jetstream.DeliverByStartTimePolicy:
	default:
		return 0, false, nil
	}
	if cfg.OptStartTime == nil {
		return 1, true, nil
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return 0, false, err
	}
	filter := events.PartitionFilter(p)
	last, err := s.GetLastMsgForSubject(ctx, filter)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 1, true, nil // nothing stored: nothing to replay either
	case err != nil:
		return 0, false, err
	case last.Time.Before(*cfg.OptStartTime):
		return last.Sequence + 1, true, nil
	}
	first, err := firstAt(ctx, js, s, filter, FromTime(*cfg.OptStartTime))
	if err != nil {
		return 0, false, err
	}
	if first == 0 {
		return last.Sequence + 1, true, nil
	}
	return first, true, nil
}

// notReplayable is ErrNotReplayable for group, whose consumers were
// created with deliver policy p, saying what the webhooks group offers
// instead.
func notReplayable(group string, p jetstream.DeliverPolicy) error {
	what := "reads only events published after it was created"
	if p != jetstream.DeliverNewPolicy {
		what = "started at the last event when it was created"
	}
	err := fmt.Errorf("group %s %s (deliver policy %s): %w", group, what, p, ErrNotReplayable)
	if group == topology.GroupWebhooks {
		err = fmt.Errorf("%w; to send an endpoint again the events it missed, replay that endpoint instead: "+
			`POST /api/webhooks/endpoints/<id>/replay {"from": "<RFC 3339>"} on the webhooks service`, err)
	}
	return err
}

// groupExists returns ErrNoGroup when group has no consumers on CLICKS
// (s): its partition 0 consumer is not there.
func groupExists(ctx context.Context, s jetstream.Stream, group string) error {
	_, err := s.Consumer(ctx, topology.GroupConsumerName(group, 0))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return ErrNoGroup
	}
	return err
}

// firstAt finds the sequence of the first event in a partition at or after
// pos; 0 if there is none. For a time, the caller has seen an event stored
// at or after it (the partition's last), so the fetch does not wait long.
func firstAt(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, filter string, pos Position) (uint64, error) {
	if pos.time.IsZero() {
		m, err := s.GetMsg(ctx, max(pos.seq, 1), jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		return m.Sequence, nil
	}
	t := pos.time
	// Each call creates a consumer on CLICKS: deleted when done, so
	// repeated rewinds and replays leave none behind.
	c, done, err := OneOffRead(ctx, js, events.ClicksStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &t,
	})
	if err != nil {
		return 0, err
	}
	defer done()
	b, err := c.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		return 0, err
	}
	for m := range b.Messages() {
		md, err := m.Metadata()
		if err != nil {
			return 0, err
		}
		return md.Sequence.Stream, nil
	}
	if err := b.Error(); err != nil {
		return 0, err
	}
	return 0, nil
}

// WaitRewind blocks until every partition of the group has carried out the
// rewind with the given ID (its owner recorded it), or ctx ends. Its error
// then says how many partitions the last status it read counted done, or,
// if no read ever succeeded, why the status could not be read. A rewind
// that a partition will never carry out, its consumer deleted (and maybe
// created again) since the request was made (RewindStatus.Void), ends the
// wait at once with ErrRewindVoid, naming those partitions. So does one
// that another request of the group replaced (the partitions carry out the
// group's latest only): ErrRewindSuperseded, naming the latest. A request
// the wait never reads stored (a wrong ID) ends it after a few seconds
// with ErrRewindUnknown, or ErrRewindSuperseded if the group's latest was
// requested after the ID was made. "A few" is unseenRewindGrace, ten
// seconds.
func WaitRewind(ctx context.Context, js jetstream.JetStream, group, id string) error {
	kv, err := js.KeyValue(ctx, topology.MembersBucket)
	if err != nil {
		return fmt.Errorf("wait for rewind %s: %w", id, err)
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	started := time.Now()
	var last *RewindStatus // the last status read in full
	// ours is the request as read stored, once it has been: a read that
	// shows another one may come from a server that lags, behind ours or
	// not yet at it; only a request stored after ours replaces it.
	var ours *rewindRequest
	for {
		// A failed read is retried: the partitions' records do not go away.
		// The read under way when ctx ends fails too, so the error reports
		// the last one that succeeded.
		var st RewindStatus
		req, err := readRewind(ctx, kv, group)
		if err == nil {
			if req.ID == id {
				ours = &req
			}
			// Until ours is read, only the partitions' records tell.
			q := rewindRequest{ID: id}
			if ours != nil {
				q = *ours
			}
			st, err = rewindStatus(ctx, js, kv, group, q)
		}
		if err == nil {
			if st.Done() {
				return nil
			}
			switch {
			case req.ID == id:
			case ours != nil && req.ID != "" && req.rev > ours.rev:
				return fmt.Errorf("wait for rewind %s: the group's latest replay is %s, requested %s: %w",
					id, req.ID, req.Requested.Format(time.RFC3339), ErrRewindSuperseded)
			case ours == nil && time.Since(started) > unseenRewindGrace:
				// Never read stored, long past any server's lag: replaced
				// before the first read, or never requested.
				if made, perr := events.IDTime(id); perr == nil && req.ID != "" && req.Requested.After(made) {
					return fmt.Errorf("wait for rewind %s: never read stored; the group's latest replay is %s, requested %s: %w",
						id, req.ID, req.Requested.Format(time.RFC3339), ErrRewindSuperseded)
				}
				return fmt.Errorf("wait for rewind %s: %w", id, ErrRewindUnknown)
			}
			if st.Void() {
				var void []int
				for _, p := range st.Partitions {
					if p.Void && !p.Done {
						void = append(void, p.Partition)
					}
				}
				return fmt.Errorf("wait for rewind %s: partitions %v will never carry it out: %w", id, void, ErrRewindVoid)
			}
			last = &st
		}
		select {
		case <-ctx.Done():
			if last == nil {
				return fmt.Errorf("wait for rewind %s: status never read (%v): %w", id, err, ctx.Err())
			}
			done := 0
			for _, p := range last.Partitions {
				if p.Done {
					done++
				}
			}
			return fmt.Errorf("wait for rewind %s: %d of %d partitions done: %w", id, done, len(last.Partitions), ctx.Err())
		case <-t.C:
		}
	}
}

// unseenRewindGrace is how long WaitRewind reads another request than the
// one it waits for, never that one, before it decides that one is not the
// group's (replaced, or never requested) rather than not yet on the server
// it reads from.
//
// It is no setting (not a Config field: Config is a member's, and the
// callers of WaitRewind, snipctl and the console, run none). What it
// covers is a read that lags behind a write the caller has seen answered:
// a replica of the members bucket (whose reads any replica answers)
// behind its leader, which catches up in well under a second on a
// healthy cluster. Ten seconds is long past that, and costs only a
// caller that waits for an ID that was never requested (a typo), which
// is told so after ten seconds rather than at once. A request the wait
// did read stored is never subject to it: one replaced after that is
// told at once (ErrRewindSuperseded).
const unseenRewindGrace = 10 * time.Second

// loadRewound reads which rewind this partition last carried out, so a new
// owner neither repeats an old rewind nor misses a pending one. It reads
// it at every takeover, whether or not this member has seen a request: its
// watch of the group may deliver one after the takeover (a member that
// lags behind the previous owner, which carried it out and recorded it),
// and this partition would then replay it a second time. One read of the
// bucket a takeover costs nothing beside the takeover's own.
func (w *worker) loadRewound() error {
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	e, err := w.m.kv.Get(ctx, rewoundKey(w.m.cfg.Group, w.p))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		w.rewoundID = ""
	case err != nil:
		return err
	default:
		w.rewoundID = string(e.Value())
	}
	return nil
}

// pendingRewind returns the group's latest rewind request if this partition
// may have it to carry out: not recorded done, nor found made for another
// consumer than the partition's (planRewind asks the server which consumer
// that is; w.cons's cached info may be of one deleted since, or older than
// one created again under this owner).
func (w *worker) pendingRewind() *rewindRequest {
	req := w.m.rewind.Load()
	if req == nil || req.ID == w.rewoundID || req.ID == w.staleRewindID {
		return nil
	}
	return req
}

// maybeRewind carries out the group's latest rewind request if this
// partition has not yet: the decision whether the partition moves back,
// OnRewind, told it, then the consumer moves back (or not, as decided),
// then the record that it did. Each step is retried until it succeeds or
// the partition is taken away. A request made for a consumer the server no
// longer has (the group's consumers deleted and created again while it was
// pending) is not the new group's: it is ignored, said once, and left
// unrecorded; OnRewind is not told. The decision is of the consumer it was
// made on: where that one is deleted and created again before the
// consumer moves (while OnRewind runs), it is made again, on the new one,
// and OnRewind told again. One deleted and not created again (by an
// operator, a topology reset) is created again by this owner, as the
// group's config says (createdAgainIfDeleted), and goes the same way.
func (w *worker) maybeRewind() error {
	m := w.m
	req := w.pendingRewind()
	if req == nil {
		return nil
	}
	bo := m.cfg.newBackoff()
	for {
		ri := req.info(w.p)
		var plan rewindPlan
		if !w.retryRewind(bo, "read the partition's ack floor for the rewind", func() (err error) {
			plan, err = w.planRewind(req)
			return w.createdAgainIfDeleted(err)
		}) {
			return errReleased
		}
		// rewind moves the consumer as planned, unless it is no longer the
		// one planned on (changed: decide again).
		changed := false
		rewind := func() error {
			err := w.rewindTo(ri, plan)
			if errors.Is(err, errConsumerChanged) {
				changed = true
				return nil
			}
			return w.createdAgainIfDeleted(err)
		}
		if plan.stale {
			w.staleRewindID = req.ID
			w.log.Warn("ignoring a rewind requested for the partition's consumer of before it was created again",
				"rewind", req.ID, "requested", req.Requested, "consumer_created", plan.created)
			// The fetcher was stopped for it and dropped what it had fetched
			// ahead: the consumer goes back, as for a rewind with nothing to
			// replay.
			if !w.retryRewind(bo, "rewind partition", rewind) {
				return errReleased
			}
			if changed {
				continue
			}
			w.idle = true
			return nil
		}
		ri.MovesBack = plan.movesBack
		if plan.movesBack {
			ri.From = plan.from
		}
		if m.cfg.OnRewind != nil && !w.retryRewind(bo, "on rewind", func() error { return m.cfg.OnRewind(w.ctx, w.p, ri) }) {
			return errReleased
		}
		if w.stopping() || w.lapsed() {
			// The partition moved while OnRewind ran (a rebuild can take
			// longer than the pin outlives the last pull), or this member's
			// lease may have lapsed meanwhile (the control loop gives the
			// partition up at its next tick, up to a second later): its next
			// owner may be reading it already, and has the rewind to do,
			// unrecorded. Moving the consumer back now would replay under
			// that owner.
			return errReleased
		}
		if !w.retryRewind(bo, "rewind partition", rewind) {
			return errReleased
		}
		if changed {
			w.log.Warn("the partition's consumer was created again while the rewind was carried out: deciding it again on the new one",
				"rewind", req.ID, "consumer_created", plan.created)
			continue
		}
		// The record is what WaitRewind waits for, and what tells this
		// partition's next owner that the rewind is done: left unwritten, the
		// wait never ends and the next owner replays the partition again.
		if !w.retryRewind(bo, "record rewind done", func() error { return w.recordRewound(req.ID) }) {
			return errReleased
		}
		w.rewoundID = req.ID
		w.idle = true
		return nil
	}
}

// createdAgainIfDeleted creates the partition's consumer again where err
// says it is gone (an operator, a topology reset deleted it while the
// rewind was carried out): no try of the step would find it, and nothing
// else creates it while the fetcher is stopped for the rewind. The next
// try goes by the new consumer (createAgain), which the request was not
// made for: it is ignored (stale), and the new consumer hands every event
// from its own start, rather than moving to the request's From, a
// position of the one deleted, which would skip the events before it.
// err is returned, with why creating the consumer failed if it did, so
// the step is tried again.
func (w *worker) createdAgainIfDeleted(err error) error {
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		if cerr := w.createAgain(); cerr != nil {
			err = fmt.Errorf("%w; creating it again: %w", err, cerr)
		}
	}
	return err
}

// retryRewind runs one step of a rewind until it succeeds, logging each
// failure as what and waiting bo's next backoff before the next try; false
// when the partition was taken away meanwhile, or the member's lease may
// have lapsed (lapsed: another member may hold the partition, and no step
// of this one's, a move back or the record that it was done, is for it to
// take).
func (w *worker) retryRewind(bo *backoff.ExponentialBackOff, what string, step func() error) bool {
	for {
		if w.lapsed() {
			return false
		}
		err := step()
		if err == nil {
			return true
		}
		w.log.Warn(what, "err", err)
		if !w.sleep(bo.NextBackOff()) {
			return false
		}
	}
}

// recordRewound records "<group>.rewound.<p>" = id: the partition carried
// the rewind out.
func (w *worker) recordRewound(id string) error {
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	if _, err := w.m.kv.Put(ctx, rewoundKey(w.m.cfg.Group, w.p), []byte(id)); err != nil {
		return fmt.Errorf("record rewind %s done: %w", id, err)
	}
	return nil
}

// rewindPlan is what a partition does about a rewind, decided once,
// before OnRewind is told: the reader's state and the consumer go by the
// same decision.
type rewindPlan struct {
	// movesBack: the consumer moves back to From (RewindInfo.MovesBack).
	movesBack bool
	// floor is the consumer's ack floor, and handled the last event this
	// owner handled (the floor or later: an ack lost on its way leaves the
	// floor behind what was handled; the floor where what it handled was
	// of a consumer deleted since), when the decision was made.
	floor, handled uint64
	// toSeq: the server moves the consumer to a sequence of our choosing
	// (resetsToSeq), not only back to its ack floor.
	toSeq bool
	// from is where the consumer moves back to: the request's From, or
	// where the consumer started if From is before it (lowestRewind).
	from uint64
	// stale: the request was made for another consumer than the server's,
	// created at created; it does not move back (movesBack false).
	stale   bool
	created time.Time
}

// planRewind decides whether the partition moves back for req (ri, its
// part for this partition): not at all where req was made for another
// consumer than the one the server has now (stale), or else where
// ri.From is at or before the event after the last one the
// partition handled, by its ack floor or, past it, by what this owner
// handled and acked (an ack lost on its way is healed only by the next
// batch's). That is also where the reader's state is: deciding by the ack
// floor alone, after a lost ack, the runtime went on from the floor while
// the reader started again at From. What this owner handled counts only
// where it is of the consumer on the server (w.handledOf): one deleted and
// created again under the owner has only its own ack floor, and taking the
// last event handled for its position would skip (or replay from past)
// the events the group created again has from its start.
func (w *worker) planRewind(req *rewindRequest) (rewindPlan, error) {
	ri := req.info(w.p)
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	info, err := w.cons.Info(ctx)
	if err != nil {
		return rewindPlan{}, err
	}
	lowest, seqs, err := lowestRewind(ctx, w.m.js, w.p, info.Config)
	if err != nil {
		return rewindPlan{}, err
	}
	pl := rewindPlan{floor: info.AckFloor.Stream, handled: info.AckFloor.Stream, toSeq: seqs, from: ri.From, created: info.Created}
	if w.handledOf.Equal(info.Created) {
		// What this owner handled is of this consumer (not of one deleted
		// since, the partition's consumer created again under it).
		pl.handled = max(pl.handled, w.handled)
	}
	pl.stale = !req.madeFor(w.p, info.Created)
	pl.movesBack = !pl.stale && ri.From != 0 && ri.From <= ri.Until && ri.From <= pl.handled+1
	switch {
	case !pl.movesBack:
	case !seqs:
		// Rewind refuses such a group; this request was stored by an
		// older version, or for consumers created again since at new
		// events. The server would refuse the move for ever.
		w.log.Warn("rewind: the server moves this partition's consumer back only to its ack floor (created at new events): nothing to replay",
			"rewind", ri.ID, "from", ri.From, "deliver_policy", info.Config.DeliverPolicy.String())
		pl.movesBack = false
	case ri.From < lowest:
		// Before where the consumer started, which the server refuses:
		// the replay starts there, if the partition holds anything from it.
		w.log.Warn("rewind: from is before the partition's consumer started; replaying from its start",
			"rewind", ri.ID, "from", ri.From, "start", lowest, "deliver_policy", info.Config.DeliverPolicy.String())
		pl.from = lowest
		pl.movesBack = lowest <= ri.Until && lowest <= pl.handled+1
	}
	return pl, nil
}

func (w *worker) rewindTo(ri RewindInfo, pl rewindPlan) error {
	// The plan is of the consumer it was made on (OnRewind ran since):
	// positions of one deleted since say nothing of one created again.
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	_, err := w.consumerOf(ctx, pl.created)
	cancel()
	if err != nil {
		return err
	}
	if !pl.movesBack {
		if !pl.stale {
			w.log.Info("rewind: nothing to replay in this partition", "rewind", ri.ID, "from", ri.From, "until", ri.Until,
				"ack_floor", pl.floor, "handled", pl.handled)
		}
		if pl.handled > pl.floor && pl.toSeq {
			// The ack of what this owner handled last was lost on its way:
			// go on after what it handled, as the reader does (it kept its
			// state), acking it. Back at the floor, those events came
			// again as first deliveries (a reset forgets deliveries),
			// behind the reader's position.
			return w.resetTo(pl.handled + 1)
		}
		if pl.handled > pl.floor {
			// The same for a consumer created at new events, which the
			// server moves only back to its floor (it refuses a sequence,
			// which would be retried for ever): the owner acks again what
			// it handled last, moving the floor up to it, and goes on from
			// the floor, right after it. Where that ack fails, the events
			// past the floor come again, as at-least-once delivery allows.
			if err := w.ackHandled(); err != nil {
				w.log.Warn("rewind: the ack of the last batch handled was lost, acking it again failed, and the server moves this partition's consumer back only to its ack floor: events handled past it come again",
					"rewind", ri.ID, "err", err, "ack_floor", pl.floor, "handled", pl.handled)
			} else {
				w.log.Info("rewind: the ack of the last batch handled was lost: acked it again, going on after it from the ack floor",
					"rewind", ri.ID, "ack_floor", pl.floor, "handled", pl.handled)
				return w.resetTo(0)
			}
		}
		// The fetcher was stopped for the rewind and dropped what it had
		// fetched ahead, unacked: back to the ack floor, so that comes again
		// now rather than after the AckWait (or as a delivery gap). The
		// floor does not move, nor does where the reader was told it
		// resumes, which confirmResume still checks at the first batch,
		// nor the last event handled, where it is of the consumer reset
		// (one created again has only its floor: process moves handled
		// only forward, which a position of the one before would hold back).
		resume, handled, of := w.resume, w.handled, w.handledOf
		if err := w.resetTo(0); err != nil {
			return err
		}
		w.resume = resume
		if of.Equal(w.handledOf) {
			w.handled = handled
		}
		return nil
	}
	if err := w.resetTo(ri.From); err != nil {
		return err
	}
	w.log.Info("partition rewound", "rewind", ri.ID, "from", ri.From, "until", ri.Until)
	return nil
}
