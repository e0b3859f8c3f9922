//go:build !race

package extproc_test

// underRace: see race_test.go.
const underRace = false
