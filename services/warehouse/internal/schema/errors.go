package schema

import "errors"

// ErrBadDatabaseName means a database name is not a plain identifier.
var ErrBadDatabaseName = errors.New("database name must be letters, digits and '_', not starting with a digit")
