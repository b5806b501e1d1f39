package schema_test

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/warehouse/internal/schema"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithClickHouse())) }

var update = flag.Bool("update", false, "rewrite deploy/clickhouse from the embedded schema")

// deployDir is the operators' copy of the schema.
var deployDir = filepath.Join("..", "..", "..", "..", "deploy", "clickhouse")

func TestDeployCopyMatchesEmbeddedSchema(t *testing.T) {
	t.Parallel()
	if *update {
		if err := os.MkdirAll(deployDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, s := range schema.Statements() {
			if err := os.WriteFile(filepath.Join(deployDir, s.Name), []byte(s.SQL), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := map[string]string{}
	for _, s := range schema.Statements() {
		want[s.Name] = s.SQL
	}
	got := map[string]string{}
	names, err := filepath.Glob(filepath.Join(deployDir, "*.sql"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		got[filepath.Base(n)] = string(b)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("deploy/clickhouse differs from services/warehouse/internal/schema/sql (-embedded +deploy); "+
			"edit the embedded files and run `go test ./internal/schema -run DeployCopy -update`:\n%s", diff)
	}
}

func TestStatementsAreOnePerFileInOrder(t *testing.T) {
	t.Parallel()
	var names []string
	for _, s := range schema.Statements() {
		names = append(names, s.Name)
		// One statement per file keeps `clickhouse-client < file` and Exec
		// equivalent: a second statement would be silently different. A
		// trailing semicolon ends the one statement, so it is allowed.
		switch got := splitStatements(s.SQL); len(got) {
		case 0:
			t.Errorf("%s holds no statement; want one per file", s.Name)
		case 1:
		default:
			t.Errorf("%s holds %d statements; want one per file (a trailing semicolon is fine):\n%s", s.Name, len(got), strings.Join(got, "\n;\n"))
		}
	}
	if !sort.StringsAreSorted(names) || len(names) < 3 {
		t.Errorf("statements %v: want at least 3, sorted", names)
	}
}

// splitStatements splits sql into statements at the semicolons that end
// one, as clickhouse-client --multiquery does: a semicolon inside a quoted
// string or identifier ('…', "…", `…`, with backslash escapes; a doubled
// quote ends the string and opens it again, which splits the same) or
// inside a comment (-- to the end of the line, /* … */) ends
// nothing. It returns each statement without its comments, trimmed, and
// leaves out empty ones: a trailing semicolon, or a file of comments only,
// makes no statement.
func splitStatements(sql string) []string {
	var out []string
	var cur strings.Builder
	end := func() {
		if s := strings.TrimSpace(cur.String()); s != "" {
			out = append(out, s)
		}
		cur.Reset()
	}
	for i := 0; i < len(sql); i++ {
		switch c := sql[i]; {
		case c == '\'' || c == '"' || c == '`':
			j := i + 1
			for ; j < len(sql); j++ {
				if sql[j] == '\\' {
					j++ // the escaped character, whatever it is
				} else if sql[j] == c {
					break // or a doubled quote: it opens the string again
				}
			}
			j = min(j, len(sql)-1) // an unterminated quote runs to the end
			cur.WriteString(sql[i : j+1])
			i = j
		case strings.HasPrefix(sql[i:], "--"):
			n := strings.IndexByte(sql[i:], '\n')
			if n < 0 {
				n = len(sql) - i
			}
			i += n - 1 // the newline itself is kept
		case strings.HasPrefix(sql[i:], "/*"):
			n := strings.Index(sql[i+2:], "*/")
			if n < 0 {
				n = len(sql) - i - 2
			}
			cur.WriteByte(' ') // a comment separates what it sits between
			i += 2 + n + 1
		case c == ';':
			end()
		default:
			cur.WriteByte(c)
		}
	}
	end()
	return out
}

// The statement check counts only the semicolons that end a statement.
func TestSplitStatements(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		sql  string
		want []string
	}{
		{"one_statement", "CREATE TABLE t (a String)", []string{"CREATE TABLE t (a String)"}},
		{"trailing_semicolon_ends_it", "SELECT 1;\n", []string{"SELECT 1"}},
		{"two_statements", "SELECT 1; SELECT 2", []string{"SELECT 1", "SELECT 2"}},
		{"semicolon_in_a_string", "SELECT 'a;b' AS x", []string{"SELECT 'a;b' AS x"}},
		{"escaped_quotes_in_strings", `SELECT 'it\'s;', 'x'';y', 'z\\'; SELECT 2`, []string{`SELECT 'it\'s;', 'x'';y', 'z\\'`, "SELECT 2"}},
		{"semicolon_in_quoted_identifiers", "SELECT 1 AS `a;b`, 2 AS \"c;d\"", []string{"SELECT 1 AS `a;b`, 2 AS \"c;d\""}},
		{"semicolon_in_comments", "-- a; b\nSELECT 1 -- c; d\n/* e; f */ + 2", []string{"SELECT 1 \n  + 2"}},
		{"statement_after_a_string", "SELECT ';'; SELECT 2;", []string{"SELECT ';'", "SELECT 2"}},
		{"comments_only", "-- nothing here;\n/* nor; here */\n", nil},
		{"unterminated_string", "SELECT 'a;", []string{"SELECT 'a;"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tc.want, splitStatements(tc.sql)); diff != "" {
				t.Errorf("splitStatements(%q) (-want +got):\n%s", tc.sql, diff)
			}
		})
	}
}

func TestApplyIsIdempotent(t *testing.T) {
	t.Parallel()
	conn, db := servers.ClickHouse.NewDB(t)
	for range 3 {
		if err := schema.Apply(t.Context(), conn); err != nil {
			t.Fatalf("apply: %v", err)
		}
	}
	rows, err := conn.Query(t.Context(), "SELECT name, engine FROM system.tables WHERE database = ? ORDER BY name", db)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]string{}
	for rows.Next() {
		var name, engine string
		if err := rows.Scan(&name, &engine); err != nil {
			t.Fatal(err)
		}
		got[name] = engine
	}
	want := map[string]string{
		"clicks":           "ReplacingMergeTree",
		"clicks_hourly":    "AggregatingMergeTree",
		"clicks_hourly_mv": "MaterializedView",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tables (-want +got):\n%s", diff)
	}
	objects := slices.Sorted(maps.Keys(want))
	if diff := cmp.Diff(objects, slices.Sorted(slices.Values(schema.Objects))); diff != "" {
		t.Errorf("schema.Objects (-created +listed):\n%s", diff)
	}
}

func TestEnsureDatabase(t *testing.T) {
	t.Parallel()
	admin, _ := servers.ClickHouse.NewDB(t) // any connection with a database that exists
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "ensure_" + hex.EncodeToString(b[:])
	t.Cleanup(func() { _ = admin.Exec(t.Context(), "DROP DATABASE IF EXISTS "+name) })
	for range 2 {
		if err := schema.EnsureDatabase(t.Context(), admin, name); err != nil {
			t.Fatalf("ensure database: %v", err)
		}
	}
	var n uint64
	if err := admin.QueryRow(t.Context(), "SELECT count() FROM system.databases WHERE name = ?", name).Scan(&n); err != nil || n != 1 {
		t.Fatalf("database %s: count %d, %v", name, n, err)
	}
}

func TestValidDatabase(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want bool
	}{
		{"plain", "snip", true},
		{"underscore_and_digits", "snip_2", true},
		{"leading_underscore", "_x", true},
		{"empty", "", false},
		{"leading_digit", "2snip", false},
		{"dash", "snip-dev", false},
		{"injection", "x; DROP TABLE clicks", false},
		{"backquote", "x`y", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := schema.ValidDatabase(tc.in); got != tc.want {
				t.Errorf("ValidDatabase(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}
