package kafkaconfig

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	saslaws "github.com/twmb/franz-go/pkg/sasl/aws"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/keiro-go/keiro/cmd/internal/cli"
)

// SASL mechanisms accepted by [SASL.Mechanism].
const (
	MechanismPlain       = "PLAIN"
	MechanismScramSHA256 = "SCRAM-SHA-256"
	MechanismScramSHA512 = "SCRAM-SHA-512"
	MechanismOAuthBearer = "OAUTHBEARER"
	MechanismAWSMSKIAM   = "AWS_MSK_IAM"
)

// Config is how a binary connects to Kafka.
type Config struct {
	// Brokers are the seed brokers, host:port. Required (no default).
	Brokers []string `help:"Kafka seed brokers, host:port, comma separated (required)." placeholder:"HOST:PORT"`
	// ClientID is the client id sent to brokers (visible in broker logs and quotas). As a flag
	// it defaults to the kong variable kafka_client_id (a binary sets it to its name, e.g.
	// "keiro-relay"); empty leaves franz-go's default ("kgo").
	ClientID string `help:"Kafka client id, shown in broker logs and quotas." default:"${kafka_client_id=}" placeholder:"ID"`
	// TLS configures encryption and certificates. Defaults to plaintext.
	TLS TLS `embed:"" prefix:"kafka-tls-"`
	// SASL configures authentication. Defaults to none.
	SASL SASL `embed:"" prefix:"kafka-sasl-"`
}

// TLS configures the connection's encryption.
type TLS struct {
	// Enabled turns TLS on. Defaults to false. The other TLS fields require it.
	Enabled bool `help:"Connect to Kafka with TLS."`
	// CAFile is a PEM bundle of the CAs that sign the brokers' certificates. Defaults to the
	// system pool.
	CAFile string `name:"ca-file" help:"PEM file of CAs that sign the brokers' certificates (default: system pool)." placeholder:"PATH" type:"path"`
	// CertFile is the client certificate (PEM) for mutual TLS; requires KeyFile. Defaults to no
	// client certificate.
	CertFile string `help:"Client certificate PEM file for mutual TLS (needs --kafka-tls-key-file)." placeholder:"PATH" type:"path"`
	// KeyFile is the client certificate's private key (PEM); requires CertFile. Defaults to none.
	KeyFile string `help:"Client private key PEM file for mutual TLS (needs --kafka-tls-cert-file)." placeholder:"PATH" type:"path"`
	// InsecureSkipVerify disables verification of the brokers' certificates. For tests only.
	// Defaults to false.
	InsecureSkipVerify bool `help:"Do not verify the brokers' certificates (tests only)."`
	// ServerName overrides the name checked in the brokers' certificates. Defaults to the host
	// of each broker address.
	ServerName string `help:"Name to verify in the brokers' certificates (default: each broker's host)." placeholder:"NAME"`
}

// SASL configures authentication.
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or AWS_MSK_IAM
	// (case-insensitive). Defaults to none: no authentication.
	Mechanism string `help:"SASL mechanism: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or AWS_MSK_IAM (default: none)." placeholder:"MECHANISM"`
	// Username is the SASL user of PLAIN and SCRAM. Required with those mechanisms.
	Username string `help:"SASL username (PLAIN, SCRAM)." placeholder:"USER"`
	// Password is the SASL password of PLAIN and SCRAM. Required with those mechanisms; never
	// printed.
	Password cli.Secret `help:"SASL password (PLAIN, SCRAM; never printed)."`
	// OAuthToken is the OAUTHBEARER token. OAUTHBEARER needs it or OAuthTokenFile. Defaults to
	// none; never printed.
	OAuthToken cli.Secret `name:"oauth-token" help:"OAUTHBEARER token (never printed); or --kafka-sasl-oauth-token-file."`
	// OAuthTokenFile is a file holding the OAUTHBEARER token, read again at each authentication
	// so that a token refreshed on disk (a projected service-account token, a sidecar's output)
	// is picked up. Defaults to none.
	OAuthTokenFile string `name:"oauth-token-file" help:"File holding the OAUTHBEARER token, read again at every authentication (rotated tokens are picked up)." placeholder:"PATH" type:"path"`
	// AWSAccessKey, AWSSecretKey and AWSSessionToken are the AWS_MSK_IAM credentials. The key
	// pair is required with AWS_MSK_IAM; the session token is for temporary credentials.
	// Default to none; the secret key and session token are never printed.
	AWSAccessKey string `name:"aws-access-key" help:"AWS access key id (AWS_MSK_IAM)." placeholder:"KEY"`
	// AWSSecretKey: see AWSAccessKey.
	AWSSecretKey cli.Secret `name:"aws-secret-key" help:"AWS secret access key (AWS_MSK_IAM; never printed)."`
	// AWSSessionToken: see AWSAccessKey.
	AWSSessionToken cli.Secret `name:"aws-session-token" help:"AWS session token of temporary credentials (AWS_MSK_IAM; never printed)."`
}

// ValidateFlags reports every problem of the configuration, joined, each naming its flag:
// missing or malformed brokers, an unknown mechanism, credentials without a mechanism (or the
// reverse), TLS files without TLS, a certificate without its key, and files that cannot be read
// or parsed.
func (c *Config) ValidateFlags() error {
	var p cli.Problems
	if len(c.Brokers) == 0 {
		p.Add("brokers", "is required: list the Kafka seed brokers as host:port,host:port")
	}
	for _, b := range c.Brokers {
		if err := checkBroker(strings.TrimSpace(b)); err != nil {
			p.Add("brokers", "%q is not host:port: %v", b, err)
		}
	}
	c.validateTLS(&p)
	c.validateSASL(&p)
	return p.Err()
}

// checkBroker reports what is wrong with a seed broker address: it must be host:port with a
// host and a numeric port from 1 to 65535 (the client would refuse anything else only when it
// starts, after the binary has already touched the database).
func checkBroker(addr string) error {
	if addr == "" {
		return errors.New("the entry is empty (brokers are separated by commas alone)")
	}
	host, port, err := net.SplitHostPort(addr)
	var ae *net.AddrError
	switch {
	case err != nil && errors.As(err, &ae) && ae.Err == "missing port in address":
		return errors.New("the port is missing")
	case err != nil && errors.As(err, &ae):
		return fmt.Errorf("%s (an IPv6 address is written [addr]:port)", ae.Err)
	case err != nil:
		return err
	}
	if host == "" {
		return errors.New("the host is missing")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

func (c *Config) validateTLS(p *cli.Problems) {
	t := c.TLS
	if !t.Enabled {
		for _, f := range []struct{ flag, v string }{
			{"kafka-tls-ca-file", t.CAFile}, {"kafka-tls-cert-file", t.CertFile},
			{"kafka-tls-key-file", t.KeyFile}, {"kafka-tls-server-name", t.ServerName},
		} {
			if f.v != "" {
				p.Add(f.flag, "is set but TLS is off: add --kafka-tls-enabled")
			}
		}
		if t.InsecureSkipVerify {
			p.Add("kafka-tls-insecure-skip-verify", "is set but TLS is off: add --kafka-tls-enabled")
		}
		return
	}
	if t.CAFile != "" {
		if _, err := loadCAs(t.CAFile); err != nil {
			p.AddErr("kafka-tls-ca-file", err)
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		p.Add("kafka-tls-key-file", "is required with --kafka-tls-cert-file")
	case t.CertFile == "" && t.KeyFile != "":
		p.Add("kafka-tls-cert-file", "is required with --kafka-tls-key-file")
	case t.CertFile != "":
		certOK := checkReadable(p, "kafka-tls-cert-file", t.CertFile)
		keyOK := checkReadable(p, "kafka-tls-key-file", t.KeyFile)
		if certOK && keyOK {
			if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
				p.Add("kafka-tls-cert-file", "load client certificate %s with key %s: %v", t.CertFile, t.KeyFile, err)
			}
		}
	}
}

func checkReadable(p *cli.Problems, flag, path string) bool {
	if _, err := os.ReadFile(path); err != nil {
		p.Add(flag, "cannot read %s: %v", path, err)
		return false
	}
	return true
}

func (c *Config) validateSASL(p *cli.Problems) {
	s := c.SASL
	userPass := func(need bool) {
		for _, f := range []struct {
			flag string
			set  bool
		}{{"kafka-sasl-username", s.Username != ""}, {"kafka-sasl-password", s.Password != ""}} {
			switch {
			case need && !f.set:
				p.Add(f.flag, "is required with --kafka-sasl-mechanism=%s", strings.ToUpper(s.Mechanism))
			case !need && f.set && s.Mechanism != "":
				p.Add(f.flag, "is not used by --kafka-sasl-mechanism=%s", strings.ToUpper(s.Mechanism))
			case !need && f.set:
				p.Add(f.flag, "is set but no mechanism is: add --kafka-sasl-mechanism")
			}
		}
	}
	oauthSet := s.OAuthToken != "" || s.OAuthTokenFile != ""
	awsSet := s.AWSAccessKey != "" || s.AWSSecretKey != "" || s.AWSSessionToken != ""
	mech := strings.ToUpper(s.Mechanism)
	if mech != MechanismOAuthBearer && oauthSet {
		p.Add("kafka-sasl-oauth-token", "is only used with --kafka-sasl-mechanism=OAUTHBEARER")
	}
	if mech != MechanismAWSMSKIAM && awsSet {
		p.Add("kafka-sasl-aws-access-key", "the AWS credentials are only used with --kafka-sasl-mechanism=AWS_MSK_IAM")
	}
	switch mech {
	case "":
		userPass(false)
	case MechanismPlain, MechanismScramSHA256, MechanismScramSHA512:
		userPass(true)
	case MechanismOAuthBearer:
		userPass(false)
		switch {
		case s.OAuthToken != "" && s.OAuthTokenFile != "":
			p.Add("kafka-sasl-oauth-token", "set either the token or --kafka-sasl-oauth-token-file, not both")
		case !oauthSet:
			p.Add("kafka-sasl-oauth-token", "is required with OAUTHBEARER (or --kafka-sasl-oauth-token-file)")
		case s.OAuthTokenFile != "":
			if _, err := readToken(s.OAuthTokenFile); err != nil {
				p.AddErr("kafka-sasl-oauth-token-file", err)
			}
		}
	case MechanismAWSMSKIAM:
		userPass(false)
		if s.AWSAccessKey == "" {
			p.Add("kafka-sasl-aws-access-key", "is required with AWS_MSK_IAM")
		}
		if s.AWSSecretKey == "" {
			p.Add("kafka-sasl-aws-secret-key", "is required with AWS_MSK_IAM")
		}
	default:
		p.Add("kafka-sasl-mechanism", "unknown mechanism %q: use PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or AWS_MSK_IAM", s.Mechanism)
		userPass(true)
	}
}

// readToken reads an OAUTHBEARER token file (surrounding white space removed).
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read the OAUTHBEARER token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("the OAUTHBEARER token file %s is empty", path)
	}
	return tok, nil
}

// Warnings lists configurations that work but are unsafe (PLAIN without TLS, certificate
// verification off), for the binary to log at startup.
func (c *Config) Warnings() []string {
	var w []string
	if m := strings.ToUpper(c.SASL.Mechanism); (m == MechanismOAuthBearer || m == MechanismAWSMSKIAM) && !c.TLS.Enabled {
		w = append(w, "SASL "+m+" without TLS sends its credentials in clear text (managed clusters require TLS); add --kafka-tls-enabled")
	}
	if strings.EqualFold(c.SASL.Mechanism, MechanismPlain) && !c.TLS.Enabled {
		w = append(w, "SASL PLAIN without TLS sends the password in clear text; add --kafka-tls-enabled")
	}
	if c.TLS.Enabled && c.TLS.InsecureSkipVerify {
		w = append(w, "Kafka TLS certificate verification is off (--kafka-tls-insecure-skip-verify)")
	}
	return w
}

// Opts returns the franz-go options for the configuration: seed brokers, client id, a TLS
// dialer and the SASL mechanism. Call ValidateFlags first; Opts still fails, naming the
// flag, on a configuration it cannot use.
func (c *Config) Opts() ([]kgo.Opt, error) {
	if err := c.ValidateFlags(); err != nil {
		return nil, err
	}
	brokers := make([]string, len(c.Brokers))
	for i, b := range c.Brokers {
		brokers[i] = strings.TrimSpace(b)
	}
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	if c.ClientID != "" {
		opts = append(opts, kgo.ClientID(c.ClientID))
	}
	if c.TLS.Enabled {
		tc, err := c.TLS.Config()
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if m := c.SASL.mechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

func (s SASL) mechanism() sasl.Mechanism {
	switch strings.ToUpper(s.Mechanism) {
	case MechanismPlain:
		return plain.Auth{User: s.Username, Pass: s.Password.Reveal()}.AsMechanism()
	case MechanismScramSHA256:
		return scram.Auth{User: s.Username, Pass: s.Password.Reveal()}.AsSha256Mechanism()
	case MechanismScramSHA512:
		return scram.Auth{User: s.Username, Pass: s.Password.Reveal()}.AsSha512Mechanism()
	case MechanismOAuthBearer:
		if s.OAuthTokenFile != "" {
			path := s.OAuthTokenFile
			return oauth.Oauth(func(context.Context) (oauth.Auth, error) {
				tok, err := readToken(path)
				return oauth.Auth{Token: tok}, err
			})
		}
		return oauth.Auth{Token: s.OAuthToken.Reveal()}.AsMechanism()
	case MechanismAWSMSKIAM:
		return saslaws.Auth{AccessKey: s.AWSAccessKey, SecretKey: s.AWSSecretKey.Reveal(),
			SessionToken: s.AWSSessionToken.Reveal()}.AsManagedStreamingIAMMechanism()
	}
	return nil
}

// Config builds the *tls.Config: minimum TLS 1.2, the CA bundle (or the system pool), the
// client certificate and the server name.
func (t TLS) Config() (*tls.Config, error) {
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // explicit operator choice, warned about
	}
	if t.CAFile != "" {
		pool, err := loadCAs(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-ca-file: %w", err)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" || t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-cert-file: load client certificate %s with key %s: %w", t.CertFile, t.KeyFile, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// ErrNoCertificates reports a CA file with no PEM certificate in it.
var ErrNoCertificates = errors.New("no PEM certificate found")

func loadCAs(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", path, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("load CA bundle %s: %w", path, ErrNoCertificates)
	}
	return pool, nil
}
