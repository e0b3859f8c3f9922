package daemon_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/certtest"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// TestMutualTLS: the ext_proc listener admits only clients with a
// certificate from the configured CA naming an allowed identity, and picks
// up a rotated server certificate without a restart.
func TestMutualTLS(t *testing.T) {
	ca := certtest.NewCA(t, "mesh")
	other := certtest.NewCA(t, "intruder")
	serverDir := t.TempDir()
	server := ca.Issue(certtest.Options{CommonName: "idem-extproc", IPs: []net.IP{net.ParseIP("127.0.0.1")}, Dir: serverDir})
	const envoyID = "spiffe://cluster.local/ns/gateway/sa/envoy"
	envoy := ca.Issue(certtest.Options{CommonName: "envoy", URIs: []string{envoyID}})
	stranger := ca.Issue(certtest.Options{CommonName: "batch-job", URIs: []string{"spiffe://cluster.local/ns/jobs/sa/batch"}})
	forged := other.Issue(certtest.Options{CommonName: "envoy", URIs: []string{envoyID}})

	cfg, err := daemon.ParseConfig([]string{"--listen", "127.0.0.1:0", "--admin-listen", "",
		"--tls-cert-file", server.CertFile, "--tls-key-file", server.KeyFile,
		"--tls-client-ca-file", ca.CertFile, "--tls-allowed-sans", envoyID}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.Start(cfg, slog.New(slog.DiscardHandler), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Shutdown)

	// call makes a gRPC health check over TLS with the given client
	// certificate (none when nil) and returns the server certificate seen.
	call := func(client *certtest.Leaf) (serial string, err error) {
		tc := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
		if client != nil {
			tc.Certificates = []tls.Certificate{client.TLS(t)}
		}
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			serial = cs.PeerCertificates[0].SerialNumber.String()
			return nil
		}
		cc, err := grpc.NewClient(d.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			return "", err
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return serial, err
	}
	if _, err := call(&envoy); err != nil {
		t.Fatalf("the allowed client was refused: %v", err)
	}
	for name, c := range map[string]*certtest.Leaf{"no certificate": nil, "another identity": &stranger, "another CA": &forged} {
		if _, err := call(c); err == nil {
			t.Errorf("%s: admitted", name)
		}
	}
	// Rotation: new files in place; new connections get the new certificate.
	before, _ := call(&envoy)
	rotated := ca.Issue(certtest.Options{CommonName: "idem-extproc", IPs: []net.IP{net.ParseIP("127.0.0.1")}, Dir: serverDir})
	testwait.Until(t, "the rotated certificate "+rotated.Serial.String()+" served (was "+before+")", func() bool {
		got, err := call(&envoy)
		return err == nil && got == rotated.Serial.String()
	})
}

// TestRedisOverTLSWithACLUser: the server reaches a Redis that requires
// TLS client certificates and an ACL user, with every secret in a file.
func TestRedisOverTLSWithACLUser(t *testing.T) {
	ca := certtest.NewCA(t, "redis")
	server := ca.Issue(certtest.Options{CommonName: "redis", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	client := ca.Issue(certtest.Options{CommonName: "idem-extproc"})
	redis := redistest.Start(t, redistest.Options{TLS: &redistest.TLS{
		CertFile: server.CertFile, KeyFile: server.KeyFile, CAFile: ca.CertFile, AuthClients: true}})
	ctx := context.Background()
	if err := redis.Do(ctx, "ACL", "SETUSER", "idem", "on", ">p4ss", "~idem:*", "&idem:*", "+@all", "-@admin", "-@dangerous").Err(); err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(t.TempDir(), "redis-password")
	if err := os.WriteFile(pw, []byte("p4ss\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := strings.Replace(redis.TLSURL(), "rediss://", "rediss://idem@", 1)
	cfg, err := daemon.ParseConfig([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--redis-url", url, "--redis-password-file", pw, "--redis-ca-file", ca.CertFile,
		"--redis-cert-file", client.CertFile, "--redis-key-file", client.KeyFile}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.Start(cfg, slog.New(slog.DiscardHandler), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Shutdown)
	resp, err := http.Get("http://" + d.AdminAddr() + "/readyz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("not ready over TLS: %v %v", resp, err)
	}
	resp.Body.Close()
	env := harness.Start(t, harness.Options{ServerAddr: d.Addr(), Store: harness.Memory(memstore.Options{})})
	first := env.Post("/orders", "tls-1", `{}`)
	again := env.Post("/orders", "tls-1", `{}`)
	if first.Status != http.StatusCreated || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d, again %d %v", first.Status, again.Status, again.Header)
	}
	keys, err := redis.Do(ctx, "KEYS", "idem:{[0-9a-f]*").StringSlice() // records, not the safety marker
	if err != nil || len(keys) != 1 {
		t.Fatalf("records in the TLS Redis: %v %v", keys, err)
	}
}
