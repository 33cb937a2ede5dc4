package capture

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"msmemscope/trace"
)

// openCaptureSpool opens a capture's spool: spool.bin, or, for a rotating
// capture, its logs and late.bin combined into one temporary raw spool.
func openCaptureSpool(dir string) (*trace.Spool, error) {
	if len(LogFiles(dir)) == 0 {
		return trace.OpenSpool(filepath.Join(dir, SpoolDir, trace.SpoolFileName))
	}
	tmp := filepath.Join(dir, SpoolDir, fmt.Sprintf(".combined-%d-%d.bin", os.Getpid(), time.Now().UnixNano()))
	defer os.Remove(tmp) // the open spool keeps it readable
	if err := combineLogs(dir, tmp); err != nil {
		return nil, err
	}
	return trace.OpenSpool(tmp)
}

// spoolStream is a capture's spool decoded into dump events (trace.Stream).
type spoolStream struct {
	sp  *trace.Spool
	dec *decoder
}

func (s *spoolStream) Next() (*trace.Event, error) { return s.dec.next() }
func (s *spoolStream) Close() error                { return s.sp.Close() }

// OpenStream decodes a capture folder's spool as a stream of events, in the
// same order and with the same ids as its dump. Close it when done.
func OpenStream(dir string) (trace.Stream, func() error, error) { return OpenStreamMaps(dir, "") }

// OpenStreamMaps is OpenStream for a capture still being recorded: maps is
// the process's current /proc/self/maps text, used to symbolize.
func OpenStreamMaps(dir, maps string) (trace.Stream, func() error, error) {
	meta, err := ReadMeta(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("%s is not a capture folder: %v", dir, err)
	}
	sp, err := openCaptureSpool(dir)
	if err != nil {
		return nil, nil, err
	}
	s := &spoolStream{sp: sp, dec: newDecoder(sp, dir, meta, meta.Config)}
	s.dec.mapsText = maps
	return s, s.Close, nil
}

// Resolve names the capture an --input or input_path means: a capture
// folder, or an output folder holding exactly one capture.
func Resolve(in string) (string, error) {
	fi, err := os.Stat(in)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s is not a folder: expected a capture folder (msmemscope_{pid}_{timestamp})", in)
	}
	if _, err := ReadMeta(in); err == nil {
		return in, nil
	}
	var found []string
	ents, _ := os.ReadDir(in)
	for _, e := range ents {
		d := filepath.Join(in, e.Name())
		if _, err := ReadMeta(d); e.IsDir() && err == nil {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("%s holds %d captures: name one msmemscope_{pid}_{timestamp} folder", in, len(found))
	}
	return found[0], nil
}
