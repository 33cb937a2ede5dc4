package trace

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"

	"msmemscope/internal/safefs"
)

// Writing a SQLite dump goes straight to SQLite's C API (modernc.org/sqlite's
// translation of it) rather than through database/sql or the driver: the
// connection is opened without its mutex (one goroutine uses it), text is
// bound in place from one reused buffer instead of a copy per value, and
// nothing is boxed into interfaces. Inserts are multi-row prepared
// statements in one transaction with journal_mode=OFF and synchronous=OFF,
// into a new file (nothing to protect until it is complete); the indexes are
// built at the end.

// sqliteBatch is the number of rows one INSERT statement carries (12 values
// a row, well under SQLite's 32766 parameters).
const sqliteBatch = 256

// rawDB is a connection through SQLite's C API.
type rawDB struct {
	tls *libc.TLS
	db  uintptr
	out uintptr // where the C API writes its out-parameters: on the heap,
	// which does not move (a goroutine's stack may move during a call)
}

func rawOpen(path string) (*rawDB, error) {
	return rawOpenFlags(path, sqlite3.SQLITE_OPEN_READWRITE|sqlite3.SQLITE_OPEN_CREATE)
}

// rawOpenReadOnly opens an existing database for reading.
func rawOpenReadOnly(path string) (*rawDB, error) {
	return rawOpenFlags(path, sqlite3.SQLITE_OPEN_READONLY)
}

func rawOpenFlags(path string, flags int32) (*rawDB, error) {
	tls := libc.NewTLS()
	cpath, err := libc.CString(path)
	if err != nil {
		tls.Close()
		return nil, err
	}
	r := &rawDB{tls: tls}
	rc := sqlite3.Xsqlite3_open_v2(tls, cpath, uintptr(unsafe.Pointer(&r.out)), flags|sqlite3.SQLITE_OPEN_NOMUTEX, 0)
	runtime.KeepAlive(r)
	libc.Xfree(tls, cpath)
	r.db = r.out
	if rc != sqlite3.SQLITE_OK {
		err := fmt.Errorf("cannot open: %s", r.errmsg())
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *rawDB) errmsg() string {
	if r.db == 0 {
		return "out of memory"
	}
	return libc.GoString(sqlite3.Xsqlite3_errmsg(r.tls, r.db))
}

func (r *rawDB) exec(sql string) error {
	csql, err := libc.CString(sql)
	if err != nil {
		return err
	}
	defer libc.Xfree(r.tls, csql)
	if rc := sqlite3.Xsqlite3_exec(r.tls, r.db, csql, 0, 0, 0); rc != sqlite3.SQLITE_OK {
		return fmt.Errorf("%s: %s", firstWords(sql), r.errmsg())
	}
	return nil
}

func firstWords(sql string) string {
	if len(sql) > 60 {
		return sql[:60] + "..."
	}
	return sql
}

func (r *rawDB) prepare(sql string) (uintptr, error) {
	csql, err := libc.CString(sql)
	if err != nil {
		return 0, err
	}
	defer libc.Xfree(r.tls, csql)
	r.out = 0
	rc := sqlite3.Xsqlite3_prepare_v2(r.tls, r.db, csql, -1, uintptr(unsafe.Pointer(&r.out)), 0)
	runtime.KeepAlive(r)
	if rc != sqlite3.SQLITE_OK {
		return 0, fmt.Errorf("%s: %s", firstWords(sql), r.errmsg())
	}
	return r.out, nil
}

func (r *rawDB) finalize(stmt uintptr) {
	if stmt != 0 {
		sqlite3.Xsqlite3_finalize(r.tls, stmt)
	}
}

func (r *rawDB) close() {
	if r.db != 0 {
		sqlite3.Xsqlite3_close_v2(r.tls, r.db)
		r.db = 0
	}
	if r.tls != nil {
		r.tls.Close()
		r.tls = nil
	}
}

// rawValue is one value to bind: an integer, or text at p (n bytes).
type rawValue struct {
	isInt bool
	i     int64
	p     uintptr
	n     int32
}

// run binds vals to stmt in order and steps it once.
func (r *rawDB) run(stmt uintptr, vals []rawValue) error {
	for i := range vals {
		v := &vals[i]
		var rc int32
		if v.isInt {
			rc = sqlite3.Xsqlite3_bind_int64(r.tls, stmt, int32(i+1), v.i)
		} else {
			rc = sqlite3.Xsqlite3_bind_text(r.tls, stmt, int32(i+1), v.p, v.n, sqlite3.SQLITE_STATIC)
		}
		if rc != sqlite3.SQLITE_OK {
			return errors.New(r.errmsg())
		}
	}
	rc := sqlite3.Xsqlite3_step(r.tls, stmt)
	sqlite3.Xsqlite3_reset(r.tls, stmt)
	if rc != sqlite3.SQLITE_DONE {
		return errors.New(r.errmsg())
	}
	return nil
}

// textArena holds the text of the rows being bound, in chunks that never
// move (SQLite reads the bound pointers when the statement steps).
type textArena struct {
	chunks [][]byte
	cur    int
	off    int
}

var emptyText = [1]byte{0} // bound for "": a NULL pointer would bind NULL

func (a *textArena) put(s string) rawValue {
	if len(s) == 0 {
		return rawValue{p: uintptr(unsafe.Pointer(&emptyText[0]))}
	}
	for {
		if a.cur < len(a.chunks) {
			c := a.chunks[a.cur]
			if len(c)-a.off >= len(s) {
				copy(c[a.off:], s)
				v := rawValue{p: uintptr(unsafe.Pointer(&c[a.off])), n: int32(len(s))}
				a.off += len(s)
				return v
			}
			if a.off > 0 || len(c) >= len(s) {
				a.cur, a.off = a.cur+1, 0
				continue
			}
		}
		a.chunks = append(a.chunks[:a.cur], make([]byte, max(1<<20, len(s))))
	}
}

func (a *textArena) reset() { a.cur, a.off = 0, 0 }

// SQLiteWriter writes a new SQLite dump (SPEC §2.2). Rows go to a file named
// path + ".partial" in one transaction; Close adds the indexes, commits,
// and links the file into place: a reader never sees a half-written dump,
// and an existing file is never overwritten. Errors are sticky.
type SQLiteWriter struct {
	path, tmp string
	r         *rawDB
	full      uintptr // INSERT of sqliteBatch rows
	vals      []rawValue
	typed     uintptr // INSERT of sqliteBatch rows into SQLiteTypedTable
	tvals     []rawValue
	arena     textArena
	n         int // rows pending in vals
	rows      uint64
	buf       []byte
	traces    map[int64]bool // python_trace_{pid} tables created
	err       error
	closed    bool
}

// CreateSQLite starts a new SQLite dump at path, which must not exist.
func CreateSQLite(path string) (*SQLiteWriter, error) {
	if _, err := os.Lstat(path); err == nil {
		return nil, fmt.Errorf("cannot write %s: %w", path, os.ErrExist)
	}
	tmp := path + ".partial"
	f, err := safefs.CreateNew(tmp, 0)
	if err != nil {
		return nil, fmt.Errorf("cannot write %s: %w", path, err)
	}
	f.Close()
	w := &SQLiteWriter{path: path, tmp: tmp, traces: map[int64]bool{}}
	if err := w.init(); err != nil {
		w.Abort()
		return nil, fmt.Errorf("cannot write %s: %v", path, err)
	}
	return w, nil
}

func (w *SQLiteWriter) init() error {
	r, err := rawOpen(w.tmp)
	if err != nil {
		return err
	}
	w.r = r
	cols := make([]string, numCols)
	for i, h := range CSVHeader {
		typ := "TEXT"
		switch {
		case i == colID:
			typ = "INTEGER PRIMARY KEY"
		case sqliteIntCols[i]:
			typ = "INTEGER"
		}
		cols[i] = quoteIdent(h) + " " + typ
	}
	for _, q := range []string{
		"PRAGMA page_size=65536",
		"PRAGMA journal_mode=OFF",
		"PRAGMA synchronous=OFF",
		"PRAGMA locking_mode=EXCLUSIVE",
		// A modest cache, and the index builds' sort runs spilled to temporary
		// files: a bigger cache or sorting in memory (or on more threads) was
		// no faster here, and it took the writer from about 110 MB to 370 MB
		// of RSS (it may run inside the traced program, at stop()).
		"PRAGMA cache_size=-16384",
		"PRAGMA temp_store=FILE",
		"BEGIN",
		"CREATE TABLE " + quoteIdent(SQLiteTable) + " (" + strings.Join(cols, ", ") + ")",
		"CREATE TABLE " + quoteIdent(SQLiteTypedTable) + ` ("ID" INTEGER PRIMARY KEY, "size" INTEGER, "owner" TEXT, ` +
			`"allocation_id" INTEGER, "addr" INTEGER, "ptr" INTEGER, "step" INTEGER)`,
	} {
		if err := r.exec(q); err != nil {
			return err
		}
	}
	if w.full, err = r.prepare(insertSQL(SQLiteTable, CSVHeader, sqliteBatch)); err != nil {
		return err
	}
	if w.typed, err = r.prepare(insertSQL(SQLiteTypedTable, SQLiteTypedCols, sqliteBatch)); err != nil {
		return err
	}
	w.vals = make([]rawValue, 0, sqliteBatch*numCols)
	w.tvals = make([]rawValue, 0, sqliteBatch*len(SQLiteTypedCols))
	return nil
}

// insertSQL is an INSERT of rows rows into table.
func insertSQL(table string, cols []string, rows int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO " + quoteIdent(table) + " (")
	for i, c := range cols {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(quoteIdent(c))
	}
	b.WriteString(") VALUES ")
	one := "(" + strings.TrimSuffix(strings.Repeat("?,", len(cols)), ",") + ")"
	for i := 0; i < rows; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(one)
	}
	return b.String()
}

func (w *SQLiteWriter) int(v int64) { w.vals = append(w.vals, rawValue{isInt: true, i: v}) }

func (w *SQLiteWriter) text(s string) { w.vals = append(w.vals, w.arena.put(s)) }

func (w *SQLiteWriter) textNA(s string) {
	if s == "" {
		s = NA
	}
	w.text(s)
}

// Write adds one row for e; the ID column is e.ID.
func (w *SQLiteWriter) Write(e *Event) error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return errors.New("write to a closed SQLite dump")
	}
	w.int(int64(e.ID))
	w.text(e.Kind.String())
	w.text(e.Type)
	w.textNA(e.Name)
	w.int(int64(e.Timestamp))
	w.int(e.Pid)
	w.int(e.Tid)
	w.textNA(e.Device)
	if e.HasPtr {
		w.buf = append(w.buf[:0], "0x"...)
		w.buf = strconv.AppendUint(w.buf, e.Ptr, 16)
		w.text(unsafe.String(unsafe.SliceData(w.buf), len(w.buf))) // copied into the arena
	} else {
		w.text(NA)
	}
	w.buf = e.AppendAttr(w.buf[:0])
	w.text(unsafe.String(unsafe.SliceData(w.buf), len(w.buf)))
	w.textNA(e.PyStack)
	w.textNA(e.CStack)
	w.typedRow(e)
	w.n++
	w.rows++
	if w.n == sqliteBatch {
		err := w.r.run(w.full, w.vals)
		if err == nil {
			err = w.r.run(w.typed, w.tvals)
		}
		if err != nil {
			w.err = fmt.Errorf("cannot write %s: %v", w.path, err)
			return w.err
		}
		w.vals, w.tvals, w.n = w.vals[:0], w.tvals[:0], 0
		w.arena.reset()
	}
	return nil
}

var sqlNull = rawValue{} // a text value with no pointer binds NULL

// typedRow adds e's SQLiteTypedTable row: NULL where the row has no such
// attribute.
func (w *SQLiteWriter) typedRow(e *Event) {
	mem := e.Kind == KindMalloc || e.Kind == KindFree || e.Kind == KindAccess
	tint := func(ok bool, v int64) rawValue {
		if !ok {
			return sqlNull
		}
		return rawValue{isInt: true, i: v}
	}
	w.tvals = append(w.tvals, rawValue{isInt: true, i: int64(e.ID)}, tint(mem || e.Kind == KindOOM, int64(e.Size)))
	if e.Kind == KindMalloc && e.Owner != "" {
		w.tvals = append(w.tvals, w.arena.put(e.Owner))
	} else {
		w.tvals = append(w.tvals, sqlNull)
	}
	w.tvals = append(w.tvals, tint(mem && e.AllocID != 0, int64(e.AllocID)),
		tint(e.IsMemory() && e.HasPtr, int64(e.Ptr)), tint(e.HasPtr, int64(e.Ptr)), rawValue{isInt: true, i: int64(e.Step)})
}

// flushRows inserts the rows pending (fewer than a full batch).
func (w *SQLiteWriter) flushRows() error {
	if w.n == 0 {
		return nil
	}
	s, err := w.r.prepare(insertSQL(SQLiteTable, CSVHeader, w.n))
	if err == nil {
		err = w.r.run(s, w.vals)
		w.r.finalize(s)
	}
	if err == nil {
		if s, err = w.r.prepare(insertSQL(SQLiteTypedTable, SQLiteTypedCols, w.n)); err == nil {
			err = w.r.run(s, w.tvals)
			w.r.finalize(s)
		}
	}
	w.vals, w.tvals, w.n = w.vals[:0], w.tvals[:0], 0
	w.arena.reset()
	return err
}

// Rows returns the number of rows written.
func (w *SQLiteWriter) Rows() uint64 { return w.rows }

// Flush reports the sticky error; rows are committed by Close.
func (w *SQLiteWriter) Flush() error { return w.err }

// AddPythonTrace copies the rows of a python_trace CSV (SPEC §2.3) into table
// python_trace_{pid}, created on first use.
func (w *SQLiteWriter) AddPythonTrace(pid int64, csvPath string) error {
	if w.err != nil {
		return w.err
	}
	f, err := os.Open(csvPath)
	if err != nil {
		return err
	}
	defer f.Close()
	r := newTraceCSVReader(f, csvPath)
	if err := r.header(); err != nil {
		return err
	}
	table := "python_trace_" + strconv.FormatInt(pid, 10)
	if !w.traces[pid] {
		cols := make([]string, len(TraceCSVHeader))
		for i, h := range TraceCSVHeader {
			typ := "INTEGER"
			if i == 0 {
				typ = "TEXT"
			}
			cols[i] = quoteIdent(h) + " " + typ
		}
		if err := w.r.exec("CREATE TABLE " + quoteIdent(table) + " (" + strings.Join(cols, ", ") + ")"); err != nil {
			return err
		}
		w.traces[pid] = true
	}
	stmt, err := w.r.prepare(insertSQL(table, TraceCSVHeader, 1))
	if err != nil {
		return err
	}
	defer w.r.finalize(stmt)
	var arena textArena
	vals := make([]rawValue, len(TraceCSVHeader))
	for {
		rec, err := r.next()
		if err != nil {
			return err
		}
		if rec == nil {
			return nil
		}
		arena.reset()
		vals[0] = arena.put(rec[0])
		for i := 1; i < len(rec); i++ {
			x, err := strconv.ParseInt(rec[i], 10, 64)
			if err != nil {
				return fmt.Errorf("%s:%d: bad %s %q", csvPath, r.line, TraceCSVHeader[i], rec[i])
			}
			vals[i] = rawValue{isInt: true, i: x}
		}
		if err := w.r.run(stmt, vals); err != nil {
			return err
		}
	}
}

// Close writes the pending rows, creates the indexes, commits and moves the
// file into place.
func (w *SQLiteWriter) Close() error {
	if w.closed {
		return w.err
	}
	if w.err == nil {
		w.err = w.finish()
	}
	w.closed = true
	if w.err != nil {
		w.Abort()
		return w.err
	}
	return nil
}

func (w *SQLiteWriter) finish() error {
	err := w.flushRows()
	if err == nil {
		w.r.finalize(w.full)
		w.r.finalize(w.typed)
		w.full, w.typed = 0, 0
		d, a := quoteIdent(SQLiteTable), quoteIdent(SQLiteTypedTable)
		for _, q := range []string{
			`CREATE INDEX "memscope_dump_Ptr" ON ` + d + ` ("Ptr")`,
			`CREATE INDEX "memscope_dump_Event" ON ` + d + ` ("Event")`,
			// owner then size: GROUP BY owner with sum(size) reads the index
			// alone. Only MALLOC rows have an owner: the others are left out
			// (the index of every row took most of the dump's writing time).
			`CREATE INDEX "memscope_attr_owner" ON ` + a + ` ("owner", "size") WHERE "owner" IS NOT NULL`,
			// (SQLite's names ignore case: the side table's ptr is ptr_int beside the dump's Ptr)
			`CREATE VIEW ` + quoteIdent(SQLiteTypedView) + ` AS SELECT d.*, a."size", a."owner", a."allocation_id", ` +
				`a."addr", a."ptr" AS "ptr_int", a."step" FROM ` + d + ` d LEFT JOIN ` + a + ` a ON a."ID" = d."ID"`,
			"COMMIT",
		} {
			if err = w.r.exec(q); err != nil {
				break
			}
		}
	}
	w.r.close()
	w.r = nil
	if err == nil {
		err = os.Link(w.tmp, w.path)
	}
	os.Remove(w.tmp)
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", w.path, err)
	}
	return nil
}

// Abort discards the dump.
func (w *SQLiteWriter) Abort() {
	if w.r != nil {
		w.r.finalize(w.full)
		w.r.finalize(w.typed)
		w.full, w.typed = 0, 0
		w.r.close()
		w.r = nil
	}
	w.closed = true
	os.Remove(w.tmp)
}
