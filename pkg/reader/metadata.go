// Metadata: a delivery's sequences, count and time, read from its reply
// subject into the batch's slice, as jetstream.Msg.Metadata reads them into
// a new value per message.

package reader

import (
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ackPrefix starts the reply subject of every JetStream delivery.
const ackPrefix = "$JS.ACK."

// readMetadata fills md with msg's metadata, the same fields msg.Metadata
// returns: the ack subject
//
//	$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>
//
// (9 tokens), or, from servers that add a domain and an account hash and
// possibly a last token (at least 11),
//
//	$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>[.<token>]
//
// is read in place, without allocating (a profile of the reader runtime put
// msg.Metadata, one parse and one allocation per event, at a tenth of a
// no-op reader's CPU). A subject of any other shape, or none, goes to
// msg.Metadata, whose error it returns.
func readMetadata(msg jetstream.Msg, md *jetstream.MsgMetadata) error {
	if tokens, n, ok := ackTokens(msg.Reply()); ok {
		t, domain := tokens[:], "" // v1: the stream at 2
		if n > 9 {
			t, domain = tokens[2:], tokens[2] // v2: the domain and hash first
			if domain == "_" {
				domain = ""
			}
		}
		*md = jetstream.MsgMetadata{
			Domain:       domain,
			Stream:       t[2],
			Consumer:     t[3],
			NumDelivered: parseNum(t[4]),
			Timestamp:    time.Unix(0, int64(parseNum(t[7]))),
			NumPending:   parseNum(t[8]),
		}
		md.Sequence.Stream, md.Sequence.Consumer = parseNum(t[5]), parseNum(t[6])
		return nil
	}
	got, err := msg.Metadata()
	if err != nil {
		return err
	}
	*md = *got
	return nil
}

// ackTokens splits an ack subject into its first 11 tokens ("$JS", "ACK",
// then the fields) and counts all of them; ok is false for a subject that is
// not one (no "$JS.ACK." prefix, or 10 or fewer than 9 tokens).
func ackTokens(s string) (tokens [11]string, n int, ok bool) {
	if !strings.HasPrefix(s, ackPrefix) {
		return tokens, 0, false
	}
	for {
		i := strings.IndexByte(s, '.')
		if n < len(tokens) {
			if i < 0 {
				tokens[n] = s
			} else {
				tokens[n] = s[:i]
			}
		}
		n++
		if i < 0 {
			break
		}
		s = s[i+1:]
	}
	return tokens, n, n == 9 || n >= 11
}

// parseNum reads a token of decimal digits, as the client does: anything
// else (an empty token, a sign, any other byte) reads as 0, and overflow
// is not detected.
func parseNum(d string) (n uint64) {
	for i := 0; i < len(d); i++ {
		c := d[i]
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + uint64(c-'0')
	}
	return n
}
