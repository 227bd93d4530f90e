package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/testenv"
)

// writeCounts counts the API server's answered writes per resource and verb, from its own
// apiserver_request_total: every write of every client (controller, agents, floor), conflicts included.
// It also counts the reads and the watch events sent, which cost the server CPU without being writes: a
// step whose CPU per write differs from its floor's shows there where the difference comes from.
type writeCounts struct {
	byKind    map[string]float64 // "gpunodes/status PUT"
	conflicts map[string]float64 // the same keys, code 409 only
	reads     map[string]float64 // "gpunodes LIST", "gpunodes WATCH" (watches opened), ...
	events    map[string]float64 // watch events sent, per kind: "GPUNode"; with "GPUNode bytes"
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
	w := writeCounts{byKind: map[string]float64{}, conflicts: map[string]float64{}, reads: map[string]float64{},
		events: map[string]float64{}, cpu: serverCPU()}
	s := bufio.NewScanner(bytes.NewReader(raw))
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		name, labels, v, ok := parseSample(line)
		if !ok {
			continue
		}
		switch name {
		case "apiserver_watch_events_total":
			w.events[watchKind(labels)] += v
			continue
		case "apiserver_watch_events_sizes_sum":
			w.events[watchKind(labels)+" bytes"] += v
			continue
		case "apiserver_request_total":
		default:
			continue
		}
		key := labels["resource"]
		if labels["subresource"] != "" {
			key += "/" + labels["subresource"]
		}
		key += " " + labels["verb"]
		switch labels["verb"] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY":
		default:
			w.reads[key] += v
			continue
		}
		w.byKind[key] += v
		if labels["code"] == "409" {
			w.conflicts[key] += v
		}
	}
	return w, s.Err()
}

// watchKind names the kind a watch metric counts: the label is "kind" in older API servers, "resource"
// in newer ones.
func watchKind(labels map[string]string) string {
	if k := labels["kind"]; k != "" {
		return k
	}
	return labels["resource"]
}

// parseSample splits one line of the Prometheus text format into its name, labels and value.
func parseSample(line string) (string, map[string]string, float64, bool) {
	open := strings.IndexByte(line, '{')
	end := strings.LastIndexByte(line, '}')
	if open < 0 || end < open {
		return "", nil, 0, false
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
	if err != nil {
		return "", nil, 0, false
	}
	labels := map[string]string{}
	for _, kv := range labelPair.FindAllStringSubmatch(line[open:end], -1) {
		labels[kv[1]] = kv[2]
	}
	return line[:open], labels, v, true
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
	return fmt.Sprintf("%.0f writes: %s; %s; reads: %s; watch events sent: %s", total, strings.Join(parts, ", "),
		cpuSince(w.cpu, before.cpu, total), deltas(w.reads, before.reads), deltas(w.events, before.events))
}

// deltas is after - before per key, largest first, as "key n" pairs.
func deltas(after, before map[string]float64) string {
	type kv struct {
		k string
		n float64
	}
	var out []kv
	for k, n := range after {
		if d := n - before[k]; d > 0 {
			out = append(out, kv{k, d})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].n > out[j].n || out[i].n == out[j].n && out[i].k < out[j].k })
	parts := make([]string, 0, len(out))
	for _, e := range out {
		parts = append(parts, fmt.Sprintf("%s %.0f", e.k, e.n))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// objectSize is the size of one GPUNode as the API server stores and sends it, with its parts: the
// cost of every write and watch event grows with it, so a step that leaves larger objects than its
// floor pays for that on every write.
func objectSize(ctx context.Context, env *testenv.Env) string {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1.GroupVersion.WithKind("GPUNode"))
	if err := env.Client.Get(ctx, client.ObjectKey{Name: nodeName(0)}, u); err != nil {
		return fmt.Sprintf("GPUNode %s: %v", nodeName(0), err)
	}
	size := func(v any) int {
		b, _ := json.Marshal(v)
		return len(b)
	}
	return fmt.Sprintf("GPUNode %s: %d bytes (managedFields %d, spec %d, status %d)", nodeName(0), size(u.Object),
		size(u.Object["metadata"].(map[string]any)["managedFields"]), size(u.Object["spec"]), size(u.Object["status"]))
}
