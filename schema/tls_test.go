package schema_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keiro-go/keiro/schema"
)

// testCA issues certificates for the TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "keiro test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a leaf certificate (server if server, else client) and its PEM files.
func (ca *testCA) issue(t *testing.T, serial int64, server bool) (tls.Certificate, string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "keiro test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeFile(t, certFile, certPEM)
	writeFile(t, keyFile, keyPEM)
	return pair, certFile, keyFile
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A registry behind mutual TLS (the real registry behind a TLS-terminating proxy, as a gateway
// or sidecar puts it): the CA file makes the server trusted, the client certificate gets us in;
// without either the request fails, and not as "registry unavailable, retry".
func TestMutualTLS(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	serverCert, _, _ := ca.issue(t, 2, true)
	_, clientCertFile, clientKeyFile := ca.issue(t, 3, false)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	writeFile(t, caFile, ca.pem)

	real := newRealRegistry(t)
	target, err := url.Parse(real.SchemaRegistry.URL)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	srv := httptest.NewUnstartedServer(httputil.NewSingleHostReverseProxy(target))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	id := real.register(t, real.Name("orders.v1-value"), orderSchema)

	reg := newRegistry(t, srv.URL, func(c *schema.RegistryConfig) {
		c.CAFile, c.CertFile, c.KeyFile = caFile, clientCertFile, clientKeyFile
	})
	if _, err := reg.SchemaByID(context.Background(), id); err != nil {
		t.Fatalf("mutual TLS: %v", err)
	}

	noClientCert := newRegistry(t, srv.URL, func(c *schema.RegistryConfig) { c.CAFile = caFile })
	if _, err := noClientCert.SchemaByID(context.Background(), id); err == nil {
		t.Fatal("a client without a certificate got in")
	}
	untrusted := newRegistry(t, srv.URL, func(c *schema.RegistryConfig) { c.MaxAttempts = 1 })
	_, err = untrusted.SchemaByID(context.Background(), id)
	var verr *tls.CertificateVerificationError
	if !errors.As(err, &verr) {
		t.Fatalf("untrusted server certificate: err = %v, want a certificate verification error", err)
	}

	for name, cfg := range map[string]schema.RegistryConfig{
		"missing CA file": {URL: srv.URL, CAFile: filepath.Join(t.TempDir(), "nope.pem")},
		"CA file not PEM": {URL: srv.URL, CAFile: clientKeyFile + ".x"},
		"bad key pair":    {URL: srv.URL, CertFile: clientCertFile, KeyFile: caFile},
	} {
		if name == "CA file not PEM" {
			writeFile(t, cfg.CAFile, []byte("hello"))
		}
		if _, err := schema.NewRegistry(cfg); err == nil {
			t.Errorf("%s: NewRegistry accepted it", name)
		}
	}
}
