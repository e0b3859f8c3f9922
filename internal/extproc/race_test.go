//go:build race

package extproc_test

// underRace is true in a test binary built with -race: the detector's
// shadow memory and slower sends make resident figures meaningless and
// large bodies slow, so BenchmarkResidentMemory only checks that it runs.
const underRace = true
