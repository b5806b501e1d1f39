// Package schema is the warehouse's ClickHouse schema: the clicks fact table,
// the hourly per-link rollup and the materialized view between them, as SQL
// files embedded in the binary and applied idempotently at start.
//
// The SQL files in sql/ are canonical; deploy/clickhouse/ holds a copy for
// operators and other tools (clickhouse-client, the console), and a test
// fails when the two differ (go test ./internal/schema -update rewrites the
// copy). Every statement is portable between Debian's ClickHouse 18.16 and a
// current server, and each file holds one statement, so the files can also be
// applied by hand:
//
//	for f in deploy/clickhouse/*.sql; do clickhouse-client -d snip --multiquery < "$f"; done
package schema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

//go:embed sql/*.sql
var files embed.FS

// Statement is one DDL statement of the schema.
type Statement struct {
	// Name is the file it came from, e.g. "001_clicks.sql"; files apply in
	// name order.
	Name string
	// SQL is the file's text, comments included.
	SQL string
}

// Statements returns the schema's statements in apply order.
func Statements() []Statement {
	names, err := fs.Glob(files, "sql/*.sql")
	if err != nil {
		panic(fmt.Sprintf("schema: glob embedded files: %v", err)) // a constant pattern
	}
	sort.Strings(names)
	out := make([]Statement, 0, len(names))
	for _, n := range names {
		b, err := files.ReadFile(n)
		if err != nil {
			panic(fmt.Sprintf("schema: read embedded %s: %v", n, err)) // embedded at build time
		}
		out = append(out, Statement{Name: strings.TrimPrefix(n, "sql/"), SQL: string(b)})
	}
	return out
}

// RollupView is the materialized view that feeds clicks_hourly from every
// insert into clicks (sql/003_clicks_hourly_mv.sql). It is the one object
// whose absence fails no insert: clicks takes the rows without it, and the
// rollup never sees them.
const RollupView = "clicks_hourly_mv"

// Objects are the tables and the view the statements create, in apply
// order: what must exist for an insert to land and reach the rollup.
var Objects = []string{"clicks", "clicks_hourly", RollupView}

// Conn is what Apply needs from a ClickHouse connection (clickhouse-go's
// driver.Conn has it).
type Conn interface {
	Exec(ctx context.Context, query string, args ...any) error
}

// Apply runs every statement on conn, whose default database is where the
// tables go. Each statement is CREATE ... IF NOT EXISTS, so Apply is safe at
// every start and from many loaders at once; it never alters or drops
// anything that exists.
func Apply(ctx context.Context, conn Conn) error {
	for _, s := range Statements() {
		if err := conn.Exec(ctx, s.SQL); err != nil {
			return fmt.Errorf("apply schema %s: %w", s.Name, err)
		}
	}
	return nil
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// ValidDatabase reports whether name can be used as a database name without
// quoting: letters, digits and '_', not starting with a digit.
func ValidDatabase(name string) bool { return identifier.MatchString(name) }

// EnsureDatabase creates database name unless it exists. admin must be a
// connection without a default database (or with one that exists): a
// connection whose default database is missing fails every query (code 81).
// It looks before it creates, so a user without the right to create
// databases can still start against one an operator made.
func EnsureDatabase(ctx context.Context, admin driver.Conn, name string) error {
	if !ValidDatabase(name) {
		return fmt.Errorf("ensure database %q: %w", name, ErrBadDatabaseName)
	}
	var n uint64
	if err := admin.QueryRow(ctx, "SELECT count() FROM system.databases WHERE name = ?", name).Scan(&n); err != nil {
		return fmt.Errorf("ensure database %s: look up: %w", name, err)
	}
	if n > 0 {
		return nil
	}
	if err := admin.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+name); err != nil {
		return fmt.Errorf("ensure database %s: create: %w", name, err)
	}
	return nil
}
