package trace

import (
	"database/sql/driver"
	"encoding/binary"
	"fmt"
	"io"
	"os"
)

// sqliteSize checks a database file's size against its header (SQLite file
// format §1.3): the page size at offset 16, the number of pages at offset 28,
// valid when the change counter at 24 equals the version-valid-for number at
// 92. A file shorter than that lost its end: SQLite may still read the pages
// left, and give fewer rows without an error.
func sqliteSize(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	var h [100]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		return fmt.Errorf("%s: %d bytes, shorter than an SQLite header%s", path, fi.Size(), CutShort)
	}
	ps := int64(binary.BigEndian.Uint16(h[16:]))
	if ps == 1 {
		ps = 65536
	}
	if ps < 512 || ps&(ps-1) != 0 {
		return fmt.Errorf("%s: bad SQLite header (page size %d)%s", path, ps, CutShort)
	}
	pages := int64(binary.BigEndian.Uint32(h[28:]))
	valid := binary.BigEndian.Uint32(h[24:]) == binary.BigEndian.Uint32(h[92:])
	switch {
	case fi.Size()%ps != 0:
		return fmt.Errorf("%s: %d bytes, not a whole number of %d-byte pages%s", path, fi.Size(), ps, CutShort)
	case valid && pages > 0 && fi.Size() < pages*ps:
		return fmt.Errorf("%s: %d bytes, but its header says %d pages of %d bytes%s", path, fi.Size(), pages, ps, CutShort)
	}
	return nil
}

// sqliteCount checks the number of rows of memscope_dump against the
// config's count.
func sqliteCount(c *sqliteConn, path string, rc *rowCheck) error {
	if rc == nil {
		return nil
	}
	rows, err := c.query(`SELECT count(*) FROM ` + quoteIdent(SQLiteTable))
	if err != nil {
		return fmt.Errorf("%s: table %s: %v", path, SQLiteTable, err)
	}
	defer rows.Close()
	v := make([]driver.Value, 1)
	if err := rows.Next(v); err != nil {
		return fmt.Errorf("%s: table %s: %v", path, SQLiteTable, err)
	}
	n, _ := v[0].(int64)
	return rc.check(path, uint64(n))
}
