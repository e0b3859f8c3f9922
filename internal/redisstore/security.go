package redisstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-extproc/idem-extproc/internal/rotated"
	"github.com/idem-extproc/idem-extproc/internal/safefile"
	"github.com/idem-extproc/idem-extproc/internal/tlsfiles"
)

// Security holds what a client needs to reach a protected Redis, read from
// files (Kubernetes Secrets) rather than flags or URLs.
type Security struct {
	// PasswordFile holds the password of the URL's user (an ACL user, or
	// the default user). It is read on every new connection, so a rotated
	// Secret takes effect without a restart. It overrides a password in
	// the URL.
	PasswordFile string
	// CAFile is a PEM bundle of the CAs that sign the Redis servers'
	// certificates (TLS URLs only); the system pool when empty.
	CAFile string
	// CertFile and KeyFile are a client certificate, for servers that
	// require one (tls-auth-clients); reread when they change.
	CertFile, KeyFile string
}

func (s Security) any() bool {
	return s.PasswordFile != "" || s.CAFile != "" || s.CertFile != "" || s.KeyFile != ""
}

// Validate checks the settings against the URL they go with.
func (s Security) Validate(rawURL string) error {
	_, o, err := parseURL(rawURL)
	if err != nil {
		return err
	}
	return s.check(o.TLSConfig != nil)
}

// check reports mistakes, naming the setting.
func (s Security) check(tlsURL bool) error {
	var errs []error
	if (s.CertFile == "") != (s.KeyFile == "") {
		errs = append(errs, errors.New("a client certificate needs both the certificate and the key file"))
	}
	if (s.CAFile != "" || s.CertFile != "") && !tlsURL {
		errs = append(errs, errors.New("CA and client certificate files need a TLS URL (rediss://, rediss+sentinel://, rediss+cluster://)"))
	}
	if s.PasswordFile != "" {
		if _, err := readSecret(s.PasswordFile); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// maxPasswordFile caps the password file: a password is a line.
const maxPasswordFile = 16 << 10

func readSecret(path string) (string, error) {
	b, err := safefile.Read(path, maxPasswordFile)
	if err != nil {
		return "", fmt.Errorf("redis password file: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// credentials returns a go-redis credentials provider that rereads the
// password file whenever a connection is made.
func (s Security) credentials(user string) func(context.Context) (string, string, error) {
	return func(context.Context) (string, string, error) {
		pw, err := readSecret(s.PasswordFile)
		return user, pw, err
	}
}

// tlsConfig adds the CA pool and client certificate to base.
func (s Security) tlsConfig(base *tls.Config) (*tls.Config, error) {
	c := base.Clone()
	if c == nil {
		c = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if s.CAFile != "" {
		pool, err := loadCAPool(s.CAFile)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	if s.CertFile != "" {
		kp, err := loadKeyPair(s.CertFile, s.KeyFile)
		if err != nil {
			return nil, err
		}
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return kp.Current(), nil }
	}
	return c, nil
}

// CheckFiles loads the CA bundle and the client certificate as the first
// connection would, so that a file that does not load is found at start,
// before anything is opened. It does not read the password file: Validate
// does.
func (s Security) CheckFiles() error {
	var errs []error
	if s.CAFile != "" {
		if _, err := loadCAPool(s.CAFile); err != nil {
			errs = append(errs, err)
		}
	}
	if s.CertFile != "" {
		if _, err := loadKeyPair(s.CertFile, s.KeyFile); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func loadCAPool(path string) (*x509.CertPool, error) {
	pool, err := tlsfiles.CAPool(path)
	if err != nil {
		return nil, fmt.Errorf("redis CA file: %w", err)
	}
	return pool, nil
}

// loadKeyPair loads a client certificate that follows its files: each new
// connection looks at their modification times (package rotated), and a
// rotation that does not load (half written, say) keeps the previous
// certificate.
func loadKeyPair(certFile, keyFile string) (*rotated.Value[*tls.Certificate], error) {
	return rotated.Load([]string{certFile, keyFile}, func() (*tls.Certificate, error) {
		c, err := tlsfiles.KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("redis client certificate: %w", err)
		}
		return &c, nil
	}, rotated.Options[*tls.Certificate]{})
}
