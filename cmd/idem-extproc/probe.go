package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idem-extproc/idem-extproc/internal/tlsfiles"
)

// probeCommand checks a running server the way a container runtime's
// health check does: one request, exit 0 when ready, 1 when not. The image
// has no shell nor curl (distroless), so its HEALTHCHECK runs this.
func probeCommand(e env) *cobra.Command {
	var httpAddr, grpcAddr, grpcCA, grpcServerName, service string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "probe [flags]",
		Short: "Check a running server's readiness (/readyz, or gRPC health with --grpc); exit 0 ready, 1 not",
		Long: "Check a running server's readiness, for container health checks. By default it asks /readyz on\n" +
			"the admin listener (127.0.0.1 and the port of IDEM_ADMIN_LISTEN, :8081 by default); with --grpc it\n" +
			"asks the standard gRPC health service on the ext_proc listener instead. Ready means the store answers\n" +
			"and the server is not draining. Exit code 0: ready; 1: not ready or not reachable; 2: usage.",
		Example: "  idem-extproc probe\n  idem-extproc probe --http 127.0.0.1:8081\n  idem-extproc probe --grpc 127.0.0.1:50051",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if httpAddr != "" && grpcAddr != "" {
				fmt.Fprintln(e.stderr, "idem-extproc probe: give --http or --grpc, not both")
				return exitUsage
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			var err error
			var what string
			if grpcAddr != "" {
				what = "gRPC health of " + grpcAddr
				err = probeGRPC(ctx, grpcAddr, grpcCA, grpcServerName, service)
			} else {
				if httpAddr == "" {
					httpAddr = defaultAdminProbeAddr(e.getenv)
				}
				what = "http://" + httpAddr + "/readyz"
				err = probeHTTP(ctx, httpAddr)
			}
			if err != nil {
				fmt.Fprintf(e.stderr, "idem-extproc probe: %s: %v\n", what, err)
				return exitFailure
			}
			fmt.Fprintf(e.stdout, "ready (%s)\n", what)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&httpAddr, "http", "", "host:port of the admin listener to ask /readyz (default 127.0.0.1 and the port of IDEM_ADMIN_LISTEN, else 8081)")
	f.StringVar(&grpcAddr, "grpc", "", "host:port of the ext_proc listener to ask the gRPC health service instead")
	f.StringVar(&grpcCA, "grpc-ca-file", "", "with --grpc: PEM CA bundle; speak TLS to a listener with --tls-cert-file (a listener that demands client certificates is probed over --http)")
	f.StringVar(&grpcServerName, "grpc-server-name", "", "with --grpc-ca-file: the name the server's certificate must carry (default: the host of --grpc)")
	f.StringVar(&service, "grpc-service", "", "with --grpc: the health service name to ask (\"\" is the server as a whole; envoy.service.ext_proc.v3.ExternalProcessor also answers)")
	f.DurationVar(&timeout, "timeout", 2*time.Second, "how long to wait for the answer")
	return cmd
}

// defaultAdminProbeAddr is loopback on the admin listener's port, read from
// the same variable the server reads, so one environment serves both.
func defaultAdminProbeAddr(getenv func(string) string) string {
	port := "8081"
	if l := getenv("IDEM_ADMIN_LISTEN"); l != "" {
		if _, p, err := net.SplitHostPort(l); err == nil && p != "" {
			port = p
		}
	}
	return net.JoinHostPort("127.0.0.1", port)
}

func probeHTTP(ctx context.Context, addr string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

func probeGRPC(ctx context.Context, addr, caFile, serverName, service string) error {
	creds := insecure.NewCredentials()
	if caFile != "" {
		pool, err := tlsfiles.CAPool(caFile)
		if err != nil {
			return fmt.Errorf("--grpc-ca-file: %w", err)
		}
		creds = credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12})
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("status %s", resp.GetStatus())
	}
	return nil
}
