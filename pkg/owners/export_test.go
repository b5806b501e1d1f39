package owners

// StoreKey is storeKey, for the test of its guard against a writer that
// comes between Ensure's check and its write.
var StoreKey = (*Store).storeKey

// BeforeRevoke makes Revoke call f before each pass over the owner's keys,
// for the tests of a rotation that comes between its read and its deletes.
func BeforeRevoke(s *Store, f func()) { s.beforeRevoke = f }

// AfterClaim makes RotateFrom call f once it has revoked the caller's key,
// before it revokes the owner's other keys.
func AfterClaim(s *Store, f func()) { s.afterClaim = f }
