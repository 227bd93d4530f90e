//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// metricsScraper is a service account bound to the ClusterRole gpusharing-metrics-reader that config/default
// installs: what a Prometheus in the cluster scrapes the manager and the agents with.
const metricsScraper = `apiVersion: v1
kind: ServiceAccount
metadata: {name: metrics-scraper, namespace: ` + Namespace + `}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: e2e-metrics-scraper}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: gpusharing-metrics-reader}
subjects: [{kind: ServiceAccount, name: metrics-scraper, namespace: ` + Namespace + `}]
`

// metricsToken returns a token of the metrics scraper (created for the scenario): the metrics endpoints
// serve HTTPS only to callers the API server authenticates and allows to get /metrics.
func metricsToken(t *testing.T) string {
	t.Helper()
	ensureNamespace(t)
	applyYAML(t, metricsScraper)
	// The binding is cluster-wide and outlives the namespace: it goes with the scenario.
	t.Cleanup(func() { _, _ = kubectlErr("delete", "clusterrolebinding", "e2e-metrics-scraper", "--ignore-not-found") })
	return strings.TrimSpace(kubectl(t, "-n", Namespace, "create", "token", "metrics-scraper", "--duration=2h"))
}

// metricsTokenFile writes metricsToken into a file, for Prometheus's authorization.credentials_file.
func metricsTokenFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	must(t, writeFile(path, metricsToken(t)))
	return path
}

// scrapeMetrics GETs an HTTPS metrics endpoint on this node with token as bearer. The endpoints'
// certificates are self-signed (no --metrics-cert-dir), so they are not verified.
func scrapeMetrics(ctx context.Context, url, token string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return string(body), nil
}
