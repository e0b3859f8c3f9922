// Package grpcxds puts idem-extproc behind grpc-go's own ext_proc client
// (gRFC A93, proxyless gRPC) for tests: an in-process xDS management server
// built from go-control-plane's server and snapshot cache, serving a
// listener whose HTTP connection manager carries the ext_proc filter, a
// cluster and its endpoints; the bootstrap that trusts it; and a counting
// gRPC upstream. The filter configuration is the one docs/grpc.md documents
// (FilterConfig), so the tests exercise exactly what operators deploy.
//
// grpc-go registers its ext_proc filter only when
// GRPC_EXPERIMENTAL_XDS_EXT_PROC_ON_CLIENT=true at process start (the
// variable is read in an init function of grpc's internal envconfig
// package), so test binaries using this package re-execute themselves with
// it set: see EnableExtProcAndRun.
package grpcxds

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
)

// ControlPlane is an xDS management server (ADS over gRPC) serving one
// snapshot to every node.
type ControlPlane struct {
	// Addr is the server's loopback address.
	Addr    string
	cache   cachev3.SnapshotCache
	version atomic.Int64
}

// NodeID is the node every bootstrap of this package names.
const NodeID = "idem-extproc-test"

// StartControlPlane runs a management server until the test ends.
func StartControlPlane(t testing.TB) *ControlPlane {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// ads=false: answer each request with the resources it names, without
	// waiting for the client to have asked for all of them.
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(ctx, cache, nil))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() {
		gs.Stop()
		cancel()
	})
	return &ControlPlane{Addr: lis.Addr().String(), cache: cache}
}

// Bootstrap returns the xDS bootstrap for a client of this control plane.
// The server is marked trusted_xds_server: only then does grpc-go use the
// channel credentials named in the ext_proc filter's grpc_service (gRFC
// A102); otherwise the target must be listed in the bootstrap's
// allowed_grpc_services.
func (cp *ControlPlane) Bootstrap() []byte {
	return fmt.Appendf(nil, `{
  "xds_servers": [{
    "server_uri": "passthrough:///%s",
    "channel_creds": [{"type": "insecure"}],
    "server_features": ["xds_v3", "trusted_xds_server"]
  }],
  "node": {"id": %q}
}`, cp.Addr, NodeID)
}

// Service is one xDS-named gRPC service: what a client dials as
// xds:///Name and where its backend listens.
type Service struct {
	// Name is the listener name (the dial target's authority).
	Name string
	// Backend is the upstream's host:port.
	Backend string
	// Filter is the ext_proc filter put in front of the router; none when
	// nil.
	Filter *extprocfilterv3.ExternalProcessor
}

// Update serves a new snapshot holding each service's listener (an API
// listener whose connection manager has the ext_proc filter and an inline
// route to the service's cluster), cluster (EDS) and endpoints.
func (cp *ControlPlane) Update(ctx context.Context, services ...Service) error {
	res := map[resourcev3.Type][]types.Resource{}
	for _, s := range services {
		l, c, e, err := resources(s)
		if err != nil {
			return err
		}
		res[resourcev3.ListenerType] = append(res[resourcev3.ListenerType], l)
		res[resourcev3.ClusterType] = append(res[resourcev3.ClusterType], c)
		res[resourcev3.EndpointType] = append(res[resourcev3.EndpointType], e)
	}
	snap, err := cachev3.NewSnapshot(strconv.FormatInt(cp.version.Add(1), 10), res)
	if err != nil {
		return err
	}
	return cp.cache.SetSnapshot(ctx, NodeID, snap)
}

func resources(s Service) (*listenerv3.Listener, *clusterv3.Cluster, *endpointv3.ClusterLoadAssignment, error) {
	host, portText, err := net.SplitHostPort(s.Backend)
	if err != nil {
		return nil, nil, nil, err
	}
	port, err := strconv.ParseUint(portText, 10, 32)
	if err != nil {
		return nil, nil, nil, err
	}
	clusterName := "cluster-" + s.Name
	var filters []*hcmv3.HttpFilter
	if s.Filter != nil {
		f, err := httpFilter("envoy.filters.http.ext_proc", s.Filter)
		if err != nil {
			return nil, nil, nil, err
		}
		filters = append(filters, f)
	}
	router, err := httpFilter("envoy.filters.http.router", &routerv3.Router{})
	if err != nil {
		return nil, nil, nil, err
	}
	filters = append(filters, router)
	hcm, err := anypb.New(&hcmv3.HttpConnectionManager{
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: "route-" + s.Name,
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    s.Name,
				Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{
						ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: clusterName},
					}},
				}},
			}},
		}},
		HttpFilters: filters,
	})
	if err != nil {
		return nil, nil, nil, err
	}
	listener := &listenerv3.Listener{
		Name:        s.Name,
		ApiListener: &listenerv3.ApiListener{ApiListener: hcm},
	}
	cluster := &clusterv3.Cluster{
		Name:                 clusterName,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
			EdsConfig: &corev3.ConfigSource{
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			},
		},
		LbPolicy: clusterv3.Cluster_ROUND_ROBIN,
	}
	endpoints := &endpointv3.ClusterLoadAssignment{
		ClusterName: clusterName,
		Endpoints: []*endpointv3.LocalityLbEndpoints{{
			Locality:            &corev3.Locality{Region: "local", Zone: "local", SubZone: s.Name},
			LoadBalancingWeight: wrapU32(1),
			LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
						Address:       host,
						PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)},
					}}},
				}},
				HealthStatus: corev3.HealthStatus_HEALTHY,
			}},
		}},
	}
	return listener, cluster, endpoints, nil
}
