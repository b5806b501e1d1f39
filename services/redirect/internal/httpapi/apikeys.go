package httpapi

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/services/redirect/internal/linkstore"
)

// Limiter counts an owner's calls of one action; *owners.Limit is one
// (shared by every instance through Redis).
type Limiter interface {
	Allow(ctx context.Context, owner string, now time.Time) (bool, time.Duration, error)
}

// KeyRotator gives an owner a new API key and revokes its others, while
// the key the caller authenticated with is still the owner's
// (owners.ErrUnauthorized otherwise). A key returned with an error is the
// caller's only key: its own is revoked, some others may not be.
// *owners.Store is one.
type KeyRotator interface {
	RotateFrom(ctx context.Context, id, key string) (string, error)
}

// limitCreate refuses an owner's link creation over its limit: 429 with
// Retry-After, the seconds until its window ends.
func (a *API) limitCreate(c echo.Context, o owners.Owner) error {
	if a.CreateLimit == nil {
		return nil
	}
	ok, wait, err := a.CreateLimit.Allow(c.Request().Context(), o.ID, time.Now())
	if err != nil {
		return fmt.Errorf("%w: %w", linkstore.ErrUnavailable, err)
	}
	if ok {
		return nil
	}
	secs := max(1, int(math.Ceil(wait.Seconds())))
	c.Response().Header().Set("Retry-After", strconv.Itoa(secs))
	return &apiError{status: http.StatusTooManyRequests, code: "rate_limited",
		message: fmt.Sprintf("too many links created with this owner's keys; try again in %d s", secs)}
}

// rotateKey answers POST /api/key/rotate: the caller's owner gets a new API
// key, shown once, and every older key (the one used for this call
// included) stops working at once. A call whose key is revoked after it
// authenticated (by an operator, or by another rotation) gets 401 and no
// key: a request in flight never outlives its key's revocation.
func (a *API) rotateKey(c echo.Context) error {
	o, err := a.owner(c)
	if err != nil {
		return err
	}
	if a.Keys == nil {
		return &apiError{status: http.StatusNotImplemented, code: "not_implemented", message: "key rotation is not configured"}
	}
	used := owners.BearerKey(c.Request().Header.Get(echo.HeaderAuthorization))
	key, err := a.Keys.RotateFrom(c.Request().Context(), o.ID, used)
	if errors.Is(err, owners.ErrUnknownOwner) || errors.Is(err, owners.ErrUnauthorized) {
		return owners.ErrUnauthorized // revoked since it authenticated
	}
	note := "store it now: Snip keeps only its hash; the key used for this call no longer works"
	switch {
	case err != nil && key != "":
		// The caller's key is revoked: the new key is all it has.
		a.Log.Warn("api key rotated; other keys of the owner not revoked", "owner", o.ID, "remote", c.RealIP(), "err", err)
		note += "; other keys of this owner may still work: rotate again with the new key to revoke them"
	case err != nil:
		return fmt.Errorf("%w: %w", linkstore.ErrUnavailable, err)
	default:
		a.Log.Info("api key rotated", "owner", o.ID, "remote", c.RealIP())
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusCreated, map[string]string{"owner": o.ID, "api_key": key, "note": note})
}
