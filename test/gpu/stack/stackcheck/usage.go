package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/test/gpu/smi"
)

const (
	// agentMetrics is the agent's metrics address here: the per-pod series are read from it.
	agentMetrics = "127.0.0.1:19481"
	// accountingInterval is the agent's --accounting-interval here (default 10s): shorter, so the
	// comparison gets its reads within the run's time.
	accountingInterval = 2 * time.Second
	// usageReads is how many times the per-pod series are compared with nvidia-smi.
	usageReads = 12
)

// usageWorkload is one PyTorch pod of the scenario: memory it holds, and the busy part of each second.
type usageWorkload struct {
	name      string
	gib, busy float64
	cmd       *exec.Cmd
	pid       int32
}

// perPodUsage runs two PyTorch processes as two pods on the Exclusive GPU (6 GiB busy all the time, 3
// GiB busy 30% of each second) and compares, read after read, the agent's per-pod series (memory and SM
// utilization, labelled with the pod) with nvidia-smi's per-process view, and the GPUNode's consumers
// with the pods. Memory must agree within 5% on every read; SM utilization in the mean over the reads
// within 10 points (each side samples its own window). The pods' series must leave with the pods.
func (s *stack) perPodUsage(ctx context.Context) {
	s.r.begin("per-pod usage of two PyTorch pods against nvidia-smi")
	work := []*usageWorkload{{name: "usage-a", gib: 6, busy: 1.0}, {name: "usage-b", gib: 3, busy: 0.3}}
	defer func() {
		for _, w := range work {
			if w.cmd != nil && w.cmd.Process != nil {
				_ = w.cmd.Process.Kill()
				_ = w.cmd.Wait()
			}
		}
	}()
	for _, w := range work {
		if !s.r.must("start "+w.name, s.startUsageWorkload(ctx, w)) {
			return
		}
	}
	var memWorst float64
	memOK := 0
	ours, theirs := map[string][]float64{}, map[string][]float64{}
	deadline := time.Now().Add(90 * time.Second)
	for reads := 0; reads < usageReads && time.Now().Before(deadline); {
		time.Sleep(accountingInterval)
		series, err := podSeries(ctx)
		if err != nil {
			continue
		}
		mem, err1 := smi.Memory()
		pmon, err2 := smi.Pmon()
		if err1 != nil || err2 != nil {
			s.r.must("nvidia-smi", fmt.Errorf("%v %v", err1, err2))
			return
		}
		complete := true
		for _, w := range work {
			if _, ok := series[w.name]; !ok {
				complete = false
			}
		}
		if !complete {
			continue // the agent has not named both pods yet
		}
		reads++
		for _, w := range work {
			got := series[w.name]
			d := smi.Rel(got.memory, float64(mem[w.pid]))
			memWorst = math.Max(memWorst, d)
			if d <= 0.05 {
				memOK++
			}
			ours[w.name] = append(ours[w.name], got.sm)
			theirs[w.name] = append(theirs[w.name], pmon[w.pid])
			fmt.Printf("usage %s pid %d: memory %.0f MiB (nvidia-smi %d MiB) sm %.0f%% (pmon %.0f%%)\n",
				w.name, w.pid, got.memory/(1<<20), mem[w.pid]>>20, got.sm, pmon[w.pid])
		}
	}
	n := len(ours[work[0].name])
	s.r.check("metrics: both pods' memory within 5% of nvidia-smi on every read", n >= usageReads/2 && memOK == n*len(work),
		"%d of %d reads, worst %.2f%%", memOK, n*len(work), memWorst*100)
	for _, w := range work {
		a, b := smi.Mean(ours[w.name]), smi.Mean(theirs[w.name])
		s.r.check("metrics: "+w.name+"'s mean SM utilization within 10 points of pmon", n > 0 && math.Abs(a-b) <= 10,
			"ours %.1f%%, pmon %.1f%% over %d reads", a, b, n)
	}
	_, g := s.gpuNode(ctx)
	listed := map[string]bool{}
	if g != nil && g.Usage != nil {
		for _, c := range g.Usage.Consumers {
			if c.Namespace == podNamespace {
				listed[c.Pod] = true
			}
		}
	}
	s.r.check("status: the GPU's consumers name both pods", listed["usage-a"] && listed["usage-b"], "%s", jsonOf(usageOf(g)))

	for _, w := range work {
		_ = w.cmd.Process.Kill()
		_ = w.cmd.Wait()
		_ = s.podEnded(ctx, w.name)
	}
	_, err := waitFor(ctx, 30*time.Second, 500*time.Millisecond, func() bool {
		series, err := podSeries(ctx)
		return err == nil && len(series) == 0
	}, time.Now())
	s.r.check("metrics: the pods' series leave with them", err == nil, "%v", err)
}

func usageOf(g *v1alpha1.GPUStatus) *v1alpha1.GPUUsage {
	if g == nil {
		return nil
	}
	return g.Usage
}

// startUsageWorkload creates the pod in the API (Running, its container's id in status, as a kubelet
// reports it), starts its process, and makes the process its container's for the agent (inPod).
func (s *stack) startUsageWorkload(ctx context.Context, w *usageWorkload) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: podNamespace, Name: w.name},
		Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "main", Image: "local/cuda-workload:1"}}},
	}
	if err := s.c.Create(ctx, pod); err != nil {
		return err
	}
	if err := s.podRunning(ctx, pod); err != nil {
		return err
	}
	w.cmd = exec.CommandContext(ctx, s.o.python, filepath.Join(s.o.repo, "test/gpu/accounting/workload.py"),
		strconv.FormatFloat(w.gib, 'f', -1, 64), strconv.FormatFloat(w.busy, 'f', -1, 64))
	w.cmd.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES="+strconv.Itoa(s.o.gpuIndex), "PYTHONUNBUFFERED=1")
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	w.cmd.Stderr = os.Stderr
	if err := w.cmd.Start(); err != nil {
		return err
	}
	w.pid = int32(w.cmd.Process.Pid)
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "ready" {
				ready <- nil
				_, _ = io.Copy(io.Discard, out)
				return
			}
		}
		ready <- fmt.Errorf("%s exited before it was ready", w.name)
	}()
	select {
	case err := <-ready:
		if err != nil {
			return err
		}
	case <-time.After(120 * time.Second):
		return fmt.Errorf("%s not ready after 120s", w.name)
	}
	return s.inPod(pod, int(w.pid))
}

// podFigures are one pod's per-pod series on this GPU.
type podFigures struct{ memory, sm float64 }

var seriesLine = regexp.MustCompile(`^(gpusharing_pod_gpu_memory_used_bytes|gpusharing_pod_gpu_sm_utilization_percent)\{([^}]*)\} (\S+)$`)
var labelPair = regexp.MustCompile(`(\w+)="([^"]*)"`)

// podSeries reads the agent's per-pod memory and SM series for pods of podNamespace, by pod name.
func podSeries(ctx context.Context) (map[string]podFigures, error) {
	text, err := agentMetricsText(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]podFigures{}
	eachSample(text, seriesLine, func(name string, labels map[string]string, v float64) {
		if labels["namespace"] != podNamespace {
			return
		}
		f := out[labels["pod"]]
		if name == "gpusharing_pod_gpu_memory_used_bytes" {
			f.memory += v
		} else {
			f.sm += v
		}
		out[labels["pod"]] = f
	})
	return out, nil
}

// agentMetricsText reads the agent's metrics page.
func agentMetricsText(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+agentMetrics+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// eachSample calls each for every sample of a metrics page whose line matches series (groups: the name,
// the labels, the value).
func eachSample(text string, series *regexp.Regexp, each func(name string, labels map[string]string, v float64)) {
	for _, line := range strings.Split(text, "\n") {
		m := series.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, kv := range labelPair.FindAllStringSubmatch(m[2], -1) {
			labels[kv[1]] = kv[2]
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		each(m[1], labels, v)
	}
}
