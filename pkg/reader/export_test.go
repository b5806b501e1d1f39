package reader

// SetDropForTest makes members lose the deliveries drop returns true for,
// as if the client had given up on a fetch while they were on their way.
func SetDropForTest(drop func(group string, streamSeq uint64) bool) { dropForTest = drop }
