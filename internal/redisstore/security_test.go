package redisstore_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/certtest"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/storetest"
)

func secureStore(t *testing.T, url string, sec redisstore.Security) (*redisstore.Store, error) {
	t.Helper()
	rdb, err := redisstore.NewSecureClient(url, time.Second, sec)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = rdb.Close() })
	st := redisstore.New(rdb, redisstore.Options{CallTimeout: time.Second})
	t.Cleanup(func() { _ = st.Close() })
	return st, nil
}

func ping(st *redisstore.Store) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return st.Ping(ctx)
}

// TestTLSWithClientCertificates: the store speaks TLS to a Redis that
// requires client certificates, trusting only the given CA; the contract
// suite passes over it.
func TestTLSWithClientCertificates(t *testing.T) {
	ca := certtest.NewCA(t, "redis")
	server := ca.Issue(certtest.Options{CommonName: "redis", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	client := ca.Issue(certtest.Options{CommonName: "idem-extproc"})
	srv := redistest.Start(t, redistest.Options{TLS: &redistest.TLS{
		CertFile: server.CertFile, KeyFile: server.KeyFile, CAFile: ca.CertFile, AuthClients: true}})

	if st, err := secureStore(t, srv.TLSURL(), redisstore.Security{CAFile: ca.CertFile}); err != nil || ping(st) == nil {
		t.Fatalf("a client without a certificate must be refused (err %v)", err)
	}
	if st, err := secureStore(t, srv.TLSURL(), redisstore.Security{CertFile: client.CertFile, KeyFile: client.KeyFile}); err != nil || ping(st) == nil {
		t.Fatalf("a server certificate from an unknown CA must be refused (err %v)", err)
	}
	sec := redisstore.Security{CAFile: ca.CertFile, CertFile: client.CertFile, KeyFile: client.KeyFile}
	st, err := secureStore(t, srv.TLSURL(), sec)
	if err != nil {
		t.Fatal(err)
	}
	if err := ping(st); err != nil {
		t.Fatalf("TLS ping: %v", err)
	}
	storetest.Run(t, func(t *testing.T) idem.Store {
		st, err := secureStore(t, srv.TLSURL(), sec)
		if err != nil {
			t.Fatal(err)
		}
		return st
	})
}

// TestACLPasswordFromFile: an ACL user whose password is read from a file
// on every new connection, so a rotated secret takes effect at once.
func TestACLPasswordFromFile(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	for _, cmd := range [][]any{
		{"ACL", "SETUSER", "idem", "on", ">first-password", "~idem:*", "&idem:*", "+@all", "-@admin", "-@dangerous"},
	} {
		if err := srv.Do(ctx, cmd...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	pwFile := filepath.Join(t.TempDir(), "password")
	write := func(pw string) {
		if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	url := "redis://idem@" + srv.Addr() + "/0"
	write("wrong")
	if st, err := secureStore(t, url, redisstore.Security{PasswordFile: pwFile}); err != nil || ping(st) == nil {
		t.Fatalf("a wrong password must be refused (err %v)", err)
	}
	write("first-password")
	st, err := secureStore(t, url, redisstore.Security{PasswordFile: pwFile})
	if err != nil {
		t.Fatal(err)
	}
	if err := ping(st); err != nil {
		t.Fatalf("ping with the password from the file: %v", err)
	}
	// The ACL user reaches records but nothing else.
	res, err := st.Reserve(ctx, idem.Reservation{ID: idem.RecordIDFor("p", "s", "k"), Token: idem.NewToken(),
		Lease: time.Minute, Retention: time.Hour})
	if err != nil || res.Outcome != idem.Reserved {
		t.Fatalf("reserve as the ACL user: %v %v", res, err)
	}
	// Rotation: new password in Redis and in the file; new connections use it.
	if err := srv.Do(ctx, "ACL", "SETUSER", "idem", "resetpass", ">second-password").Err(); err != nil {
		t.Fatal(err)
	}
	write("second-password")
	st2, _ := secureStore(t, url, redisstore.Security{PasswordFile: pwFile})
	if err := ping(st2); err != nil {
		t.Fatalf("after rotation: %v", err)
	}
}

func TestSecurityMistakes(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	for name, tc := range map[string]struct {
		url string
		sec redisstore.Security
		msg string
	}{
		"CA without TLS":        {"redis://127.0.0.1:6379", redisstore.Security{CAFile: "ca.pem"}, "TLS URL"},
		"cert without key":      {"rediss://127.0.0.1:6379", redisstore.Security{CertFile: "c.pem"}, "both"},
		"missing password file": {"redis://127.0.0.1:6379", redisstore.Security{PasswordFile: missing}, "password file"},
		"missing CA file":       {"rediss://127.0.0.1:6379", redisstore.Security{CAFile: missing}, "CA file"},
	} {
		if _, err := redisstore.NewSecureClient(tc.url, time.Second, tc.sec); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: error %v, want one mentioning %q", name, err, tc.msg)
		}
	}
}
