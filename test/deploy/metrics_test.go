package deploy

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"sigs.k8s.io/yaml"

	"github.com/gpusharing/gpusharing/internal/metricsauth"
	"github.com/gpusharing/gpusharing/test/prom"
	"github.com/gpusharing/gpusharing/test/wait"
)

// scrapers is the namespace of the test's scraping service accounts: reader is bound to
// gpusharing-metrics-reader, stranger to nothing.
const scrapers = "metrics-scrapers"

// scraperTokens creates the two service accounts (once per API server) and returns a token of each, as
// a pod's projected token or `kubectl create token` would carry it.
func scraperTokens(t *testing.T) (reader, stranger string) {
	t.Helper()
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	create := func(err error) {
		t.Helper()
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: scrapers}}, metav1.CreateOptions{})
	create(err)
	for _, name := range []string{"reader", "stranger"} {
		_, err = cs.CoreV1().ServiceAccounts(scrapers).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		create(err)
	}
	_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-scrapers-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "gpusharing-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "reader", Namespace: scrapers}},
	}, metav1.CreateOptions{})
	create(err)
	token := func(name string) string {
		t.Helper()
		tr, err := cs.CoreV1().ServiceAccounts(scrapers).CreateToken(ctx, name, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	return token("reader"), token("stranger")
}

// serveMetrics runs the metrics endpoint both binaries run (internal/metricsauth's options on
// controller-runtime's server) with cfg's identity, on a free loopback port, until the test ends, and
// returns its address.
func serveMetrics(t *testing.T, cfg *rest.Config, o metricsauth.Options) string {
	t.Helper()
	o.BindAddress = "127.0.0.1:0"
	opts, err := metricsauth.ServerOptions(o)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := metricsserver.NewServer(opts, cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("metrics server: %v", err)
		}
	})
	bound, ok := srv.(interface{ GetBindAddr() string })
	if !ok {
		t.Fatalf("controller-runtime's metrics server %T does not tell its address", srv)
	}
	var addr string
	wait.UntilState(t, 10*time.Second, func() (bool, string) {
		addr = bound.GetBindAddr()
		return addr != "", "not listening"
	}, "the metrics endpoint listening")
	return addr
}

// scrapeAs GETs url with token as bearer (none when empty) and returns the status and body.
func scrapeAs(t *testing.T, url, token string) (int, string) {
	t.Helper()
	code, body, err := get(url, token)
	if err != nil {
		t.Fatal(err)
	}
	return code, body
}

// get is scrapeAs returning the error.
func get(url, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// The endpoint's certificate is self-signed; what is checked here is who may read, not the certificate.
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// Each component's metrics endpoint, running with nothing but its service account's role from
// config/default, answers a scrape without a token 401, a token whose user lacks the metrics-reader role
// 403, and a token bound to gpusharing-metrics-reader 200 with the series. A token the API server does
// not accept is refused too (controller-runtime's filter answers it 500, from the review's error); over
// plain HTTP nothing is served.
func TestMetricsEndpointsServeOnlyTheMetricsReader(t *testing.T) {
	install(t)
	reader, stranger := scraperTokens(t)
	for component, account := range map[string]string{"manager": managerAccount, "agent": agentAccount} {
		t.Run(component, func(t *testing.T) {
			url := "https://" + serveMetrics(t, as(account), metricsauth.Options{Secure: true}) + "/metrics"
			// want 0: refused, whatever the status.
			for _, c := range []struct {
				who, token string
				want       int
			}{
				{"no token", "", http.StatusUnauthorized},
				{"a token that is not one", "not-a-token", 0},
				{"a service account without the metrics-reader role", stranger, http.StatusForbidden},
				{"a service account bound to gpusharing-metrics-reader", reader, http.StatusOK},
			} {
				code, body := scrapeAs(t, url, c.token)
				if c.want == 0 && code < http.StatusBadRequest {
					t.Errorf("%s: status %d, want a refusal: %s", c.who, code, strings.TrimSpace(body))
				}
				if c.want != 0 && code != c.want {
					t.Errorf("%s: status %d, want %d: %s", c.who, code, c.want, strings.TrimSpace(body))
				}
				if served := strings.Contains(body, "# TYPE "); served != (c.want == http.StatusOK) {
					t.Errorf("%s: series served %v, want %v", c.who, served, c.want == http.StatusOK)
				}
			}
			if code, body, err := get(strings.Replace(url, "https://", "http://", 1), reader); err == nil && (code == http.StatusOK || strings.Contains(body, "# TYPE ")) {
				t.Errorf("a plain HTTP scrape was served (status %d): the endpoint must speak only TLS", code)
			}
		})
	}
}

// The reviews are the component's own calls: an identity without the generated role's tokenreviews and
// subjectaccessreviews create cannot tell the reader from anyone, and serves nobody.
func TestMetricsEndpointWithoutTheReviewRightsServesNobody(t *testing.T) {
	install(t)
	reader, _ := scraperTokens(t)
	url := "https://" + serveMetrics(t, as("system:serviceaccount:"+scrapers+":stranger"), metricsauth.Options{Secure: true}) + "/metrics"
	if code, body := scrapeAs(t, url, reader); code == http.StatusOK || strings.Contains(body, "# TYPE ") {
		t.Errorf("served the reader (status %d) although the endpoint may not review tokens", code)
	}
}

// shippedJobs reads config/prometheus/scrape.yaml's jobs, by job name.
func shippedJobs(t *testing.T) map[string]map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(env.RepoRoot, "config", "prometheus", "scrape.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []map[string]any `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for _, j := range cfg.ScrapeConfigs {
		out[fmt.Sprint(j["job_name"])] = j
	}
	return out
}

// staticJob is a shipped job renamed name, scraping addr with the token in tokenFile: Kubernetes discovery
// and its relabelling give way to a static target; scheme, TLS and authorization stay as shipped.
func staticJob(t *testing.T, job map[string]any, name, addr, tokenFile string) map[string]any {
	t.Helper()
	out := map[string]any{}
	for k, v := range job {
		out[k] = v
	}
	if _, ok := out["kubernetes_sd_configs"]; !ok {
		t.Fatalf("job %v has no kubernetes_sd_configs", job["job_name"])
	}
	delete(out, "kubernetes_sd_configs")
	delete(out, "relabel_configs")
	auth, ok := out["authorization"].(map[string]any)
	if !ok || auth["credentials_file"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
		t.Fatalf("job %v does not scrape with Prometheus's service account token: %v", job["job_name"], out["authorization"])
	}
	out["authorization"] = map[string]any{"credentials_file": tokenFile}
	out["job_name"] = name
	out["static_configs"] = []any{map[string]any{"targets": []string{addr}}}
	return out
}

// A real Prometheus (Debian's package) scrapes each component's endpoint with config/prometheus/scrape.yaml's
// job for it (the chart's ServiceMonitors say the same: HTTPS, the self-signed certificate accepted, the
// service account's token): with the reader's token the targets are up and their series stored; with the
// stranger's the target is down.
func TestPrometheusScrapesTheEndpointsWithTheShippedJobsAndAReaderToken(t *testing.T) {
	if prom.Binary() == "" {
		t.Skip("prometheus is not installed (apt-get install prometheus)")
	}
	install(t)
	reader, stranger := scraperTokens(t)
	dir := t.TempDir()
	tokenFile := func(name, token string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(token), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	readerFile, strangerFile := tokenFile("reader", reader), tokenFile("stranger", stranger)
	jobs := shippedJobs(t)
	managerAddr := serveMetrics(t, as(managerAccount), metricsauth.Options{Secure: true})
	agentAddr := serveMetrics(t, as(agentAccount), metricsauth.Options{Secure: true})
	p := prom.StartJobs(t,
		staticJob(t, jobs["gpusharing-manager"], "manager", managerAddr, readerFile),
		staticJob(t, jobs["gpusharing-agent"], "agent", agentAddr, readerFile),
		staticJob(t, jobs["gpusharing-manager"], "stranger", managerAddr, strangerFile),
	)
	wait.UntilState(t, 60*time.Second, func() (bool, string) {
		up := map[string]string{}
		res, err := p.Query("up")
		if err != nil {
			return false, err.Error()
		}
		for _, s := range res {
			up[s.Metric["job"]] = fmt.Sprint(s.Value[1])
		}
		return up["manager"] == "1" && up["agent"] == "1" && up["stranger"] == "0", fmt.Sprintf("up by job: %v", up)
	}, "the reader's scrapes up and the stranger's down")
	for _, job := range []string{"manager", "agent"} {
		if res, err := p.Query(`rest_client_requests_total{job="` + job + `"}`); err != nil || len(res) == 0 {
			t.Errorf("Prometheus holds no series of job %s, scraped with the reader's token (%v)", job, err)
		}
	}
}
