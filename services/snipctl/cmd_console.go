package main

import (
	"context"
	"fmt"
	"time"

	"github.com/snipdev/snip/pkg/consolesessions"
)

const consoleUsage = "console revoke-sessions"

// cmdConsole ends every console session, on every console instance, as the
// console's POST /api/sessions/revoke does: it raises not_before in the
// console's sessions bucket to now (never lowers it), with the console's
// own code (pkg/consolesessions). It talks to NATS, as snipctl's other
// commands do, not to a console: an operator who fears a session cookie
// was copied needs neither a console within reach nor its token.
func cmdConsole(ctx context.Context, env *Env, args []string) error {
	if len(args) != 1 || args[0] != "revoke-sessions" {
		return fmt.Errorf("%s: %w", consoleUsage, errUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, env.Cfg.Timeout)
	defer cancel()
	js, closeJS, err := connectJetStream(env)
	if err != nil {
		return err
	}
	defer closeJS()
	nb, err := consolesessions.New(js).RevokeAll(ctx, time.Now())
	if err != nil {
		return fmt.Errorf("console revoke-sessions: %w", err)
	}
	fmt.Fprintf(env.Stdout, "every console session issued before %s is ended, on every console instance (not_before %d); logging in again works\n",
		nb.UTC().Format(time.RFC3339Nano), nb.UnixMilli())
	return nil
}
