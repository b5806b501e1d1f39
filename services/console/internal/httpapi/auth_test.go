package httpapi

import (
	"strings"
	"testing"
	"time"
)

// A wrong token takes as long to refuse whether or not its length is the
// token's: the time of a guess does not tell the token's length. Compared
// byte by byte, a guess of another length was refused at once, and one of
// the token's length only after a pass over it.
//
// The token is long so that the difference, if there is one, stands far
// above the noise; each guess is timed as the fastest of many rounds,
// which a busy machine only slows.
func TestAWrongTokensTimeDoesNotTellTheTokensLength(t *testing.T) {
	t.Parallel()
	token := strings.Repeat("0123456789abcdef", 256) // 4 KiB
	a := newAuth(AuthConfig{Token: token}, nil, nil)
	if !a.tokenMatches(token) {
		t.Fatal("the token itself does not match")
	}
	guesses := map[string]string{
		"one byte short":     token[:len(token)-1],
		"the token's length": token[:len(token)-1] + "x",
		"one byte longer":    token + "x",
	}
	fastest := map[string]time.Duration{}
	const rounds, calls = 100, 50
	for range rounds {
		for name, g := range guesses { // interleaved: a slow moment hits every guess
			began := time.Now()
			for range calls {
				if a.tokenMatches(g) {
					t.Fatalf("the guess %s matches", name)
				}
			}
			if d := time.Since(began); fastest[name] == 0 || d < fastest[name] {
				fastest[name] = d
			}
		}
	}
	t.Logf("fastest of %d rounds of %d wrong guesses: %v", rounds, calls, fastest)
	same := fastest["the token's length"]
	for _, other := range []string{"one byte short", "one byte longer"} {
		if ratio := float64(same) / float64(fastest[other]); ratio > 3 || ratio < 1.0/3 {
			t.Errorf("a wrong guess of the token's length took %v, a guess %s %v (%.1f times): the time tells the length",
				same, other, fastest[other], ratio)
		}
	}
}
