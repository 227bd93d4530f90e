package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"

	"github.com/gpusharing/gpusharing/test/testenv"
)

// writeCounts counts the API server's answered writes per resource and verb, from its own
// apiserver_request_total: every write of every client (controller, agents, floor), conflicts included.
type writeCounts struct {
	byKind    map[string]float64 // "gpunodes/status PUT"
	conflicts map[string]float64 // the same keys, code 409 only
	cpu       map[string]float64 // serverCPU at the scrape
}

// scrapeWrites reads the API server's request counters.
func scrapeWrites(ctx context.Context, env *testenv.Env) (writeCounts, error) {
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return writeCounts{}, err
	}
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return writeCounts{}, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	w := writeCounts{byKind: map[string]float64{}, conflicts: map[string]float64{}, cpu: serverCPU()}
	s := bufio.NewScanner(bytes.NewReader(raw))
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			continue
		}
		labels := map[string]string{}
		for _, kv := range labelPair.FindAllStringSubmatch(line[:end], -1) {
			labels[kv[1]] = kv[2]
		}
		switch labels["verb"] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY":
		default:
			continue
		}
		key := labels["resource"]
		if labels["subresource"] != "" {
			key += "/" + labels["subresource"]
		}
		key += " " + labels["verb"]
		w.byKind[key] += v
		if labels["code"] == "409" {
			w.conflicts[key] += v
		}
	}
	return w, s.Err()
}

// since is the writes between an earlier scrape and this one, as one line: resource verb count, largest
// first, conflicts in brackets; then the API server's and etcd's CPU over the same span.
func (w writeCounts) since(before writeCounts) string {
	type kv struct {
		k    string
		n, c float64
	}
	var out []kv
	total := 0.0
	for k, n := range w.byKind {
		if d := n - before.byKind[k]; d > 0 {
			out = append(out, kv{k, d, w.conflicts[k] - before.conflicts[k]})
			total += d
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].n > out[j].n || out[i].n == out[j].n && out[i].k < out[j].k })
	parts := make([]string, 0, len(out))
	for _, e := range out {
		p := fmt.Sprintf("%s %.0f", e.k, e.n)
		if e.c > 0 {
			p += fmt.Sprintf(" (%.0f conflicts)", e.c)
		}
		parts = append(parts, p)
	}
	return fmt.Sprintf("%.0f writes: %s; %s", total, strings.Join(parts, ", "), cpuSince(w.cpu, before.cpu, total))
}
