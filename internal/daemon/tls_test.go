package daemon_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idem-extproc/idem-extproc/internal/certtest"
	"github.com/idem-extproc/idem-extproc/internal/daemon"
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := call(&envoy)
		if err == nil && got == rotated.Serial.String() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still serving %s (was %s), want the rotated %s", got, before, rotated.Serial)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
