package trace

import (
	"bytes"
	"reflect"
	"testing"
)

func ev(kind Kind, typ, name string, mstx uint64) Event {
	return Event{Kind: kind, Type: typ, Name: name, MstxID: mstx}
}

func observeAll(t *StepTracker, evs []Event) (steps, ended []int) {
	for i := range evs {
		t.Observe(&evs[i])
		steps = append(steps, evs[i].Step)
		ended = append(ended, t.Ended())
	}
	return steps, ended
}

func TestStepTrackerStepCalls(t *testing.T) {
	evs := []Event{
		ev(KindSystem, TypeStart, "", 0),
		ev(KindMalloc, TypeHost, "", 0),
		ev(KindSystem, TypeStep, "", 0), // ends step 1
		ev(KindMalloc, TypeHost, "", 0),
		ev(KindMstx, TypeRangeStart, StepRangeMessage, 1), // ignored: step() is the source
		ev(KindMstx, TypeRangeEnd, StepRangeMessage, 1),
		ev(KindSystem, TypeStep, "", 0), // ends step 2
		ev(KindSystem, TypeStep, "", 0), // ends step 3
		ev(KindFree, TypeHost, "", 0),
	}
	if !HasStepCalls(evs) {
		t.Fatal("HasStepCalls = false")
	}
	tr := &StepTracker{UseStepCalls: true}
	if tr.Current() != 1 {
		t.Errorf("Current before any event = %d", tr.Current())
	}
	steps, ended := observeAll(tr, evs)
	if want := []int{1, 1, 1, 2, 2, 2, 2, 3, 4}; !reflect.DeepEqual(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}
	if want := []int{0, 0, 1, 0, 0, 0, 2, 3, 0}; !reflect.DeepEqual(ended, want) {
		t.Errorf("ended %v, want %v", ended, want)
	}
	if tr.Current() != 4 || tr.Steps() != 4 {
		t.Errorf("Current %d Steps %d", tr.Current(), tr.Steps())
	}
}

func TestStepTrackerMstx(t *testing.T) {
	evs := []Event{
		ev(KindSystem, TypeStart, "", 0),
		ev(KindMstx, TypeRangeStart, StepRangeMessage, 10), // opens step 1
		ev(KindMalloc, TypeHost, "", 0),
		ev(KindMstx, TypeRangeStart, "other", 11),
		ev(KindMstx, TypeRangeEnd, "", 11),
		ev(KindMstx, TypeRangeEnd, "", 10), // closes step 1
		ev(KindMalloc, TypeHost, "", 0),
		ev(KindMstx, TypeRangeStart, "step start ", 12),    // not the step message
		ev(KindMstx, TypeRangeStart, StepRangeMessage, 13), // opens step 2
		ev(KindMstx, TypeMark, StepRangeMessage, 14),
		ev(KindMstx, TypeRangeEnd, StepRangeMessage, 13), // closes step 2
		ev(KindMstx, TypeRangeEnd, "", 12),
		ev(KindMstx, TypeRangeStart, StepRangeMessage, 15), // step 3
		ev(KindFree, TypeHost, "", 0),
	}
	if HasStepCalls(evs) {
		t.Fatal("HasStepCalls = true")
	}
	tr := &StepTracker{}
	if tr.Current() != 0 {
		t.Errorf("Current before any event = %d", tr.Current())
	}
	steps, ended := observeAll(tr, evs)
	if want := []int{0, 1, 1, 1, 1, 1, 0, 0, 2, 2, 2, 0, 3, 3}; !reflect.DeepEqual(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}
	if want := []int{0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 2, 0, 0, 0}; !reflect.DeepEqual(ended, want) {
		t.Errorf("ended %v, want %v", ended, want)
	}
	if tr.Current() != 3 || tr.Steps() != 3 {
		t.Errorf("Current %d Steps %d", tr.Current(), tr.Steps())
	}
}

func TestStepTrackerOverlappingRanges(t *testing.T) {
	evs := []Event{
		ev(KindMstx, TypeRangeStart, StepRangeMessage, 1), // step 1
		ev(KindMstx, TypeRangeStart, StepRangeMessage, 2), // step 2 opens inside 1
		ev(KindMstx, TypeRangeEnd, "", 1),                 // closes 1; still in 2
		ev(KindMalloc, TypeHost, "", 0),
		ev(KindMstx, TypeRangeEnd, "", 2),
		ev(KindMalloc, TypeHost, "", 0),
	}
	steps, _ := observeAll(&StepTracker{}, evs)
	if want := []int{1, 2, 1, 2, 2, 0}; !reflect.DeepEqual(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}
}

func TestWithStepsAndScan(t *testing.T) {
	evs := []Event{ev(KindSystem, TypeStart, "", 0), ev(KindSystem, TypeStep, "", 0), ev(KindSystem, TypeStop, "", 0)}
	data := writeCSV(t, evs)
	r, err := newCSVReader(bytes.NewReader(data), "steps.csv")
	if err != nil {
		t.Fatal(err)
	}
	has, err := ScanStepCalls(r)
	if err != nil || !has {
		t.Fatalf("ScanStepCalls = %v, %v", has, err)
	}
	r, _ = newCSVReader(bytes.NewReader(data), "steps.csv")
	s := WithSteps(r, &StepTracker{UseStepCalls: has})
	var steps []int
	for {
		e, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if e == nil {
			break
		}
		steps = append(steps, e.Step)
	}
	if want := []int{1, 1, 2}; !reflect.DeepEqual(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}
}
