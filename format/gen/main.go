// Command gen writes the record format's C header, Go constants and Python
// constants from format/records.def (see that file). Run from anywhere in
// the module (`go generate ./format/`); with -check it writes nothing and
// fails when a generated file is not what records.def gives.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	check := flag.Bool("check", false, "fail when a generated file is stale, write nothing")
	flag.Parse()
	root, err := moduleRoot()
	if err == nil {
		err = run(root, *check)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "format/gen:", err)
		os.Exit(1)
	}
}

// moduleRoot is the folder holding go.mod, at or above the working folder.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", fmt.Errorf("no go.mod above the working folder")
		}
		dir = up
	}
}

// Outputs: path (from the module root) -> the function writing it.
var outputs = []struct {
	path string
	gen  func(*Table) ([]byte, error)
}{
	{"libmemscope/records_gen.h", genC},
	{"format/records_gen.go", genGo},
	{"python/msmemscope/_records.py", genPython},
}

// DefPath is the table, from the module root.
const DefPath = "format/records.def"

func run(root string, check bool) error {
	src, err := os.ReadFile(filepath.Join(root, DefPath))
	if err != nil {
		return err
	}
	t, err := Parse(src)
	if err != nil {
		return fmt.Errorf("%s:%v", DefPath, err)
	}
	var stale []string
	for _, o := range outputs {
		b, err := o.gen(t)
		if err != nil {
			return fmt.Errorf("%s: %v", o.path, err)
		}
		p := filepath.Join(root, o.path)
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, b) {
			continue
		}
		if check {
			stale = append(stale, o.path)
			continue
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
	}
	if len(stale) > 0 {
		return fmt.Errorf("stale (run make generate): %v", stale)
	}
	return nil
}
