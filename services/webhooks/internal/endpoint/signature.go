package endpoint

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Standard Webhooks headers.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// Sign returns the webhook-signature header value for a delivery: one
// "v1,<base64 HMAC-SHA256 of id.timestamp.body>" per secret, separated by
// spaces, so a receiver holding either secret of a rotation verifies it.
func Sign(secrets []string, id string, ts time.Time, body []byte) (string, error) {
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
		if err != nil {
			return "", fmt.Errorf("secret: %w", err)
		}
		m := hmac.New(sha256.New, key)
		m.Write([]byte(id))
		m.Write([]byte{'.'})
		m.Write([]byte(strconv.FormatInt(ts.Unix(), 10)))
		m.Write([]byte{'.'})
		m.Write(body)
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(m.Sum(nil)))
	}
	return strings.Join(sigs, " "), nil
}
