// Command rscheck turns the NVML memory peaks of a workload's runs into the recommendation
// internal/recommend makes from them (each run stands for a pod, a minute apart), for
// test/gpu/rightsize/run.sh. It prints the target and the claim size fitted to the step:
//
//	rscheck -step 536870912 3221225472 3300917248 3221225472
//	target=3661951677 claim=3758096384
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/gpusharing/gpusharing/internal/recommend"
)

func main() {
	step := flag.Int64("step", 512<<20, "The sized GPU's memory step in bytes.")
	flag.Parse()
	cfg := recommend.DefaultConfig()
	w := recommend.NewWorkload(cfg)
	t0 := time.Now()
	for i, a := range flag.Args() {
		v, err := strconv.ParseInt(a, 10, 64)
		if err != nil {
			fmt.Fprintln(os.Stderr, "rscheck: peak", a, "is not a number of bytes")
			os.Exit(2)
		}
		w.ObserveMemory(fmt.Sprintf("run-%d", i), v, t0.Add(time.Duration(i)*time.Minute))
	}
	r, ok := w.Recommend(t0.Add(cfg.MinHistory + time.Duration(flag.NArg())*time.Minute))
	if !ok {
		fmt.Fprintf(os.Stderr, "rscheck: no recommendation from %d peaks (needs %d)\n", flag.NArg(), cfg.MinMemorySamples)
		os.Exit(1)
	}
	fmt.Printf("target=%d claim=%d\n", r.Memory, recommend.Fit(r.Memory, *step, 0, 0, 0))
}
