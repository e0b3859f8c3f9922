//go:build race

package redisstore_test

// underRace is true in a test binary built with -race. TestMemoryPerRecord
// then measures in a test binary built without it (measureWithoutRace).
const underRace = true
