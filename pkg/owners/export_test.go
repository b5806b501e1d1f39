package owners

// StoreKey is storeKey, for the test of its guard against a writer that
// comes between Ensure's check and its write.
var StoreKey = (*Store).storeKey
