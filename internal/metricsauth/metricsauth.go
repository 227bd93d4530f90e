// Package metricsauth is how the manager and the agent serve their Prometheus metrics: over HTTPS, to
// callers the API server authenticates (TokenReview of the bearer token) and authorizes
// (SubjectAccessReview: verb get on the non-resource URL /metrics, which the ClusterRole
// gpusharing-metrics-reader grants). The series name every tenant's namespace and pod, so reaching the
// port is not enough to read them.
package metricsauth

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// Each scrape's token is reviewed, and its user's right to get /metrics asked, by the serving component
// itself: its own role creates both reviews (the manager's and the agent's, from these markers).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// The file names a certificate directory holds, as a kubernetes.io/tls Secret mounted there names them.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// ErrNoCertificate says a certificate directory was given without the certificate or the key in it.
var ErrNoCertificate = errors.New("certificate directory lacks " + CertFile + " or " + KeyFile)

// Options are a component's metrics flags.
type Options struct {
	// BindAddress is where the endpoint listens; "0" turns it off.
	BindAddress string
	// Secure serves HTTPS behind authentication and authorization. False serves plain HTTP to whoever
	// reaches the address: only for a loopback bind or a machine of one's own.
	Secure bool
	// CertDir holds tls.crt and tls.key, reloaded when they change (a cert-manager Secret, say). Empty:
	// a self-signed certificate made at start, which scrapers cannot verify (insecure_skip_verify) but
	// which still encrypts the tokens and the series on the wire.
	CertDir string
}

// ServerOptions turns o into controller-runtime's metrics server options. A CertDir without its files
// is an error rather than a silent self-signed certificate.
func ServerOptions(o Options) (metricsserver.Options, error) {
	if !o.Secure {
		return metricsserver.Options{BindAddress: o.BindAddress}, nil
	}
	s := metricsserver.Options{
		BindAddress:    o.BindAddress,
		SecureServing:  true,
		FilterProvider: filters.WithAuthenticationAndAuthorization,
		// HTTP/1.1 only: HTTP/2's stream handling has had denial-of-service flaws (CVE-2023-44487,
		// CVE-2023-39325) that an endpoint open to the pod network need not carry; a scrape gains
		// nothing from HTTP/2.
		TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	}
	if o.CertDir == "" {
		// Made here rather than left to controller-runtime, which would first look for files in a
		// directory under $TMPDIR that nobody configured.
		cert, err := selfSigned()
		if err != nil {
			return metricsserver.Options{}, err
		}
		s.TLSOpts = append(s.TLSOpts, func(c *tls.Config) {
			c.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert, nil }
		})
		return s, nil
	}
	for _, f := range []string{CertFile, KeyFile} {
		if _, err := os.Stat(filepath.Join(o.CertDir, f)); err != nil {
			return metricsserver.Options{}, fmt.Errorf("%w: %w", ErrNoCertificate, err)
		}
	}
	s.CertDir, s.CertName, s.KeyName = o.CertDir, CertFile, KeyFile
	return s, nil
}

// selfSigned makes a certificate for localhost and 127.0.0.1, as controller-runtime's fallback does.
func selfSigned() (*tls.Certificate, error) {
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKeyWithFixtures("localhost", []net.IP{{127, 0, 0, 1}}, nil, "")
	if err != nil {
		return nil, fmt.Errorf("making the metrics endpoint's self-signed certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("loading the metrics endpoint's self-signed certificate: %w", err)
	}
	return &cert, nil
}
