// Package fraud is the fraud detector: rules that judge each click of a
// CLICKS partition against in-memory windows, and the Reader that runs them
// on the consumer-group runtime (pkg/reader).
//
// # Rules
//
// Five rules (Rules, Defaults; docs/decisions/0030): visitor_burst (one
// visitor, one link, too many clicks in a sliding window), link_flood (a link
// far above its own EWMA baseline), bot_agent (user agents: Classify),
// unfurler_pair (a preview service's second, browser-agent fetch) and
// listed_network (configured CIDRs). A rule that fires labels the clicks of
// the window it fired in, not only the one that crossed the threshold, and
// raises at most one alert per rule, link, key and alert period.
//
// # State
//
// A Partition is one partition's state. It is fed events in stream order and
// decides from event time only, so the same events give the same decisions
// whoever judges them and however they are batched. Every table is capped
// (least recently active evicted) and expires with event time
// (docs/decisions/0031).
//
// # Running it
//
// Reader's methods are the runtime's Handler and its OnAssign, OnRevoke and
// OnRewind hooks. OnAssign rebuilds a partition taken over from the last
// Memory of the log before judging anything (OnRewind does the same at a
// replay's start, exactly when the runtime says the partition moves back),
// and the label counters of the alert period from the store (Count); Handle
// publishes alerts and verdicts (deterministic IDs: AlertID, VerdictID) and
// writes statistics before the batch is acked, and returns an error on any
// failure so the batch is retried (docs/decisions/0032). It reaches CLICKS,
// FRAUD and Redis through the small interfaces ClickLog, Publisher and Store.
package fraud
