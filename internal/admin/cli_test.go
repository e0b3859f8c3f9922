package admin

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestCLIHelpAndUsage: asking for help is not an error (exit 0, usage on
// stderr); a missing or unknown subcommand is (exit 2). Neither sends a
// request, so no server is needed.
func TestCLIHelpAndUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-h"}, 0, "usage: idem-extproc admin get|purge|resolve"},
		{[]string{"help"}, 0, "usage: idem-extproc admin get|purge|resolve"},
		{[]string{"get", "-h"}, 0, "-token-file"},
		{[]string{"resolve", "--help"}, 0, "-action"},
		{nil, 2, "usage: idem-extproc admin"},
		{[]string{"resolv"}, 2, `unknown subcommand "resolv"`},
	} {
		var stdout, stderr bytes.Buffer
		code := RunCLI(context.Background(), tc.args, func(string) string { return "" }, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) || stdout.Len() != 0 {
			t.Errorf("admin %v: exit %d, stderr %q, stdout %q; want exit %d and %q", tc.args, code, stderr.String(), stdout.String(), tc.code, tc.want)
		}
	}
}
