// Package tlsfiles serves TLS from PEM files that can change under a
// running server: certificates are reloaded when their files change
// (package rotated), so a rotated Kubernetes secret or cert-manager renewal
// takes effect without a restart. It also checks client certificates against an allowed list of
// SANs (SPIFFE IDs, DNS names).
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/rotated"
	"github.com/idem-extproc/idem-extproc/internal/safefile"
)

// Files names a server's TLS material.
type Files struct {
	// Cert and Key are the server's certificate chain and private key.
	Cert, Key string
	// ClientCA, when set, requires clients to present a certificate signed
	// by one of its CAs (mutual TLS).
	ClientCA string
	// AllowedSANs, when set, admits only client certificates carrying one
	// of these URI SANs (spiffe://…) or DNS names.
	AllowedSANs []string
}

// checkEvery bounds how often a handshake looks at the files' modification
// times.
const checkEvery = time.Second

// Server holds the current TLS material.
type Server struct {
	files    Files
	material *rotated.Value[material]
}

// OnReload has f told the outcome of every reload of the files from now
// on (the daemon counts them).
func (s *Server) OnReload(f func(err error)) { s.material.OnReload(f) }

// material is what the files hold.
type material struct {
	cert *tls.Certificate
	pool *x509.CertPool
}

// NewServer loads the files. An error names the file at fault.
func NewServer(f Files, log *slog.Logger) (*Server, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("tls: both a certificate and a key file are required")
	}
	if len(f.AllowedSANs) > 0 && f.ClientCA == "" {
		return nil, errors.New("tls: allowed SANs need a client CA to verify client certificates")
	}
	s := &Server{files: f}
	var err error
	s.material, err = rotated.Load([]string{f.Cert, f.Key, f.ClientCA}, s.load, rotated.Options[material]{
		Every: checkEvery,
		OnReload: func(_ material, err error) {
			if err != nil {
				log.Error("TLS files changed but do not load; keeping the previous ones", slog.String("error", err.Error()))
				return
			}
			log.Info("TLS certificates reloaded", slog.String("cert", f.Cert))
		},
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// load reads every file.
func (s *Server) load() (material, error) {
	cert, err := KeyPair(s.files.Cert, s.files.Key)
	if err != nil {
		return material{}, fmt.Errorf("tls: %w", err)
	}
	var pool *x509.CertPool
	if s.files.ClientCA != "" {
		if pool, err = CAPool(s.files.ClientCA); err != nil {
			return material{}, fmt.Errorf("tls: client CA: %w", err)
		}
	}
	return material{cert: &cert, pool: pool}, nil
}

// maxPEMFile caps a certificate, key or CA bundle file: a chain is a few
// KiB, and the bundle of every public CA about 200 KiB.
const maxPEMFile = 1 << 20

// KeyPair reads a certificate chain and its private key from PEM files,
// each a regular file of at most 1 MiB (package safefile), as
// tls.LoadX509KeyPair would read them without those bounds.
func KeyPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := safefile.Read(certFile, maxPEMFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := safefile.Read(keyFile, maxPEMFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s / %s: %w", certFile, keyFile, err)
	}
	return cert, nil
}

// CAPool reads a PEM bundle of CA certificates, a regular file of at most
// 1 MiB.
func CAPool(path string) (*x509.CertPool, error) {
	pem, err := safefile.Read(path, maxPEMFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate found", path)
	}
	return pool, nil
}

// current returns the material in force, reloaded when the files changed
// (package rotated).
func (s *Server) current() (*tls.Certificate, *x509.CertPool) {
	m := s.material.Current()
	return m.cert, m.pool
}

// Config returns the server's tls.Config. Each handshake gets the files'
// current material.
func (s *Server) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool := s.current()
			c := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*cert},
				NextProtos:   []string{"h2"},
			}
			if pool != nil {
				c.ClientAuth = tls.RequireAndVerifyClientCert
				c.ClientCAs = pool
				c.VerifyConnection = s.verifySAN
			}
			return c, nil
		},
	}
}

// verifySAN admits a verified client certificate only if it names an
// allowed identity.
func (s *Server) verifySAN(cs tls.ConnectionState) error {
	if len(s.files.AllowedSANs) == 0 {
		return nil
	}
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: no client certificate")
	}
	leaf := cs.PeerCertificates[0]
	for _, u := range leaf.URIs {
		if slices.Contains(s.files.AllowedSANs, u.String()) {
			return nil
		}
	}
	for _, d := range leaf.DNSNames {
		if slices.Contains(s.files.AllowedSANs, d) {
			return nil
		}
	}
	return fmt.Errorf("tls: client certificate %q names no allowed identity", leaf.Subject.CommonName)
}
