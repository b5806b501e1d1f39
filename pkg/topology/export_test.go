package topology

// StreamUpToDate exposes streamUpToDate to the tests.
var StreamUpToDate = streamUpToDate

// ConsumerUpToDate exposes consumerUpToDate to the tests.
var ConsumerUpToDate = consumerUpToDate

// RefusedInPlace exposes refusedInPlace to the tests.
var RefusedInPlace = refusedInPlace
