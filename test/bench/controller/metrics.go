package main

import (
	"bufio"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// histograms maps a controller name to its reconcile-time histogram: cumulative counts per upper bound.
type histograms map[string]map[float64]float64

var bucketLine = regexp.MustCompile(`^controller_runtime_reconcile_time_seconds_bucket\{(.*)\} (\S+)$`)
var labelPair = regexp.MustCompile(`(\w+)="([^"]*)"`)

// scrape reads controller-runtime's reconcile-time histogram from the manager's metrics endpoint.
func scrape(url string) (histograms, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	out := histograms{}
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		m := bucketLine.FindStringSubmatch(s.Text())
		if m == nil {
			continue
		}
		var ctrl string
		le := math.Inf(1)
		for _, kv := range labelPair.FindAllStringSubmatch(m[1], -1) {
			switch kv[1] {
			case "controller":
				ctrl = kv[2]
			case "le":
				if kv[2] != "+Inf" {
					le, _ = strconv.ParseFloat(kv[2], 64)
				}
			}
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return nil, fmt.Errorf("parsing %q: %w", s.Text(), err)
		}
		if out[ctrl] == nil {
			out[ctrl] = map[float64]float64{}
		}
		out[ctrl][le] = v
	}
	return out, s.Err()
}

// latency is one controller's reconciles during a step.
type latency struct {
	count    int
	p50, p99 float64
}

// since subtracts an earlier scrape and estimates quantiles by linear interpolation within buckets, as
// Prometheus's histogram_quantile does.
func (h histograms) since(before histograms, ctrl string) latency {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for le, n := range h[ctrl] {
		bs = append(bs, bucket{le, n - before[ctrl][le]})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return latency{}
	}
	total := bs[len(bs)-1].n
	q := func(q float64) float64 {
		rank := q * total
		prevLe, prevN := 0.0, 0.0
		for _, b := range bs {
			if b.n >= rank {
				if math.IsInf(b.le, 1) {
					return prevLe
				}
				if b.n == prevN {
					return b.le
				}
				return prevLe + (b.le-prevLe)*(rank-prevN)/(b.n-prevN)
			}
			prevLe, prevN = b.le, b.n
		}
		return prevLe
	}
	return latency{count: int(total), p50: q(0.50), p99: q(0.99)}
}

// isLeader says whether the manager at url holds the leader election Lease, from controller-runtime's
// leader_election_master_status gauge.
func isLeader(url string) (bool, error) {
	resp, err := http.Get(url)
	if err != nil {
		return false, err
	}
	defer func() { _ = resp.Body.Close() }()
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		if strings.HasPrefix(line, "leader_election_master_status{") && strings.HasSuffix(line, " 1") {
			return true, nil
		}
	}
	return false, s.Err()
}

// activity sums the manager's resolver reconciles so far and its work queues' depth.
func activity(url string) (reconciles, depth float64, err error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		fields := strings.Fields(line)
		if len(fields) != 2 {
			continue
		}
		v, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(line, `controller_runtime_reconcile_total{controller="gpunode-resolver"`):
			reconciles += v
		case strings.HasPrefix(line, "workqueue_depth{"):
			depth += v
		}
	}
	return reconciles, depth, s.Err()
}
