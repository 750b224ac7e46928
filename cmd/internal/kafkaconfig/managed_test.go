package kafkaconfig

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestManagedClusterMechanismsValidation(t *testing.T) {
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte("eyJ.first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	base := Config{Brokers: []string{"b:9098"}, TLS: TLS{Enabled: true}}
	for _, tc := range []struct {
		name string
		sasl SASL
		want []string // problems; none means valid
	}{
		{"oauth token", SASL{Mechanism: "oauthbearer", OAuthToken: "tok"}, nil},
		{"oauth token file", SASL{Mechanism: "OAUTHBEARER", OAuthTokenFile: tokFile}, nil},
		{"oauth without token", SASL{Mechanism: "OAUTHBEARER"}, []string{"--kafka-sasl-oauth-token: is required with OAUTHBEARER"}},
		{"oauth both", SASL{Mechanism: "OAUTHBEARER", OAuthToken: "t", OAuthTokenFile: tokFile}, []string{"not both"}},
		{"oauth empty file", SASL{Mechanism: "OAUTHBEARER", OAuthTokenFile: empty}, []string{"--kafka-sasl-oauth-token-file: the OAUTHBEARER token file " + empty + " is empty"}},
		{"oauth missing file", SASL{Mechanism: "OAUTHBEARER", OAuthTokenFile: filepath.Join(dir, "nope")}, []string{"--kafka-sasl-oauth-token-file: read the OAUTHBEARER token"}},
		{"oauth with a password", SASL{Mechanism: "OAUTHBEARER", OAuthToken: "t", Password: "p"}, []string{"--kafka-sasl-password: is not used by --kafka-sasl-mechanism=OAUTHBEARER"}},
		{"msk iam", SASL{Mechanism: "AWS_MSK_IAM", AWSAccessKey: "AKIA", AWSSecretKey: "s", AWSSessionToken: "st"}, nil},
		{"msk iam without keys", SASL{Mechanism: "aws_msk_iam"}, []string{"--kafka-sasl-aws-access-key: is required", "--kafka-sasl-aws-secret-key: is required"}},
		{"aws keys without the mechanism", SASL{Mechanism: "PLAIN", Username: "u", Password: "p", AWSAccessKey: "AKIA"}, []string{"only used with --kafka-sasl-mechanism=AWS_MSK_IAM"}},
		{"token without the mechanism", SASL{OAuthToken: "t"}, []string{"only used with --kafka-sasl-mechanism=OAUTHBEARER"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			c.SASL = tc.sasl
			err := c.ValidateFlags()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("valid configuration refused: %v", err)
				}
				opts, err := c.Opts()
				if err != nil || len(opts) != 3 { // brokers, TLS, SASL
					t.Fatalf("Opts: %d options, %v", len(opts), err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("missing %q in:\n%v", w, err)
				}
			}
			if strings.Contains(err.Error(), "eyJ") {
				t.Fatalf("a token leaked into the error: %v", err)
			}
		})
	}
	c := Config{Brokers: []string{"b:9098"}, SASL: SASL{Mechanism: "AWS_MSK_IAM", AWSAccessKey: "a", AWSSecretKey: "s"}}
	if w := strings.Join(c.Warnings(), "\n"); !strings.Contains(w, "AWS_MSK_IAM without TLS") {
		t.Fatalf("warnings: %q", w)
	}
}

// The token file is read at each authentication: a token rotated on disk is used by the next
// connection.
func TestOAuthTokenFileIsReadAtEachAuthentication(t *testing.T) {
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte("first-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := SASL{Mechanism: "OAUTHBEARER", OAuthTokenFile: tokFile}.mechanism()
	if m.Name() != "OAUTHBEARER" {
		t.Fatalf("mechanism %s", m.Name())
	}
	first := func() string {
		_, msg, err := m.Authenticate(context.Background(), "b:9098")
		if err != nil {
			t.Fatal(err)
		}
		return string(msg)
	}
	if msg := first(); !strings.Contains(msg, "auth=Bearer first-token\x01") {
		t.Fatalf("first message %q", msg)
	}
	if err := os.WriteFile(tokFile, []byte("rotated-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	if msg := first(); !strings.Contains(msg, "auth=Bearer rotated-token\x01") {
		t.Fatalf("after rotation %q", msg)
	}
	if err := os.Remove(tokFile); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Authenticate(context.Background(), "b:9098"); err == nil || !strings.Contains(err.Error(), "read the OAUTHBEARER token") {
		t.Fatalf("missing token file: %v", err)
	}
	if n := (SASL{Mechanism: "AWS_MSK_IAM", AWSAccessKey: "a", AWSSecretKey: "s"}).mechanism().Name(); n != "AWS_MSK_IAM" {
		t.Fatalf("MSK IAM mechanism %s", n)
	}
}
