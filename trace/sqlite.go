package trace

import (
	"bufio"
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"modernc.org/libc"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// SQLite dumps (SPEC §2.2): table memscope_dump with exactly the CSV's
// columns, in the same order and under the same (quoted) names, holding the
// same text the CSV would ("N/A" included); ID, Timestamp(ns), Process Id and
// Thread Id are INTEGER, ID being the table's INTEGER PRIMARY KEY (rows are
// found by ID when check_inefficient updates them). Tables python_trace_{pid}
// hold the Python trace CSVs' rows (TraceCSVHeader). Indexes on Ptr and Event.

// SQLiteTable is the dump's table.
const SQLiteTable = "memscope_dump"

// The typed side of a SQLite dump: SQLiteTypedTable holds, per row ID, what
// the Attr text holds as typed columns (size, owner, allocation_id, addr
// and ptr as integers) and the row's step; SQLiteTypedView joins it to the
// dump's columns, for queries such as SELECT owner, sum(size) ... GROUP BY
// owner.
const (
	SQLiteTypedTable = "memscope_attr"
	SQLiteTypedView  = "memscope_dump_typed"
)

// SQLiteTypedCols are SQLiteTypedTable's columns.
var SQLiteTypedCols = []string{"ID", "size", "owner", "allocation_id", "addr", "ptr", "step"}

// TraceCSVHeader is the header of a python_trace CSV (SPEC §2.3), and the
// columns of a python_trace_{pid} table.
var TraceCSVHeader = []string{"FuncInfo", "StartTime(ns)", "EndTime(ns)", "Thread Id", "Process Id"}

// sqliteMagic starts every SQLite database file.
const sqliteMagic = "SQLite format 3\x00"

// sqliteIntCols are the INTEGER columns of memscope_dump.
var sqliteIntCols = [numCols]bool{colID: true, colTimestamp: true, colPid: true, colTid: true}

// quoteIdent quotes an SQL identifier.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// sqliteURI is the URI that opens path (SQLITE_OPEN_URI is on in the driver:
// a plain path holding '?' or '#' would be cut).
func sqliteURI(path string, query string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	var b strings.Builder
	b.WriteString("file:")
	for i := 0; i < len(abs); i++ {
		c := abs[i]
		if c == '/' || c == '-' || c == '_' || c == '.' || c == '~' ||
			(c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	if query != "" {
		b.WriteString("?" + query)
	}
	return b.String()
}

// sqliteConn is a driver-level connection, for reading and for updates
// (writing a new dump goes through rawDB, in sqlite_write.go).
type sqliteConn struct {
	c    driver.Conn
	path string
}

func openSQLite(path, query string) (*sqliteConn, error) {
	c, err := (&sqlite.Driver{}).Open(sqliteURI(path, query))
	if err != nil {
		return nil, err
	}
	return &sqliteConn{c: c, path: path}, nil
}

func (c *sqliteConn) exec(query string, args ...driver.NamedValue) error {
	_, err := c.c.(driver.ExecerContext).ExecContext(context.Background(), query, args)
	return err
}

func (c *sqliteConn) prepare(query string) (driver.Stmt, error) {
	return c.c.(driver.ConnPrepareContext).PrepareContext(context.Background(), query)
}

func (c *sqliteConn) query(query string, args ...driver.NamedValue) (driver.Rows, error) {
	return c.c.(driver.QueryerContext).QueryContext(context.Background(), query, args)
}

func stmtExec(s driver.Stmt, args []driver.NamedValue) error {
	_, err := s.(driver.StmtExecContext).ExecContext(context.Background(), args)
	return err
}

func (c *sqliteConn) Close() error { return c.c.Close() }

// traceCSVReader reads a python_trace CSV: 5 fields, the first possibly
// quoted (tracer.py quotes FuncInfo when it holds ',', '"' or a line end).
type traceCSVReader struct {
	cr   *csvReader // reused for its RFC 4180 record reader
	name string
	line int
}

func newTraceCSVReader(r io.Reader, name string) *traceCSVReader {
	return &traceCSVReader{cr: &csvReader{br: newBufReader(r), name: name, rec: make([]byte, 0, 256)}, name: name}
}

func (t *traceCSVReader) header() error {
	start, err := t.cr.readRecord()
	if err == io.EOF {
		return fmt.Errorf("%s:1: empty file: no header row", t.name)
	}
	if err != nil {
		return fmt.Errorf("%s:%d: %v", t.name, start, err)
	}
	for i, want := range TraceCSVHeader {
		if i >= len(t.cr.ends) || strings.TrimSpace(strings.TrimPrefix(string(t.cr.field(i)), "\uFEFF")) != want {
			return fmt.Errorf("%s:%d: header: missing column %q", t.name, start, want)
		}
	}
	return nil
}

// next returns the next record's fields, or nil at the end.
func (t *traceCSVReader) next() ([]string, error) {
	start, err := t.cr.readRecord()
	if err == io.EOF {
		return nil, nil
	}
	t.line = start
	if err != nil {
		return nil, fmt.Errorf("%s:%d: %v", t.name, start, err)
	}
	if len(t.cr.ends) != len(TraceCSVHeader) {
		return nil, fmt.Errorf("%s:%d: wrong number of fields: %d, want %d", t.name, start, len(t.cr.ends), len(TraceCSVHeader))
	}
	rec := make([]string, len(TraceCSVHeader))
	for i := range rec {
		rec[i] = string(t.cr.field(i))
	}
	return rec, nil
}

func newBufReader(r io.Reader) *bufio.Reader { return bufio.NewReaderSize(r, 64<<10) }

// ---------------------------------------------------------------------------
// Reading a SQLite dump.

// sqliteCheck checks that c holds memscope_dump with the columns of SPEC
// §2.1, in order.
func sqliteCheck(c *sqliteConn, path string) error {
	rows, err := c.query(`SELECT name FROM sqlite_master WHERE type='table' AND name=?`, driver.NamedValue{Ordinal: 1, Value: SQLiteTable})
	if err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	v := make([]driver.Value, 1)
	err = rows.Next(v)
	rows.Close()
	if err == io.EOF {
		return fmt.Errorf("%s: no table %s: not an msmemscope dump", path, SQLiteTable)
	}
	if err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	rows, err = c.query(`PRAGMA table_info(` + quoteIdent(SQLiteTable) + `)`)
	if err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	defer rows.Close()
	v = make([]driver.Value, len(rows.Columns()))
	var names []string
	for {
		if err := rows.Next(v); err == io.EOF {
			break
		} else if err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
		s, _ := dbString(v[1])
		names = append(names, s)
	}
	if err := checkHeader(names); err != nil {
		return fmt.Errorf("%s: table %s: %v", path, SQLiteTable, err)
	}
	return nil
}

// dbString is a TEXT (or other) value as a string; false for NULL.
func dbString(v driver.Value) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []byte:
		return string(x), true
	case int64:
		return strconv.FormatInt(x, 10), true
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), true
	case nil:
		return "", false
	}
	return fmt.Sprint(v), true
}

type sqliteInput struct {
	path  string
	lean  bool
	maxID int64
	at    atomic.Int64 // the ID of the last row read
	out   chan sqliteBatchRes
	stop  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once

	cur []Event
	i   int
	err error
	end bool
}

type sqliteBatchRes struct {
	events []Event
	err    error
}

func openSQLiteInput(path string, opt OpenOptions, rc *rowCheck) (Input, error) {
	if err := sqliteSize(path); err != nil {
		return nil, err
	}
	c, err := openSQLite(path, "mode=ro")
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if err := sqliteCheck(c, path); err != nil {
		c.Close()
		return nil, err
	}
	if err := sqliteCount(c, path, rc); err != nil {
		c.Close()
		return nil, err
	}
	in := &sqliteInput{path: path, lean: opt.Lean, out: make(chan sqliteBatchRes, 4), stop: make(chan struct{})}
	if rows, err := c.query(`SELECT max("ID") FROM ` + quoteIdent(SQLiteTable)); err == nil {
		v := make([]driver.Value, 1)
		if rows.Next(v) == nil {
			in.maxID, _ = v[0].(int64)
		}
		rows.Close()
	}
	c.Close()
	cols := CSVHeader
	if opt.Lean {
		cols = CSVHeader[:colPyStack]
	}
	q := make([]string, len(cols))
	for i, h := range cols {
		q[i] = quoteIdent(h)
	}
	where := ""
	if len(opt.Kinds) > 0 {
		// Filtered by SQLite while it scans the table in ID order.
		var ks []string
		for _, k := range opt.Kinds {
			ks = append(ks, "'"+k.String()+"'")
		}
		where = ` NOT INDEXED WHERE "Event" IN (` + strings.Join(ks, ", ") + `)`
	}
	// Rows are read through SQLite's C API: their text is parsed where
	// SQLite holds it, as the CSV input parses its buffer.
	r, err := rawOpenReadOnly(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	stmt, err := r.prepare(`SELECT ` + strings.Join(q, ", ") + ` FROM ` + quoteIdent(SQLiteTable) + where + ` ORDER BY "ID"`)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	in.wg.Add(1)
	go in.produce(r, stmt, len(cols))
	return in, nil
}

func (in *sqliteInput) produce(r *rawDB, stmt uintptr, ncols int) {
	defer in.wg.Done()
	defer close(in.out)
	defer r.close()
	defer r.finalize(stmt)
	const size = 2048
	p := newChunkParser(in.path, in.lean)
	conv := &dbRow{intern: p.intern, lean: in.lean}
	var ints [numCols][]byte // integer columns as text, for the parser
	n := 0
	for {
		b := make([]Event, 0, size)
		var err error
		for len(b) < size {
			rc := sqlite3.Xsqlite3_step(r.tls, stmt)
			if rc == sqlite3.SQLITE_DONE {
				err = io.EOF
				break
			}
			if rc != sqlite3.SQLITE_ROW {
				err = errors.New(r.errmsg())
				break
			}
			n++
			for i := 0; i < ncols; i++ {
				if sqlite3.Xsqlite3_column_type(r.tls, stmt, int32(i)) == sqlite3.SQLITE_INTEGER {
					ints[i] = strconv.AppendInt(ints[i][:0], sqlite3.Xsqlite3_column_int64(r.tls, stmt, int32(i)), 10)
					p.f[i] = ints[i]
					continue
				}
				t := sqlite3.Xsqlite3_column_text(r.tls, stmt, int32(i))
				p.f[i] = libc.GoBytes(t, int(sqlite3.Xsqlite3_column_bytes(r.tls, stmt, int32(i))))
			}
			b = append(b, Event{})
			e := &b[len(b)-1]
			if p.fill(e) {
				in.at.Store(int64(e.ID))
				continue
			}
			// The slow path, for csvReader's rules and messages.
			*e = Event{}
			if err = conv.fill(e, rawValues(r, stmt, ncols)); err != nil {
				b = b[:len(b)-1]
				err = fmt.Errorf("%s: row %d: %v", in.path, n, err)
				break
			}
			in.at.Store(int64(e.ID))
		}
		if err == io.EOF {
			err = nil
		} else if err != nil && !strings.HasPrefix(err.Error(), in.path+": ") {
			err = fmt.Errorf("%s: row %d: %v", in.path, n, err)
		}
		if len(b) > 0 || err != nil {
			select {
			case in.out <- sqliteBatchRes{b, err}:
			case <-in.stop:
				return
			}
		}
		if err != nil || len(b) < size {
			return
		}
	}
}

// rawValues is the current row as driver values (NULL as nil).
func rawValues(r *rawDB, stmt uintptr, ncols int) []driver.Value {
	v := make([]driver.Value, ncols)
	for i := range v {
		switch sqlite3.Xsqlite3_column_type(r.tls, stmt, int32(i)) {
		case sqlite3.SQLITE_NULL:
		case sqlite3.SQLITE_INTEGER:
			v[i] = sqlite3.Xsqlite3_column_int64(r.tls, stmt, int32(i))
		default:
			t := sqlite3.Xsqlite3_column_text(r.tls, stmt, int32(i))
			v[i] = string(libc.GoBytes(t, int(sqlite3.Xsqlite3_column_bytes(r.tls, stmt, int32(i)))))
		}
	}
	return v
}

// dbRow turns a row of memscope_dump into an event, with csvReader's rules.
type dbRow struct {
	intern interner
	lean   bool
}

func (d *dbRow) str(v driver.Value, na bool) string {
	s, ok := dbString(v)
	if !ok || (na && s == NA) {
		return ""
	}
	if len(s) < 64 {
		if t, ok := d.intern.m[s]; ok {
			return t
		}
		if len(d.intern.m) < maxInternEntries {
			d.intern.m[s] = s
		}
	}
	return s
}

func dbUint(v driver.Value, col int) (uint64, error) {
	switch x := v.(type) {
	case int64:
		if x >= 0 {
			return uint64(x), nil
		}
	case string, []byte:
		s, _ := dbString(x)
		if n, ok := parseUintDec(s); ok {
			return n, nil
		}
	}
	return 0, fmt.Errorf("bad %s %s", CSVHeader[col], dbQuote(v))
}

func dbInt(v driver.Value, col int) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string, []byte:
		s, _ := dbString(x)
		if n, ok := parseIntDec(s); ok {
			return n, nil
		}
	}
	return 0, fmt.Errorf("bad %s %s", CSVHeader[col], dbQuote(v))
}

func dbQuote(v driver.Value) string {
	s, ok := dbString(v)
	if !ok {
		return "NULL"
	}
	return strconv.Quote(s)
}

func (d *dbRow) fill(e *Event, v []driver.Value) error {
	var err error
	if e.ID, err = dbUint(v[colID], colID); err != nil {
		return err
	}
	s, _ := dbString(v[colEvent])
	if e.Kind = ParseKind(s); e.Kind == 0 {
		return fmt.Errorf("unknown Event kind %s", dbQuote(v[colEvent]))
	}
	e.Type = d.str(v[colType], false)
	e.Name = d.str(v[colName], true)
	if e.Timestamp, err = dbUint(v[colTimestamp], colTimestamp); err != nil {
		return err
	}
	if e.Pid, err = dbInt(v[colPid], colPid); err != nil {
		return err
	}
	if e.Tid, err = dbInt(v[colTid], colTid); err != nil {
		return err
	}
	e.Device = d.str(v[colDevice], true)
	if s, ok := dbString(v[colPtr]); !ok || s != NA {
		var ok2 bool
		if e.Ptr, ok2 = parseHexPtr(s); !ok2 {
			return fmt.Errorf("bad Ptr %s", dbQuote(v[colPtr]))
		}
		e.HasPtr = true
	}
	ptr, hasPtr := e.Ptr, e.HasPtr
	attr, _ := dbString(v[colAttr])
	if !d.lean || !leanAttr(e, attr, d.internStr) {
		if err := parseAttr(e, attr, d.internStr, identity); err != nil {
			return err
		}
		if d.lean {
			e.Extra = nil
		}
	}
	if e.IsMemory() && (!hasPtr || ptr != e.Ptr) {
		return fmt.Errorf("Attr addr 0x%x does not match Ptr %s", e.Ptr, dbQuote(v[colPtr]))
	}
	if len(v) > colCStack {
		e.PyStack = d.str(v[colPyStack], true)
		e.CStack = d.str(v[colCStack], true)
	}
	return nil
}

func (d *dbRow) internStr(s string) string { return d.str(s, false) }

func (in *sqliteInput) Next() (*Event, error) {
	if in.err != nil {
		return nil, in.err
	}
	for in.i >= len(in.cur) {
		if in.end {
			return nil, nil
		}
		r, ok := <-in.out
		if !ok {
			in.end, in.cur = true, nil
			return nil, nil
		}
		in.cur, in.i = r.events, 0
		if r.err != nil {
			if len(r.events) == 0 {
				in.err = r.err
				return nil, r.err
			}
			in.out = replay(r.err)
		}
	}
	e := &in.cur[in.i]
	in.i++
	return e, nil
}

// replay is a channel holding just err, then closed.
func replay(err error) chan sqliteBatchRes {
	ch := make(chan sqliteBatchRes, 1)
	ch <- sqliteBatchRes{err: err}
	close(ch)
	return ch
}

// Offset is -1: rows of a database are found by ID.
func (in *sqliteInput) Offset() int64 { return -1 }

func (in *sqliteInput) Path() string   { return in.path }
func (in *sqliteInput) Format() string { return FormatDB }
func (in *sqliteInput) Progress() (int64, int64) {
	return in.at.Load(), in.maxID
}

func (in *sqliteInput) Close() error {
	in.once.Do(func() {
		close(in.stop)
		in.wg.Wait()
	})
	return nil
}

func (in *sqliteInput) Lookup(ids []uint64, fn func(*Event) error) error {
	if len(ids) == 0 {
		return nil
	}
	c, err := openSQLite(in.path, "mode=ro")
	if err != nil {
		return fmt.Errorf("%s: %v", in.path, err)
	}
	defer c.Close()
	q := make([]string, numCols)
	for i, h := range CSVHeader {
		q[i] = quoteIdent(h)
	}
	conv := &dbRow{intern: interner{m: map[string]string{}}}
	v := make([]driver.Value, numCols)
	for len(ids) > 0 {
		n := min(len(ids), 500)
		args := make([]driver.NamedValue, n)
		for i := range args {
			args[i] = driver.NamedValue{Ordinal: i + 1, Value: int64(ids[i])}
		}
		rows, err := c.query(`SELECT `+strings.Join(q, ", ")+` FROM `+quoteIdent(SQLiteTable)+
			` WHERE "ID" IN (`+strings.TrimSuffix(strings.Repeat("?,", n), ",")+`) ORDER BY "ID"`, args...)
		if err != nil {
			return fmt.Errorf("%s: %v", in.path, err)
		}
		for {
			err := rows.Next(v)
			if err == io.EOF {
				break
			}
			var e Event
			if err == nil {
				if err = conv.fill(&e, v); err == nil {
					err = fn(&e)
				}
			}
			if err != nil {
				rows.Close()
				return fmt.Errorf("%s: ID %d: %v", in.path, e.ID, err)
			}
		}
		rows.Close()
		ids = ids[n:]
	}
	return nil
}

// addIneffDB adds inefficiency results to a SQLite dump in one transaction.
func addIneffDB(path string, marks []IneffMark) (added int, err error) {
	c, err := openSQLite(path, "")
	if err != nil {
		return 0, fmt.Errorf("%s: %v", path, err)
	}
	defer c.Close()
	if err := sqliteCheck(c, path); err != nil {
		return 0, err
	}
	if err := c.exec("BEGIN IMMEDIATE"); err != nil {
		return 0, fmt.Errorf("%s: %v", path, err)
	}
	defer func() {
		if err != nil {
			c.exec("ROLLBACK")
			added = 0
		}
	}()
	sel, err := c.prepare(`SELECT "Event", "Attr" FROM ` + quoteIdent(SQLiteTable) + ` WHERE "ID" = ?`)
	if err != nil {
		return 0, fmt.Errorf("%s: %v", path, err)
	}
	defer sel.Close()
	upd, err := c.prepare(`UPDATE ` + quoteIdent(SQLiteTable) + ` SET "Attr" = ? WHERE "ID" = ?`)
	if err != nil {
		return 0, fmt.Errorf("%s: %v", path, err)
	}
	defer upd.Close()
	v := make([]driver.Value, 2)
	for _, m := range marks {
		rows, err := sel.(driver.StmtQueryContext).QueryContext(context.Background(), []driver.NamedValue{{Ordinal: 1, Value: int64(m.ID)}})
		if err != nil {
			return 0, fmt.Errorf("%s: ID %d: %v", path, m.ID, err)
		}
		err = rows.Next(v)
		rows.Close()
		if err == io.EOF {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("%s: ID %d: %v", path, m.ID, err)
		}
		kind, _ := dbString(v[0])
		if kind != KindMalloc.String() {
			continue
		}
		attr, _ := dbString(v[1])
		e := Event{Kind: KindMalloc}
		if err := ParseAttrInto(&e, attr); err != nil {
			return 0, fmt.Errorf("%s: ID %d: %v", path, m.ID, err)
		}
		s, n := MergeIneff(e.Inefficient, m.Types)
		if n == 0 {
			continue
		}
		e.Inefficient = s
		if err := stmtExec(upd, []driver.NamedValue{{Ordinal: 1, Value: e.Attr()}, {Ordinal: 2, Value: int64(m.ID)}}); err != nil {
			return 0, fmt.Errorf("%s: ID %d: %v", path, m.ID, err)
		}
		added += n
	}
	if err := c.exec("COMMIT"); err != nil {
		return 0, fmt.Errorf("%s: %v", path, err)
	}
	return added, nil
}
