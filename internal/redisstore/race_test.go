//go:build race

package redisstore_test

// underRace is true in a test binary built with -race. TestMemoryPerRecord
// then measures in a test binary built without it (norace.Run).
const underRace = true
