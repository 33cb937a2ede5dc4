package analyzer

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type fixedSource struct{ done, total int64 }

func (f fixedSource) Progress() (int64, int64) { return f.done, f.total }

func TestProgress(t *testing.T) {
	var out syncBuf
	p := newProgressTo(&out, "check_leaks")
	p.Track(fixedSource{50, 200})
	time.Sleep(progressDelay + 400*time.Millisecond)
	p.Done()
	s := out.String()
	if !strings.Contains(s, "\rmsmemscope: check_leaks  25% [=======") || !strings.HasSuffix(s, "\r\x1b[K") {
		t.Fatalf("progress output %q", s)
	}
	// Quick work draws nothing.
	var quiet syncBuf
	q := newProgressTo(&quiet, "x")
	q.Track(fixedSource{1, 2})
	q.Done()
	if quiet.String() != "" {
		t.Fatalf("quick work drew %q", quiet.String())
	}
	// Off: a nil bar is a no-op.
	t.Setenv("MSMEMSCOPE_PROGRESS", "0")
	n := NewProgress("x")
	if n != nil {
		t.Fatal("MSMEMSCOPE_PROGRESS=0 gave a bar")
	}
	n.Track(fixedSource{})
	n.Phase("y")
	n.Done()
}
