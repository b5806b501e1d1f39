package jsread

import (
	"context"
	"errors"
)

// ConsumerNode returns the server that holds c's consumer.
func ConsumerNode(ctx context.Context, c *Clicks) (string, error) {
	if c.s.cons == nil {
		return "", errors.New("not reading yet")
	}
	ci, err := c.s.cons.Info(ctx)
	if err != nil {
		return "", err
	}
	if ci.Cluster == nil {
		return "", errors.New("not on a cluster")
	}
	return ci.Cluster.Leader, nil
}
