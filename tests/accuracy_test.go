package tests

import (
	"path/filepath"
	"slices"
	"testing"
)

// hostTotalsOf reads a traced process's dump and returns its HOST totals.
func hostTotalsOf(t *testing.T, p *processInfo) heapTotals {
	t.Helper()
	if p.Dump != dumpOf(t, p.Folder) {
		t.Errorf("manifest names dump %s, the folder holds %s", p.Dump, dumpOf(t, p.Folder))
	}
	return hostTotals(t, readDump(t, p.Dump))
}

// orderSettled checks config.json's accounts: every recorded event is a row
// or counted with its reason, and the merge of the threads' events left
// nothing unpaired (ambiguities are logged: stamps a few hundred ns apart).
func orderSettled(t *testing.T, folder string) {
	t.Helper()
	c := readConfig(t, folder)
	var notWritten uint64
	for _, n := range c.EventsNotWritten {
		notWritten += n
	}
	if c.EventsRecorded != c.EventsWritten+*c.EventsLost+notWritten {
		t.Errorf("config.json: events_recorded %d != events_written %d + events_lost %d + events_not_written %v",
			c.EventsRecorded, c.EventsWritten, *c.EventsLost, c.EventsNotWritten)
	}
	if c.Order.UnpairedFrees != 0 || c.Order.LostFrees != 0 {
		t.Errorf("config.json order: %+v, want no unpaired or lost FREEs", c.Order)
	}
	t.Logf("order: %+v", c.Order)
}

func sameTotals(t *testing.T, what string, got, want heapTotals) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\n msmemscope: %v\n valgrind:   %v", what, got, want)
	} else {
		t.Logf("%s: %v (both)", what, got)
	}
}

// TestAccuracyVsValgrind: for each program the HOST totals of the dump --
// allocations, frees, bytes allocated, blocks and bytes in use at exit -- equal
// valgrind's heap summary for the same binary (SPEC §4.1), with no tolerance.
func TestAccuracyVsValgrind(t *testing.T) {
	needBuild(t)
	cases := []struct {
		name, src string
		flags     []string
	}{
		{"single", "single.c", nil},
		{"allocfns", "allocfns.c", nil},
		{"threads8x100k", "threads.c", []string{"-pthread"}},
		{"cxx_new_delete", "newdelete.cpp", nil},
		// Threads freeing each other's blocks: a queue from one to another,
		// and a pool of 8 that free at random (SPEC §2.1's order).
		{"handoff_1M", "handoff.c", []string{"-pthread"}},
		{"pool8_random", "pool.c", []string{"-pthread"}},
		// Threads ending after allocating through libc's wrappers.
		{"wrapper_threads", "wrapthreads.c", []string{"-pthread"}},
		// Not PIE, malloc called through its address (CPython's way).
		{"nopie_malloc_address", "nopie.c", []string{"-no-pie", "-fno-pie"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bin := compile(t, c.src, "", c.flags...)
			out := filepath.Join(t.TempDir(), "out")
			r := mustRun(t, 0, out, bin)
			m := readManifest(t, out)
			if len(m.Processes) != 1 {
				t.Fatalf("want 1 traced process, manifest lists %d", len(m.Processes))
			}
			got := hostTotalsOf(t, m.main(t))
			orderSettled(t, m.main(t).Folder)
			root, vg, vgOut := valgrindHeap(t, false, bin)
			if len(vg) != 1 {
				t.Fatalf("valgrind printed %d summaries, want 1", len(vg))
			}
			// threads.c prints its TLS module count: the pads must match it.
			if r.Stdout != vgOut {
				t.Errorf("the program printed %q under msmemscope, %q under valgrind", r.Stdout, vgOut)
			}
			sameTotals(t, c.name, got, vg[root])
		})
	}

	// A forked child allocates and exits: it is not traced (SPEC §4.5), so the
	// dump matches the parent's own summary, and config.json counts the child.
	t.Run("fork_child", func(t *testing.T) {
		bin := compile(t, "forkchild.c", "")
		out := filepath.Join(t.TempDir(), "out")
		mustRun(t, 0, out, bin)
		m := readManifest(t, out)
		if len(m.Processes) != 1 {
			t.Fatalf("the forked child must not be traced: manifest lists %d processes", len(m.Processes))
		}
		mp := m.main(t)
		if c := readConfig(t, mp.Folder); *c.ForkedChildrenUntraced != 1 {
			t.Errorf("config.json forked_children_untraced = %d, want 1", *c.ForkedChildrenUntraced)
		}
		if mp.ForkedUntraced != 1 {
			t.Errorf("manifest forked_children_untraced = %d, want 1", mp.ForkedUntraced)
		}
		got := hostTotalsOf(t, mp)
		root, vg, _ := valgrindHeap(t, false, bin)
		if len(vg) != 2 {
			t.Fatalf("valgrind printed %d summaries, want 2 (parent and child)", len(vg))
		}
		sameTotals(t, "parent", got, vg[root])
		for pid, s := range vg {
			if pid != root && s.Allocs <= vg[root].Allocs {
				t.Errorf("valgrind's child summary (%v) should show the child's own 500 allocations", s)
			}
		}
	})

	// fork + exec of another test program: both images are traced, each into
	// its own folder, and each matches valgrind --trace-children=yes for its
	// pid.
	t.Run("fork_exec", func(t *testing.T) {
		bin := compile(t, "execchild.c", "")
		child := compile(t, "single.c", "")
		out := filepath.Join(t.TempDir(), "out")
		mustRun(t, 0, out, bin, child, "x")
		m := readManifest(t, out)
		if len(m.Processes) != 2 {
			t.Fatalf("want 2 traced processes (parent and exec'd child), manifest lists %d", len(m.Processes))
		}
		mp := m.main(t)
		if !slices.Equal(mp.Cmdline, []string{bin, child, "x"}) {
			t.Errorf("main process cmdline %q", mp.Cmdline)
		}
		var cp *processInfo
		for i := range m.Processes {
			if !m.Processes[i].Main {
				cp = &m.Processes[i]
			}
		}
		if cp == nil || cp.Ppid != mp.Pid || !slices.Equal(cp.Cmdline, []string{child, "x"}) {
			t.Fatalf("manifest lacks the exec'd child %s x with parent %d: %+v", child, mp.Pid, m.Processes)
		}
		if !mp.Complete || !cp.Complete {
			t.Errorf("both captures must be complete: parent %v, child %v", mp.Complete, cp.Complete)
		}
		if c := readConfig(t, mp.Folder); *c.ForkedChildrenUntraced != 0 {
			t.Errorf("the child exec'd, so it was traced: forked_children_untraced = %d, want 0", *c.ForkedChildrenUntraced)
		}
		gotParent, gotChild := hostTotalsOf(t, mp), hostTotalsOf(t, cp)
		root, vg, _ := valgrindHeap(t, true, bin, child, "x")
		if len(vg) != 2 {
			t.Fatalf("valgrind printed %d summaries, want 2 (parent and exec'd image)", len(vg))
		}
		sameTotals(t, "parent", gotParent, vg[root])
		for _, pid := range sortedKeys(vg) {
			if pid != root {
				sameTotals(t, "exec'd child", gotChild, vg[pid])
			}
		}
	})
}
