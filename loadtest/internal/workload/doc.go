// Package workload is the load test's traffic model: which link each click
// goes to, who clicks (a browser, a known bot, or one identity bursting), with
// what user agent, referrer and country. It knows the truth the oracle checks
// readers against, so it is deterministic: Visit(seq) is a pure function of
// the Spec and the click's sequence number, whatever the timing or the
// concurrency of the driver that sends it. A saved Spec is enough to recompute
// every click of a run.
//
// The model:
//
//   - Links: Spec.Links regular links plus one probe link. Popularity is Zipf
//     with exponent ZipfS; with ViralShare > 0 link 0 takes that share of the
//     traffic and the rest is Zipf over the others.
//   - Humans: a pool of Spec.Visitors visitors, each with a fixed address and
//     browser, drawn uniformly, so no visitor clicks one link often enough to
//     look like a burst (see DefaultVisitors).
//   - Bots: a BotShare of clicks carry a well-known bot or tool user agent
//     that the redirect labels at the source (Click.Bot).
//   - Bursts: a BurstShare of clicks come in bursts of BurstSize consecutive
//     clicks from one identity (one address, one browser user agent) on one
//     link: what fraud detection's per-visitor rule must catch.
//   - Probes: every ProbeEvery-th click goes to the probe link, which gets
//     nothing else; the time until a probe is visible in a reader is the
//     click-to-counted latency.
package workload
