package redisstore

import (
	"strconv"
	"strings"

	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// Every key of one CLICKS partition carries the hash tag {p<N>}, so the keys
// a batch script touches are in one Redis Cluster slot. The README lists
// each key with its size bound.

func partPrefix(p int) string { return "cc:{p" + strconv.Itoa(p) + "}:" }

// metaKey: hash {read, write, until, replay, starter}, the partition's
// generations, the last replay that started one and the token of the call
// that started it (startScript).
func metaKey(p int) string { return partPrefix(p) + "meta" }

func genPrefix(p int, g int64) string {
	return partPrefix(p) + "g" + strconv.FormatInt(g, 10) + ":"
}

// posKey: hash {seq, stored, events, tok, first, lost_from, lost_until}, a
// generation's watermark and the token of the write that moved it there,
// the first sequence it counts from (set by a recount's start, or by the
// generation's first write), and the last stretch of events the store lost
// that the counter asked for again (MarkLost).
func posKey(p int, g int64) string { return genPrefix(p, g) + "pos" }

// linkKey: hash {"<h|b>|<country>|<referrer host>": count}, a link's
// all-time counts by label, country and referrer (at most MaxCombosPerLink
// fields, plus one "(other)" referrer per label and country).
func linkKey(p int, g int64, r counter.LinkRef) string { return genKeys(genPrefix(p, g)).link(r) }

// dayKey: hash {hHH, bHH}, a link's hours on one day (the day's total is
// their sum).
func dayKey(p int, g int64, r counter.LinkRef, d counter.Day) string {
	return genKeys(genPrefix(p, g)).day(r, d.Key())
}

// uvKey: HyperLogLog of the day's visitors.
func uvKey(p int, g int64, r counter.LinkRef, d counter.Day) string {
	return genKeys(genPrefix(p, g)).uv(r, d.Key())
}

// genKeys is one generation's key prefix (genPrefix), for building many of
// its keys with one allocation each: a batch names hundreds.
type genKeys string

func (k genKeys) link(r counter.LinkRef) string { return string(k) + "l:" + r.Owner + ":" + r.Code }

// day and uv take the day as Day.Key formats it.
func (k genKeys) day(r counter.LinkRef, day string) string {
	return string(k) + "d:" + r.Owner + ":" + r.Code + ":" + day
}

func (k genKeys) uv(r counter.LinkRef, day string) string {
	return string(k) + "u:" + r.Owner + ":" + r.Code + ":" + day
}

// linkDay returns a link's day key and, if uv, its visitors' key, and, if
// link, the link's key (else ""), as day, uv and link make them, cut from
// one string: the keys of a batch's link and day cost one allocation, not
// three.
func (k genKeys) linkDay(r counter.LinkRef, day string, link, uv bool) (lk, dk, uk string) {
	// "<k>d:<owner>:<code>:<day>", then "<k>u:..." and "<k>l:<owner>:<code>".
	ref := len(k) + 2 + len(r.Owner) + 1 + len(r.Code)
	n := ref + 1 + len(day)
	var b strings.Builder
	b.Grow(3 * n)
	part := func(kind string, withDay bool) {
		b.WriteString(string(k))
		b.WriteString(kind)
		b.WriteString(r.Owner)
		b.WriteByte(':')
		b.WriteString(r.Code)
		if withDay {
			b.WriteByte(':')
			b.WriteString(day)
		}
	}
	part("d:", true)
	if uv {
		part("u:", true)
	}
	if link {
		part("l:", false)
	}
	all := b.String()
	dk, rest := all[:n], all[n:]
	if uv {
		uk, rest = rest[:n], rest[n:]
	}
	if link {
		lk = rest[:ref]
	}
	return lk, dk, uk
}

// idKey: string of 8-byte fingerprints, the recent-ID record of one
// IDBucketWidth of event-ID time.
func idKey(p int, g int64, bucket int64) string {
	return genPrefix(p, g) + "id:" + strconv.FormatInt(bucket, 10)
}

// idIndexKey: sorted set of a generation's recent-ID keys (members), each
// scored by the stored time (unix ms) of the last batch that appended to
// it: the batch script deletes the keys the partition's position has left
// a dedup window behind (see applyScript). Its own TTL is the window's.
func idIndexKey(p int, g int64) string { return genPrefix(p, g) + "idx" }

// labelKey: hash {<click id>: "<h|b>:<fraud seq>"}, the verdict labels of
// the clicks whose ID time falls on day d. Not per generation: a recount
// reads the same labels.
func labelKey(p int, d counter.Day) string { return partPrefix(p) + "v:" + d.Key() }

// deletedKey: sorted set of the partition's deleted links ("l:<owner>:<code>",
// a link hash's name in a generation) scored by when their counts expire
// (unix): ForgetLinks adds them, the janitor gives a recount's generation's
// hashes of them their expiry (ExpireDeletedLinks). Members past their
// score are trimmed; the key expires with its last.
func deletedKey(p int) string { return partPrefix(p) + "deleted" }

// registryKey: hash {owner, state, seq, ts}, what LINKS said last about a code.
func registryKey(code string) string { return "cc:link:" + code }

// genPattern matches every key of every generation of a partition.
func genPattern(p int) string { return partPrefix(p) + "g*" }
