// Package oracle checks every reader of a load test run against the truth:
// nothing missing, nothing extra, nothing twice.
//
// The checks are layered. The log comes first: every click the generator was
// told was recorded (a 302, a publish ack) must be in CLICKS exactly once,
// on the right link, and no click it was told was refused may be there;
// clicks without an answer (timeouts) may be there once. What the log holds
// is then the truth for the readers, because the readers' contract is the
// log:
//
//   - fraud detection: every click of an injected burst is labelled a bot by
//     a verdict on FRAUD_VERDICTS, and no verdict names a click the log does
//     not hold, or another link than its click's; every burst is alerted on
//     FRAUD (a visitor_burst alert naming its visitor), no alert twice;
//   - the click counter: per link, human + bot = the link's clicks in the
//     log, and bot = the clicks whose final label is bot (the last verdict
//     about the click, else the label the redirect gave it); the same by
//     country and by referrer host, with the dimensions each click was sent
//     with, and by the hour and the UTC day of each click's own time (its
//     hourly and daily series, asked for from the hour and day before the
//     run on, as far as the stats API answers: 48 hours, 30 days; clicks
//     older than that are not checked, and the rows count them); per link
//     and day, its unique visitors (a HyperLogLog estimate) within 2 + 5
//     standard errors (0.81% each) of the distinct visitors of the clicks
//     the redirect did not label bots; no count below zero;
//   - the warehouse: per link, the distinct event IDs in `clicks` are the
//     link's clicks in the log (the exact set when it is small enough, the
//     counts otherwise), and the bot flags match (event by event with the
//     exact set).
//   - the webhooks service, through a receiver of the run's own registered
//     as an endpoint of the run's owner: every click on a link its filter
//     wants delivered at least once (by event id; a delivery again is
//     counted, not failed: at-least-once is the contract), none other,
//     every request signed, each link's clicks in CLICKS' order, and the
//     endpoint's queue empty for the run to be caught up.
//
// A sink that is not deployed or not configured is reported as skipped, not
// failed, unless it is required; one that is configured is checked strictly.
// Sinks are read through the small interfaces in sources.go, so each check
// is tested against plain values and each adapter against a real server.
package oracle
