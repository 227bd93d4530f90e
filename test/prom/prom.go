// Package prom runs a real Prometheus (Debian's prometheus package) for tests: on loopback only, with a
// generated configuration scraping the given targets, its data in the test's temporary directory, and
// stopped when the test ends. Queries go through its HTTP API, so a dashboard's or an alert's query is
// parsed and evaluated exactly as a user's Prometheus would.
package prom

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// Binary is the prometheus executable, or "" where it is not installed.
func Binary() string {
	p, err := exec.LookPath("prometheus")
	if err != nil {
		return ""
	}
	return p
}

// Target is one scrape job.
type Target struct {
	Job string
	// Addr is host:port; Path the metrics path (default /metrics).
	Addr, Path string
	// HTTPS scrapes over TLS, accepting any certificate (the endpoints' self-signed ones), with the
	// bearer token in TokenFile when it is set: the authenticated scrape the manager and the agent serve.
	HTTPS     bool
	TokenFile string
}

// Server is a running Prometheus.
type Server struct {
	URL string
}

// Start runs Prometheus scraping targets every second until the test ends.
func Start(t *testing.T, targets ...Target) *Server {
	t.Helper()
	var jobs []map[string]any
	for _, tg := range targets {
		path := tg.Path
		if path == "" {
			path = "/metrics"
		}
		job := map[string]any{"job_name": tg.Job, "metrics_path": path, "static_configs": []any{map[string]any{"targets": []string{tg.Addr}}}}
		if tg.HTTPS {
			job["scheme"] = "https"
			job["tls_config"] = map[string]any{"insecure_skip_verify": true}
		}
		if tg.TokenFile != "" {
			job["authorization"] = map[string]any{"credentials_file": tg.TokenFile}
		}
		jobs = append(jobs, job)
	}
	return StartJobs(t, jobs...)
}

// StartJobs runs Prometheus with these scrape configs (as Prometheus's configuration file spells them),
// each scraped every second, until the test ends.
func StartJobs(t *testing.T, jobs ...map[string]any) *Server {
	t.Helper()
	bin := Binary()
	if bin == "" {
		t.Skip("prometheus is not installed (apt-get install prometheus)")
	}
	dir := t.TempDir()
	cfg, err := yaml.Marshal(map[string]any{
		"global":         map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s"},
		"scrape_configs": jobs,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeLoopback(t)
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("prometheus log:\n%s", b)
		}
	})
	s := &Server{URL: "http://" + addr}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		if resp, err := http.Get(s.URL + "/-/ready"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("prometheus at %s did not become ready", addr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// freeLoopback returns a loopback address with a port no one listens on now.
func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// Sample is one series of an instant query's result.
type Sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// Query evaluates expr now; an error carries Prometheus's own message (a parse error, say).
func (s *Server) Query(expr string) ([]Sample, error) {
	resp, err := http.Get(s.URL + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	var body struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
		Data      struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("decoding the answer to %q: %w", expr, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("%s: %s", body.ErrorType, body.Error)
	}
	if body.Data.ResultType != "vector" {
		return nil, fmt.Errorf("result type %s, want vector", body.Data.ResultType)
	}
	var out []Sample
	if err := json.Unmarshal(body.Data.Result, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// TargetsUp waits until every target is scraped successfully.
func (s *Server) TargetsUp(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		res, err := s.Query("up == 0 or absent(up)")
		if err == nil && len(res) == 0 {
			all, err := s.Query("up")
			if err == nil && len(all) > 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("targets not up after %s: %v %v", timeout, res, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
