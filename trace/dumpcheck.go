package trace

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// A dump in its capture folder, {capture}/dump/memscope_dump_{key}.csv|.db,
// has a config.json beside the dump folder whose events_written is the number
// of data rows written to it: a file cut exactly at a row boundary still
// parses, and only that count tells it is short. The conversion that wrote
// dump memscope_dump_{key} wrote config.json when there was none yet, else
// config_{key}.json. A dump copied out of its capture folder is read without
// this check.

// CutShort ends every error that says a file is incomplete (dumps, spools,
// rotated logs).
const CutShort = " (the file is cut short or damaged)"

// dumpPrefix starts a dump file's name; the rest up to the extension is its
// key (a stamp, maybe with a _N suffix).
const dumpPrefix = "memscope_dump_"

// rowCheck is what a dump's config.json says of it.
type rowCheck struct {
	rows   uint64 // events_written
	config string // the config file's path
}

// dumpKey is the key of a dump file's name, or false when the name is not a
// dump's.
func dumpKey(name string) (string, bool) {
	ext := filepath.Ext(name)
	if !strings.HasPrefix(name, dumpPrefix) || (ext != ".csv" && ext != ".db") {
		return "", false
	}
	return strings.TrimSuffix(strings.TrimPrefix(name, dumpPrefix), ext), true
}

// expectedRows finds the config file that belongs to the dump at path and
// returns its events_written; nil when the dump is not in a capture layout,
// when no config file can be told to be its own, or when that file does not
// say (an older version). A config file that cannot be read or parsed is an
// error.
func expectedRows(path string) (*rowCheck, error) {
	key, ok := dumpKey(filepath.Base(path))
	dumpDir := filepath.Dir(path)
	if !ok || filepath.Base(dumpDir) != "dump" {
		return nil, nil
	}
	capture := filepath.Dir(dumpDir)
	own := filepath.Join(capture, "config_"+key+".json")
	cfg := own
	if _, err := os.Stat(own); err != nil {
		// config.json belongs to the dump only when every other dump
		// without a config_{key}.json of its own has the same key (the
		// same rows in the other format).
		cfg = filepath.Join(capture, "config.json")
		if _, err := os.Stat(cfg); err != nil {
			return nil, nil
		}
		ents, _ := os.ReadDir(dumpDir)
		for _, e := range ents {
			k, ok := dumpKey(e.Name())
			if !ok || k == key {
				continue
			}
			if _, err := os.Stat(filepath.Join(capture, "config_"+k+".json")); err != nil {
				return nil, nil // two candidates: do not guess
			}
		}
	}
	b, err := os.ReadFile(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", cfg, err)
	}
	var c struct {
		EventsWritten *uint64 `json:"events_written"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %v", cfg, err)
	}
	if c.EventsWritten == nil {
		return nil, nil
	}
	return &rowCheck{rows: *c.EventsWritten, config: cfg}, nil
}

// check compares the rows found in dump path with the config's count.
func (rc *rowCheck) check(path string, found uint64) error {
	if rc == nil || found == rc.rows {
		return nil
	}
	return fmt.Errorf("%s: %d rows, but %s says events_written %d%s", path, found, rc.config, rc.rows, CutShort)
}
