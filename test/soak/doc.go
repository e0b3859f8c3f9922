// Package soak holds the chaos soak test: many clients send duplicates of
// a small set of operations across several scopes through the
// Envoy-faithful driver, while Redis, the ext_proc server, the clients and
// the upstream misbehave; the upstream's own effect log then proves that no
// operation ran twice, every replay repeated the upstream's answer byte for
// byte, and no answer crossed scopes. See docs/redis.md for its flags.
package soak
