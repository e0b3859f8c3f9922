// Package certtest makes throwaway certificate authorities and
// certificates for tests, written as PEM files.
package certtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority.
type CA struct {
	t    testing.TB
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// CertFile is the CA certificate in PEM.
	CertFile string
	dir      string
}

// NewCA makes a CA whose files live in a test temporary directory.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &CA{t: t, cert: cert, key: key, dir: t.TempDir()}
	ca.CertFile = filepath.Join(ca.dir, name+"-ca.pem")
	writePEM(t, ca.CertFile, "CERTIFICATE", der)
	return ca
}

// Pool returns a pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Leaf is an issued certificate and its key, in files.
type Leaf struct {
	CertFile, KeyFile string
	Serial            *big.Int
}

// TLS loads the leaf as a tls.Certificate.
func (l Leaf) TLS(t testing.TB) tls.Certificate {
	c, err := tls.LoadX509KeyPair(l.CertFile, l.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Options describe an issued certificate.
type Options struct {
	CommonName string
	// DNSNames, IPs and URIs (e.g. spiffe://…) become SANs.
	DNSNames []string
	IPs      []net.IP
	URIs     []string
	// Dir, when set, is where the files go (to overwrite them in place).
	Dir string
}

// Issue signs a certificate usable by servers and clients.
func (ca *CA) Issue(o Options) Leaf {
	t := ca.t
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: o.CommonName},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     o.DNSNames,
		IPAddresses:  o.IPs,
	}
	for _, s := range o.URIs {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	dir := o.Dir
	if dir == "" {
		dir = t.TempDir()
	}
	l := Leaf{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem"), Serial: tmpl.SerialNumber}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// Key first, then the certificate: a reader that sees the new
	// certificate also finds its key.
	writePEM(t, l.KeyFile, "EC PRIVATE KEY", kb)
	writePEM(t, l.CertFile, "CERTIFICATE", der)
	return l
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
