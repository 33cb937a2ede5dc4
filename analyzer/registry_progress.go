package analyzer

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Progress draws a progress bar on stderr for offline work over large files.
// It is quiet when stderr is not a terminal (MSMEMSCOPE_PROGRESS=1 forces
// it, =0 silences it) and for work that ends within half a second. A nil
// *Progress does nothing, so callers need not check.
type Progress struct {
	w     io.Writer
	label string
	src   atomic.Pointer[func() (int64, int64)]
	start time.Time
	stop  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	drawn bool
	once  sync.Once
}

// progressDelay is how long work runs before the bar appears.
const progressDelay = 500 * time.Millisecond

// NewProgress returns a bar labelled label on stderr, or nil when no bar
// should be drawn.
func NewProgress(label string) *Progress {
	switch os.Getenv("MSMEMSCOPE_PROGRESS") {
	case "0":
		return nil
	case "1":
	default:
		if _, err := unix.IoctlGetTermios(int(os.Stderr.Fd()), unix.TCGETS); err != nil {
			return nil
		}
	}
	return newProgressTo(os.Stderr, label)
}

func newProgressTo(w io.Writer, label string) *Progress {
	p := &Progress{w: w, label: label, start: time.Now(), stop: make(chan struct{})}
	p.wg.Add(1)
	go p.loop()
	return p
}

// Source is something whose progress can be read: a trace.Input.
type Source interface {
	Progress() (done, total int64)
}

// Track follows s from now on.
func (p *Progress) Track(s Source) {
	if p == nil {
		return
	}
	f := s.Progress
	p.src.Store(&f)
}

// Func follows f from now on.
func (p *Progress) Func(f func() (done, total int64)) {
	if p == nil {
		return
	}
	p.src.Store(&f)
}

// Phase changes the label.
func (p *Progress) Phase(label string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.label = label
	p.mu.Unlock()
}

func (p *Progress) loop() {
	defer p.wg.Done()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			if time.Since(p.start) >= progressDelay {
				p.draw()
			}
		}
	}
}

func (p *Progress) draw() {
	f := p.src.Load()
	if f == nil {
		return
	}
	done, total := (*f)()
	p.mu.Lock()
	defer p.mu.Unlock()
	const width = 30
	var line string
	if total > 0 {
		frac := min(float64(done)/float64(total), 1)
		n := int(frac * width)
		line = fmt.Sprintf("msmemscope: %s %3.0f%% [%s%s]", p.label, frac*100, strings.Repeat("=", n), strings.Repeat(" ", width-n))
	} else {
		line = fmt.Sprintf("msmemscope: %s ...", p.label)
	}
	line += fmt.Sprintf(" %s", time.Since(p.start).Round(time.Second))
	fmt.Fprintf(p.w, "\r%s\x1b[K", line)
	p.drawn = true
}

// Done stops the bar and clears its line.
func (p *Progress) Done() {
	if p == nil {
		return
	}
	p.once.Do(func() {
		close(p.stop)
		p.wg.Wait()
		p.mu.Lock()
		if p.drawn {
			fmt.Fprint(p.w, "\r\x1b[K")
		}
		p.mu.Unlock()
	})
}
