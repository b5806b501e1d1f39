package chwriter

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// Error classes, the label of snip_warehouse_insert_errors_total. Every class but
// bad_row is retried with the whole batch; schema, auth and partitions are
// permanent (loader.ErrPermanent): retried slowly, with an error log, until
// an operator acts.
const (
	// ClassUnavailable: nothing answers, or the connection broke (refused,
	// reset, EOF, broken pipe). ClickHouse is down or restarting.
	ClassUnavailable = "unavailable"
	// ClassTimeout: the insert's deadline passed or a read timed out; a
	// hung (SIGSTOPped) or overloaded server, or a network partition.
	ClassTimeout = "timeout"
	// ClassOverloaded: the server refused for now (too many parts, memory
	// limit, too many queries, its own timeout).
	ClassOverloaded = "overloaded"
	// ClassPartitions: the server refused an insert touching more
	// partitions (days) than its max_partitions_per_insert_block (code 252,
	// as too many parts is, with its own message). The writer sends at most
	// Config.MaxDaysPerInsert days per statement, so the server's limit is
	// below that: the same insert is refused every time, whatever the load.
	// Permanent.
	ClassPartitions = "partitions"
	// ClassMissing: a table, the view that feeds the rollup or the database
	// is gone; the writer applies the schema again before the next insert.
	ClassMissing = "missing"
	// ClassSchema: the tables do not fit the rows (unknown column, type
	// mismatch, a column type the client refuses a well-formed row for,
	// syntax the server does not know). Permanent.
	ClassSchema = "schema"
	// ClassAuth: the credentials or grants do not allow the insert: a wrong
	// user or password; on 18.16, whose users.xml has no grants, a readonly
	// profile, allow_databases without the loader's database or networks
	// without the loader's address; on current servers, missing grants.
	// Permanent.
	ClassAuth = "auth"
	// ClassServer: any other server exception; retried.
	ClassServer = "server"
	// ClassBadRow: the client refused the values of one row that is not
	// well-formed (loader.Row.Validate); its event is parked.
	ClassBadRow = "bad_row"
	// ClassCanceled: the loader was stopped during the insert.
	ClassCanceled = "canceled"
	// ClassOther: anything else; retried.
	ClassOther = "other"
)

// ClickHouse exception codes (ErrorCodes.cpp), grouped by what to do.
var (
	missingCodes = map[int32]bool{60: true, 81: true}                                                    // UNKNOWN_TABLE, UNKNOWN_DATABASE
	schemaCodes  = map[int32]bool{16: true, 44: true, 47: true, 50: true, 53: true, 62: true, 115: true} // NO_SUCH_COLUMN_IN_TABLE, ILLEGAL_COLUMN, UNKNOWN_IDENTIFIER, UNKNOWN_TYPE, TYPE_MISMATCH, SYNTAX_ERROR, UNKNOWN_SETTING
	authCodes    = map[int32]bool{164: true, 192: true, 193: true, 195: true, 291: true, 497: true, 516: true}
	// 164 READONLY, 192 UNKNOWN_USER, 193 WRONG_PASSWORD, 195 IP_ADDRESS_NOT_ALLOWED,
	// 291 DATABASE_ACCESS_DENIED, 497 ACCESS_DENIED, 516 AUTHENTICATION_FAILED
	overloadedCodes = map[int32]bool{159: true, 202: true, 203: true, 209: true, 210: true, 241: true, 252: true}
	// 159 TIMEOUT_EXCEEDED, 202 TOO_MANY_SIMULTANEOUS_QUERIES, 203 NO_FREE_CONNECTION,
	// 209 SOCKET_TIMEOUT, 210 NETWORK_ERROR, 241 MEMORY_LIMIT_EXCEEDED, 252 TOO_MANY_PARTS (but see tooManyPartitions)
)

// Classify names the class of an error from ClickHouse or the client, as
// measured on ClickHouse 18.16 (chwriter_test.go meets them on a real server).
func Classify(err error) string {
	var ex *clickhouse.Exception
	switch {
	case err == nil:
		return ""
	case errors.Is(err, errTableChanged):
		return ClassSchema
	case errors.Is(err, errViewMissing):
		return ClassMissing
	case errors.As(err, &ex):
		switch {
		case missingCodes[ex.Code]:
			return ClassMissing
		case schemaCodes[ex.Code]:
			return ClassSchema
		case authCodes[ex.Code]:
			return ClassAuth
		case tooManyPartitions(ex):
			return ClassPartitions
		case overloadedCodes[ex.Code]:
			return ClassOverloaded
		}
		return ClassServer
	case errors.Is(err, context.Canceled):
		return ClassCanceled
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, clickhouse.ErrAcquireConnTimeout):
		return ClassTimeout
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return ClassUnavailable
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ClassTimeout
	}
	return ClassOther
}

// tooManyPartitions reports whether ex is the refusal of an insert block
// touching more than max_partitions_per_insert_block partitions. It shares
// code 252 (TOO_MANY_PARTS) with a table whose merges fall behind, which
// passes; only the message tells them apart.
func tooManyPartitions(ex *clickhouse.Exception) bool {
	return ex.Code == 252 && strings.Contains(ex.Message, "partitions for single INSERT block")
}

func permanent(class string) bool {
	return class == ClassSchema || class == ClassAuth || class == ClassPartitions
}

func missingSchema(err error) bool {
	var ex *clickhouse.Exception
	return errors.Is(err, errViewMissing) || errors.As(err, &ex) && missingCodes[ex.Code]
}
