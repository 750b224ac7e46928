package apiserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/keiro-go/keiro/internal/proc"
)

// EtcdEnv names the environment variable that points at the etcd binary to run instead of the
// one on PATH (Debian's etcd-server package installs /usr/bin/etcd).
const EtcdEnv = "KEIRO_ETCD_BINARY"

// StartTimeout bounds how long Start waits for the API server to report ready.
const StartTimeout = 90 * time.Second

// adminToken is the bearer token of the server's only user, a member of system:masters. The
// server listens on loopback only and lives as long as a test.
const adminToken = "keiro-deploy-check-admin"

// Server is a running kube-apiserver with its etcd. Both are killed when the process that
// started them dies, whatever the way.
type Server struct {
	// Config reaches the server over TLS as an administrator.
	Config *rest.Config

	etcd, apiserver *proc.Process
	// etcdLog and apiserverLog are the processes' output.
	etcdLog, apiserverLog string
}

// Start starts etcd and the kube-apiserver binary bin (see [Build]) on free loopback ports,
// their state and credentials under dir, and returns once the server's /readyz answers ok.
// The server authenticates a static administrator token, authorizes every request
// (AlwaysAllow) and serves a certificate made here for 127.0.0.1.
// A free port may be taken by another process before etcd or kube-apiserver binds it: Start
// then tries again on other ports, up to three times.
func Start(ctx context.Context, bin, dir string) (*Server, error) {
	etcdBin := os.Getenv(EtcdEnv)
	if etcdBin == "" {
		var err error
		if etcdBin, err = proc.LookPath("etcd", "/usr/bin", "/usr/local/bin"); err != nil {
			return nil, errors.New("etcd not found: the API server stores its objects in etcd " +
				"(install Debian's etcd-server package: apt-get install etcd-server), or set " + EtcdEnv + " to an etcd binary")
		}
	}
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		var s *Server
		s, err = start(ctx, etcdBin, bin, filepath.Join(dir, "attempt-"+strconv.Itoa(attempt)))
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errPortTaken) {
			return nil, err
		}
	}
	return nil, err
}

// errPortTaken marks a start that failed because a port chosen free was taken meanwhile.
var errPortTaken = errors.New("a port was taken")

// start makes one attempt of Start, with state under dir.
func start(ctx context.Context, etcdBin, bin, dir string) (*Server, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	ports, err := proc.FreePorts(3)
	if err != nil {
		return nil, err
	}
	etcdClient, etcdPeer, securePort := ports[0], ports[1], ports[2]
	creds, err := writeCredentials(dir)
	if err != nil {
		return nil, err
	}

	s := &Server{etcdLog: filepath.Join(dir, "etcd.log"), apiserverLog: filepath.Join(dir, "kube-apiserver.log")}
	clientURL := "http://127.0.0.1:" + strconv.Itoa(etcdClient)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)
	s.etcd, err = proc.Start(s.etcdLog, "", etcdBin, []string{
		"--name=default",
		"--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + clientURL,
		"--advertise-client-urls=" + clientURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=default=" + peerURL,
		"--initial-cluster-state=new",
	})
	if err != nil {
		return nil, fmt.Errorf("start %s: %w: install Debian's etcd-server package, or set %s to an etcd binary", etcdBin, err, EtcdEnv)
	}
	s.apiserver, err = proc.Start(s.apiserverLog, "", bin, []string{
		"--etcd-servers=" + clientURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(securePort),
		"--cert-dir=" + dir,
		"--tls-cert-file=" + creds.cert,
		"--tls-private-key-file=" + creds.key,
		"--token-auth-file=" + creds.tokens,
		"--anonymous-auth=false",
		"--authorization-mode=AlwaysAllow",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + creds.key,
		"--service-account-signing-key-file=" + creds.key,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	})
	if err != nil {
		s.Stop()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s.Config = &rest.Config{
		Host:            "https://127.0.0.1:" + strconv.Itoa(securePort),
		BearerToken:     adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: creds.certPEM},
		QPS:             -1, // no client-side rate limit: the server is ours alone
	}
	if err := s.waitReady(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// Stop kills the API server and etcd and waits for them to exit.
func (s *Server) Stop() {
	s.apiserver.Kill(stopWait)
	s.etcd.Kill(stopWait)
}

// stopWait bounds Stop's wait for each process to exit once killed.
const stopWait = 10 * time.Second

// waitReady polls /readyz until it answers ok, a process exits or StartTimeout passes.
func (s *Server) waitReady(ctx context.Context) error {
	hc, err := rest.HTTPClientFor(s.Config)
	if err != nil {
		return fmt.Errorf("client for the API server: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	var last string // the last /readyz answer or error
	for {
		for _, p := range []struct {
			name, log string
			*proc.Process
		}{{"etcd", s.etcdLog, s.etcd}, {"kube-apiserver", s.apiserverLog, s.apiserver}} {
			if !p.Exited() {
				continue
			}
			out, _ := os.ReadFile(p.log)
			err := fmt.Errorf("%s exited: %v\n%s", p.name, p.Err(), proc.Tail(string(out), 30))
			if strings.Contains(string(out), "address already in use") {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.Config.Host+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, proc.Tail(string(body), 10))
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready after %s (last /readyz: %s)\nkube-apiserver:\n%s\netcd:\n%s",
				StartTimeout, last, proc.TailFile(s.apiserverLog, 20), proc.TailFile(s.etcdLog, 10))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// credentials are the files Start hands to kube-apiserver.
type credentials struct {
	cert, key, tokens string // file paths
	certPEM           []byte // the serving certificate, the client's only trusted root
}

// writeCredentials makes a key, a self-signed serving certificate for 127.0.0.1 (the same key
// signs service account tokens) and the static token file of the administrator.
func writeCredentials(dir string) (credentials, error) {
	c := credentials{
		cert:   filepath.Join(dir, "serving.crt"),
		key:    filepath.Join(dir, "serving.key"),
		tokens: filepath.Join(dir, "tokens.csv"),
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return c, fmt.Errorf("generate the API server's key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return c, fmt.Errorf("make the API server's certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return c, fmt.Errorf("encode the API server's key: %w", err)
	}
	c.certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	for path, data := range map[string][]byte{
		c.cert:   c.certPEM,
		c.key:    pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		c.tokens: []byte(adminToken + ",keiro-admin,keiro-admin,system:masters\n"),
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return c, fmt.Errorf("write %s: %w", path, err)
		}
	}
	return c, nil
}
