// Package tlsfiles serves TLS from PEM files that can change under a
// running server: certificates are reloaded when their files change, so a
// rotated Kubernetes secret or cert-manager renewal takes effect without a
// restart. It also checks client certificates against an allowed list of
// SANs (SPIFFE IDs, DNS names).
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"
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
	files Files
	log   *slog.Logger

	mu        sync.Mutex
	cert      *tls.Certificate
	pool      *x509.CertPool
	mtimes    [3]time.Time
	lastCheck time.Time
}

// NewServer loads the files. An error names the file at fault.
func NewServer(f Files, log *slog.Logger) (*Server, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("tls: both a certificate and a key file are required")
	}
	if len(f.AllowedSANs) > 0 && f.ClientCA == "" {
		return nil, errors.New("tls: allowed SANs need a client CA to verify client certificates")
	}
	s := &Server{files: f, log: log}
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) paths() [3]string { return [3]string{s.files.Cert, s.files.Key, s.files.ClientCA} }

// load reads every file; callers hold s.mu or own s exclusively.
func (s *Server) load() error {
	cert, err := tls.LoadX509KeyPair(s.files.Cert, s.files.Key)
	if err != nil {
		return fmt.Errorf("tls: %s / %s: %w", s.files.Cert, s.files.Key, err)
	}
	var pool *x509.CertPool
	if s.files.ClientCA != "" {
		pem, err := os.ReadFile(s.files.ClientCA)
		if err != nil {
			return fmt.Errorf("tls: client CA: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("tls: client CA %s: no PEM certificate found", s.files.ClientCA)
		}
	}
	s.cert, s.pool, s.mtimes = &cert, pool, s.modTimes()
	return nil
}

func (s *Server) modTimes() [3]time.Time {
	var m [3]time.Time
	for i, p := range s.paths() {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			m[i] = fi.ModTime()
		}
	}
	return m
}

// current reloads changed files (at most once per checkEvery) and returns
// the material in force. A reload that fails keeps the old material.
func (s *Server) current() (*tls.Certificate, *x509.CertPool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := time.Now(); now.Sub(s.lastCheck) >= checkEvery {
		s.lastCheck = now
		if s.modTimes() != s.mtimes {
			oldCert, oldPool := s.cert, s.pool
			if err := s.load(); err != nil {
				// Do not retry the same broken files on every handshake.
				s.cert, s.pool, s.mtimes = oldCert, oldPool, s.modTimes()
				s.log.Error("TLS files changed but do not load; keeping the previous ones", slog.String("error", err.Error()))
			} else {
				s.log.Info("TLS certificates reloaded", slog.String("cert", s.files.Cert))
			}
		}
	}
	return s.cert, s.pool
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
