package natsconn

import (
	"errors"
	"strings"
	"testing"
)

// hide replaces a URL's password or token in an error's text in every form
// it may take there, escaped or not, and the configured password; an error
// that shows none is returned as it is. redacted shows no password or
// token, nor a path or fragment, where a misplaced one may be.
func TestHideReplacesEverySecretForm(t *testing.T) {
	t.Parallel()
	urls, err := parseURLs("nats://app:pa%2Fss@a:4222, nats://tok3n@b:4222,nats://c:4222,nats://app#hunter2@d:4222")
	if err != nil {
		t.Fatal(err)
	}
	secrets := secretsOf(urls, "cfgpass")
	for _, text := range []string{
		"auth failed for pa/ss",
		"auth failed for pa%2Fss",
		"token tok3n refused",
		"user password cfgpass refused",
		"password cfgpassword refused", // holds the configured password
	} {
		got := hide(errors.New(text), secrets).Error()
		for _, s := range []string{"pa/ss", "pa%2Fss", "tok3n", "cfgpass"} {
			if strings.Contains(got, s) {
				t.Errorf("hide(%q) = %q, shows %q", text, got, s)
			}
		}
	}
	plain := errors.New("nats: no servers available for connection")
	if got := hide(plain, secrets); got != plain {
		t.Errorf("hide changed an error without secrets: %v", got)
	}
	if got, want := redacted(urls), "nats://app:xxxxx@a:4222,nats://xxxxx@b:4222,nats://c:4222,nats://app/..."; got != want {
		t.Errorf("redacted = %q, want %q", got, want)
	}
}
