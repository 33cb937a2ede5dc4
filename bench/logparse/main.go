// Command logparse times the parallel parse of a rotating capture's logs
// (make bench, SPEC §7): events/s with 1 and with 2 goroutines, and the
// logs' bytes per event.
package main

import (
	"fmt"
	"os"
	"time"

	"msmemscope/analyzer"
	"msmemscope/spool"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: logparse CAPTURE_DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	var bytes int64
	for _, f := range spool.LogFiles(dir) {
		if fi, err := os.Stat(f); err == nil {
			bytes += fi.Size()
		}
	}
	rates := map[int]float64{}
	var events uint64
	for _, workers := range []int{1, 2, 1, 2, 1, 2, 1, 2} { // alternate, keep the best of four
		t0 := time.Now()
		st, err := analyzer.ParseLogs(dir, 100, workers)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		r := float64(st.Events) / time.Since(t0).Seconds()
		if r > rates[workers] {
			rates[workers] = r
		}
		events = st.Events
	}
	fmt.Printf("files %d events %d bytes_per_event %.2f rate1 %.0f rate2 %.0f speedup %.2f\n",
		len(spool.LogFiles(dir)), events, float64(bytes)/float64(events), rates[1], rates[2], rates[2]/rates[1])
}
