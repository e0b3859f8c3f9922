// Package deploytest proves that the deployment files would be accepted by
// the systems that run them, none of which can run here: every Envoy
// configuration under envoy/ is decoded strictly into the Envoy API with
// every typed_config resolved and validated, and once more, with the Istio
// patches and the filter Envoy Gateway makes of the policy, against Envoy
// 1.36's API by the nested module envoy136 (the oldest Envoy supported,
// docs/envoy-compatibility.md); every kustomize overlay under
// k8s/ is built in-process and each object decoded strictly into its Go API
// type (Kubernetes, Istio, Envoy Gateway, Gateway API); the Dockerfile and
// docker-compose.yml are checked against what the binaries expect. Where a
// file embeds an ext_proc filter, it must carry the settings the server
// depends on (docs/design.md §7) and what the policies it serves need of it
// (max_message_timeout for wait_for_in_flight, the mTLS identity attribute
// for principal scope, buffers for the body limits).
//
// The package has only tests; this file exists so that it is a package.
package deploytest
