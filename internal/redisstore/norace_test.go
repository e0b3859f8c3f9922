//go:build !race

package redisstore_test

// underRace: see race_test.go.
const underRace = false
