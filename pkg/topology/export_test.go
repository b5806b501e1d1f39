package topology

// StreamUpToDate exposes streamUpToDate to the tests.
var StreamUpToDate = streamUpToDate
