package fraud

import (
	"encoding/hex"
	"hash/fnv"
	"strconv"
	"time"
)

// AlertID is the deterministic ID of an alert: the rule, the link, a digest
// of the key, and the start of the alert period (unix seconds), e.g.
// "visitor_burst:abc123:9f86d081884c7d65:1764504000". Whoever judges the
// same clicks computes the same ID, so the FRAUD stream's duplicate window
// (Nats-Msg-Id) drops a replayed or redelivered alert, and Redis writes keyed
// by it are idempotent. At most 18+1+64+1+16+1+11 = 112 characters.
func AlertID(rule, code, key string, period time.Time) string {
	return rule + ":" + code + ":" + keyDigest(key) + ":" + strconv.FormatInt(period.Unix(), 10)
}

// keyDigest shortens a rule key (a visitor hash, a CIDR, an agent name) to 16
// hex characters that fit a message ID; "-" for the empty key of link rules.
func keyDigest(key string) string {
	if key == "" {
		return "-"
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil))
}

// stateKey is the 16-byte map key of a (link, something) state: an FNV-128a
// digest, deterministic and compact, so a million tracked identities do not
// keep a million pairs of strings alive.
type stateKey [16]byte

func keyOf(a, b string) stateKey {
	h := fnv.New128a()
	_, _ = h.Write([]byte(a))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(b))
	var k stateKey
	h.Sum(k[:0])
	return k
}
