package counter

// Limits of the catch-up, for tests.
const (
	GapChunk      = gapChunk
	MaxGapPerCall = maxGapPerCall
)
