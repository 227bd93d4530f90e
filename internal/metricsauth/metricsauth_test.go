package metricsauth

import (
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// tlsConfig applies the options' TLS settings as controller-runtime's server does.
func tlsConfig(t *testing.T, o Options) *tls.Config {
	t.Helper()
	s, err := ServerOptions(o)
	if err != nil {
		t.Fatal(err)
	}
	c := &tls.Config{NextProtos: []string{"h2"}}
	for _, f := range s.TLSOpts {
		f(c)
	}
	return c
}

func TestSecureServesHTTPSBehindTheAPIServersReviews(t *testing.T) {
	s, err := ServerOptions(Options{BindAddress: ":8443", Secure: true})
	if err != nil {
		t.Fatal(err)
	}
	if !s.SecureServing || s.FilterProvider == nil || s.BindAddress != ":8443" {
		t.Errorf("secure options %+v: want HTTPS with the authentication and authorization filter on :8443", s)
	}
	c := tlsConfig(t, Options{Secure: true})
	if !slices.Equal(c.NextProtos, []string{"http/1.1"}) {
		t.Errorf("NextProtos %v: want HTTP/1.1 only", c.NextProtos)
	}
	if c.GetCertificate == nil {
		t.Fatal("no certificate without a certificate directory: want a self-signed one")
	}
	cert, err := c.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil || cert == nil || cert.Leaf == nil && len(cert.Certificate) == 0 {
		t.Errorf("self-signed certificate %v, %v", cert, err)
	}
}

func TestPlainServesHTTPWithoutFilter(t *testing.T) {
	s, err := ServerOptions(Options{BindAddress: "127.0.0.1:8080"})
	if err != nil {
		t.Fatal(err)
	}
	if s.SecureServing || s.FilterProvider != nil || len(s.TLSOpts) != 0 || s.BindAddress != "127.0.0.1:8080" {
		t.Errorf("plain options %+v: want plain HTTP on 127.0.0.1:8080 with no filter", s)
	}
}

func TestCertDirWithoutItsFilesIsAnError(t *testing.T) {
	dir := t.TempDir()
	if _, err := ServerOptions(Options{Secure: true, CertDir: dir}); !errors.Is(err, ErrNoCertificate) {
		t.Errorf("empty certificate directory: err %v, want ErrNoCertificate", err)
	}
	if err := os.WriteFile(filepath.Join(dir, CertFile), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ServerOptions(Options{Secure: true, CertDir: dir}); !errors.Is(err, ErrNoCertificate) {
		t.Errorf("certificate without key: err %v, want ErrNoCertificate", err)
	}
}

func TestCertDirIsServedFromItsFiles(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{CertFile, KeyFile} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, err := ServerOptions(Options{Secure: true, CertDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if s.CertDir != dir || s.CertName != CertFile || s.KeyName != KeyFile {
		t.Errorf("certificate files %s/%s,%s: want %s/%s,%s", s.CertDir, s.CertName, s.KeyName, dir, CertFile, KeyFile)
	}
	if tlsConfig(t, Options{Secure: true, CertDir: dir}).GetCertificate != nil {
		t.Error("a self-signed certificate overrides the directory's")
	}
}
