package trace

// StepTracker numbers the steps of one process (SPEC §3). Feed it every event
// of the process, in order, with Observe; it sets each event's Step.
//
// A process has one step source, chosen by the caller before the first event
// (usually by a pre-scan, see HasStepCalls and ScanStepCalls):
//
//   - UseStepCalls true (the process called msmemscope.step() at least once:
//     there is a SYSTEM event of Type TypeStep): the events before the first
//     STEP event are step 1. Each STEP event ends the current step, and the
//     events after it belong to the next one; the STEP event itself belongs to
//     the step it ends. So the events up to and including the k-th STEP event
//     are in step k, and there is no step 0.
//
//   - UseStepCalls false: steps are mstx ranges whose message (Name) is
//     "step start" (StepRangeMessage). The k-th MSTX Range_start with that
//     Name opens step k, and the Range_start row is in step k; the Range_end
//     with the same MstxID closes it, and the Range_end row is in step k too.
//     Events outside every step range are in step 0. If step ranges overlap,
//     an event belongs to the most recently opened range still open.
//
// Ended reports when a step ends, for analyses that act on step boundaries.
type StepTracker struct {
	UseStepCalls bool

	cur     int            // the step of the next event (step() mode: 1 + STEP events seen)
	started bool           // step() mode: cur was initialised
	opened  int            // mstx mode: step ranges opened so far
	open    map[uint64]int // mstx mode: MstxID of an open step range → its step
	ended   int            // the step the last observed event ended, or 0
	maxStep int            // the highest Step set so far
}

// Observe sets e.Step and advances the tracker past e.
func (t *StepTracker) Observe(e *Event) {
	t.observe(e)
	t.maxStep = max(t.maxStep, e.Step)
}

func (t *StepTracker) observe(e *Event) {
	t.ended = 0
	if t.UseStepCalls {
		if !t.started {
			t.cur, t.started = 1, true
		}
		e.Step = t.cur
		if IsStepCall(e) {
			t.ended = t.cur
			t.cur++
		}
		return
	}
	if e.Kind != KindMstx {
		e.Step = t.cur
		return
	}
	switch {
	case e.Type == TypeRangeStart && e.Name == StepRangeMessage:
		t.opened++
		if t.open == nil {
			t.open = make(map[uint64]int)
		}
		t.open[e.MstxID] = t.opened
		t.cur = t.opened
		e.Step = t.cur
	case e.Type == TypeRangeEnd:
		k, ok := t.open[e.MstxID]
		if !ok {
			e.Step = t.cur
			return
		}
		e.Step = k
		t.ended = k
		delete(t.open, e.MstxID)
		if k == t.cur {
			t.cur = 0
			for _, o := range t.open { // the latest range still open, if any
				t.cur = max(t.cur, o)
			}
		}
	default:
		e.Step = t.cur
	}
}

// Current returns the step the next event will be in if it changes nothing:
// in step() mode 1 + the STEP events seen; with mstx ranges the step of the
// innermost open step range, or 0 outside them.
func (t *StepTracker) Current() int {
	if t.UseStepCalls && !t.started {
		return 1
	}
	return t.cur
}

// Ended returns the step that the last observed event ended (a STEP event, or
// the Range_end closing a step range), or 0 if it ended none.
func (t *StepTracker) Ended() int { return t.ended }

// Steps returns the highest step of the events observed so far.
func (t *StepTracker) Steps() int { return t.maxStep }

// IsStepCall reports whether e is a step() boundary (SYSTEM, Type STEP).
func IsStepCall(e *Event) bool { return e.Kind == KindSystem && e.Type == TypeStep }

// HasStepCalls reports whether events hold a step() boundary, i.e. whether a
// StepTracker over them should use UseStepCalls.
func HasStepCalls(events []Event) bool {
	for i := range events {
		if IsStepCall(&events[i]) {
			return true
		}
	}
	return false
}

// ScanStepCalls reads s until its first step() boundary and reports whether
// there is one: the pre-scan for a stream that can be opened twice (a file).
func ScanStepCalls(s Stream) (bool, error) {
	found := false
	err := Each(s, func(e *Event) error {
		if found = IsStepCall(e); found {
			return ErrStop
		}
		return nil
	})
	return found, err
}

// WithSteps returns a Stream that passes every event of s through t.Observe,
// so that the events come out with Step set.
func WithSteps(s Stream, t *StepTracker) Stream { return &stepStream{s, t} }

type stepStream struct {
	s Stream
	t *StepTracker
}

func (s *stepStream) Next() (*Event, error) {
	e, err := s.s.Next()
	if e != nil {
		s.t.Observe(e)
	}
	return e, err
}
