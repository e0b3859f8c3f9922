package grpcxds

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// ExtProcEnv is the variable that makes grpc-go register its ext_proc
// client filter (gRFC A93). grpc-go reads it once, in an init function, so
// it must be set before the process starts.
const ExtProcEnv = "GRPC_EXPERIMENTAL_XDS_EXT_PROC_ON_CLIENT"

// EnableExtProcAndRun runs the tests with grpc-go's ext_proc filter
// enabled: when ExtProcEnv is not "true" it runs the test binary again, with
// the same arguments and the variable set, and returns that run's exit
// code. Call it from TestMain: os.Exit(grpcxds.EnableExtProcAndRun(m)).
func EnableExtProcAndRun(m *testing.M) int {
	if os.Getenv(ExtProcEnv) == "true" {
		return m.Run()
	}
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Env = append(os.Environ(), ExtProcEnv+"=true")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "grpcxds: re-running %s with %s=true: %v\n", os.Args[0], ExtProcEnv, err)
		return 2
	}
	return 0
}
