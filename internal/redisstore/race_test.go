//go:build race

package redisstore_test

// underRace is true in a test binary built with -race: the benchmarks then
// train their dictionaries on fewer answers.
const underRace = true
