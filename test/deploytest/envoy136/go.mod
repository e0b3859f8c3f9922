// The oldest Envoy API the shipped files claim (docs/envoy-compatibility.md):
// a module of its own so that it can require go-control-plane's envoy
// v1.36.0 beside the repository's newer one. The root module's ./... does
// not include it; test/deploytest's TestEnvoyConfigsDecodeOnEnvoy136
// runs it.
module github.com/idem-extproc/idem-extproc/test/deploytest/envoy136

go 1.26.7

require (
	github.com/envoyproxy/go-control-plane/envoy v1.36.0
	google.golang.org/protobuf v1.36.10
)

require (
	cel.dev/expr v0.24.0 // indirect
	github.com/cncf/xds/go v0.0.0-20250501225837-2ac532fd4443 // indirect
	github.com/envoyproxy/protoc-gen-validate v1.2.1 // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20240319094008-0393e58bdf10 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20250728155136-f173205681a0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20250728155136-f173205681a0 // indirect
)
