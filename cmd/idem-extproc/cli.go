package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/idem-extproc/idem-extproc/internal/admin"
	"github.com/idem-extproc/idem-extproc/internal/daemon"
	"github.com/idem-extproc/idem-extproc/internal/version"
)

// exitCode ends a command with this process exit code; its message, if
// any, has been printed already.
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit code %d", int(c)) }

// Exit codes: 2 for a mistake in how the command was called or configured
// (as the server has always used), 1 for a failure of what it did.
const (
	exitFailure exitCode = 1
	exitUsage   exitCode = 2
)

// env is what a command reads from its process.
type env struct {
	getenv         func(string) string
	stdout, stderr io.Writer
}

// run executes the command line args and returns the process exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	root := newRoot(env{getenv: getenv, stdout: stdout, stderr: stderr})
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	var code exitCode
	switch {
	case err == nil:
		return 0
	case errors.As(err, &code):
		return int(code)
	default: // cobra's own: an unknown subcommand or flag, a wrong number of arguments
		fmt.Fprintf(stderr, "idem-extproc: %v\nRun 'idem-extproc --help' for usage.\n", err)
		return int(exitUsage)
	}
}

const description = "idem-extproc enforces HTTP Idempotency-Key semantics for Envoy through the ext_proc protocol."

func newRoot(e env) *cobra.Command {
	root := &cobra.Command{
		Use:   "idem-extproc [flags]",
		Short: description,
		Long: description + "\n\n" +
			"Run without a subcommand (or with serve) it is the server. Every server flag can also be set by\n" +
			"an environment variable IDEM_<FLAG> (upper case, dashes as underscores); a flag on the command line wins.",
		Example: "  idem-extproc --redis-url redis://localhost:6379/0 --config policies.yaml\n" +
			"  idem-extproc demo\n" +
			"  idem-extproc config check examples/policies.yaml\n" +
			"  idem-extproc probe --grpc 127.0.0.1:50051",
		SilenceErrors: true,
		SilenceUsage:  true,
		// The server's flags are parsed by package flag in internal/daemon
		// (one definition, environment variables, every mistake reported at
		// once); cobra only shows and completes them, bridged into pflag.
		// Package flag also accepts the -flag spelling earlier releases
		// documented nowhere but took.
		DisableFlagParsing: true,
		Args:               cobra.ArbitraryArgs,
		RunE:               serve(e, true),
	}
	root.Flags().AddGoFlagSet(daemon.Flags())
	root.Flags().Bool("version", false, "print the version and exit")
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	// Usage by function, not template: a template makes the binary link
	// text/template's executor, whose reflect.Value.MethodByName keeps
	// every exported method of every type the linker sees (cmd/link,
	// deadcode.go: the ReflectMethod attribute), Redis commands never
	// sent included. cobra's own usage is a function since v1.10.
	plain := root.UsageFunc()
	environment := environmentHelp()
	withEnvironment := func(c *cobra.Command) error {
		if err := plain(c); err != nil {
			return err
		}
		_, err := io.WriteString(c.OutOrStderr(), environment)
		return err
	}
	root.SetUsageFunc(withEnvironment)
	root.AddGroup(&cobra.Group{ID: "main", Title: "Commands:"})

	srv := &cobra.Command{
		Use:                "serve [flags]",
		Short:              "Run the ext_proc server (the default when no subcommand is given)",
		DisableFlagParsing: true,
		Args:               cobra.ArbitraryArgs,
		RunE:               serve(e, false),
	}
	srv.Flags().AddGoFlagSet(daemon.Flags())
	srv.SetUsageFunc(withEnvironment)
	root.AddCommand(srv, adminCommand(e), configCommand(e), compressCommand(e), probeCommand(e), demoCommand(e), versionCommand(e))
	for _, c := range root.Commands() {
		c.GroupID = "main"
		if c != srv { // the environment is the server's
			c.SetUsageFunc(plain)
		}
	}
	root.SetCompletionCommandGroupID("main")
	root.SetHelpCommandGroupID("main")
	return root
}

// environmentHelp lists the environment variables, after the flags.
func environmentHelp() string {
	var names []string
	daemon.Flags().VisitAll(func(f *flag.Flag) { names = append(names, daemon.EnvName(f.Name)) })
	var b strings.Builder
	b.WriteString("\nEnvironment (each sets the flag of its name; a flag on the command line wins):\n")
	line := " "
	for _, n := range names {
		if len(line)+len(n)+1 > 100 {
			b.WriteString(line + "\n")
			line = " "
		}
		line += " " + n
	}
	b.WriteString(line + "\n")
	b.WriteString("  IDEM_ADMIN_ADDR, IDEM_ADMIN_TOKEN_FILE (idem-extproc admin)\n")
	b.WriteString("  OTEL_* (tracing: the OpenTelemetry SDK's standard variables)\n")
	return b.String()
}

// serve runs the server with args, which package flag parses.
func serve(e env, isRoot bool) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if isRoot && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			// Not a flag: a subcommand cobra did not know.
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return errors.New(msg)
		}
		if isRoot && (slices.Contains(args, "--version") || slices.Contains(args, "-version")) {
			fmt.Fprintln(e.stdout, version.Get())
			return nil
		}
		if done, err := preParse(cmd, daemon.Flags(), args, e.stderr); done {
			return err
		}
		if code := daemon.Main(cmd.Context(), args, e.getenv, e.stderr); code != 0 {
			return exitCode(code)
		}
		return nil
	}
}

// preParse parses args with a throwaway copy fs of the Go flags a command
// bridged into pflag, so that -h and --help show cobra's help (with the
// --flag spelling and the subcommands) and a malformed flag is one line
// instead of package flag's whole usage text. done says the command is
// over (help shown, or a usage error returned); otherwise the command
// parses args again, for real.
func preParse(cmd *cobra.Command, fs *flag.FlagSet, args []string, stderr io.Writer) (done bool, err error) {
	var out bytes.Buffer
	fs.SetOutput(&out)
	switch err := fs.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		cmd.SetOut(cmd.OutOrStdout())
		return true, cmd.Help()
	case err != nil:
		msg := goFlagName.ReplaceAllString(err.Error(), "$1--$2")
		fmt.Fprintf(stderr, "%s: %s\nRun '%s --help' for usage.\n", cmd.CommandPath(), msg, cmd.CommandPath())
		return true, exitUsage
	}
	return false, nil
}

// goFlagName finds a flag name in package flag's messages ("flag provided
// but not defined: -nope", "invalid value "x" for flag -listen: …"), which
// spell it with one dash; the help spells every flag with two.
var goFlagName = regexp.MustCompile(`(: |flag )-([a-z][a-z0-9-]*)`)

// groupCommand is a command that only holds subcommands: without one it
// shows its usage and fails, and an unknown one is named (before any flag
// after it is judged: `admin resolv --action release` is a misspelt
// subcommand, not an unknown flag).
func groupCommand(use, short string, e env) *cobra.Command {
	return &cobra.Command{
		Use:                use,
		Short:              short,
		DisableFlagParsing: true,
		Args:               cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && slices.Contains([]string{"-h", "-help", "--help"}, args[0]) {
				return cmd.Help()
			}
			for _, a := range args {
				if !strings.HasPrefix(a, "-") {
					msg := fmt.Sprintf("unknown subcommand %q for %q", a, cmd.CommandPath())
					if s := cmd.SuggestionsFor(a); len(s) > 0 {
						msg += "; did you mean " + strings.Join(s, " or ") + "?"
					}
					return errors.New(msg)
				}
			}
			cmd.SetOut(e.stderr)
			_ = cmd.Usage()
			return exitUsage
		},
	}
}

var adminHelp = map[string]string{
	"get":      "Show a record (state, fingerprint, stored response metadata)",
	"purge":    "Delete a record, so the next attempt runs the operation again",
	"resolve":  "Settle an unknown record: release it, or complete it with the response you found",
	"adoption": "Report key adoption and what each policy prevented (GET /admin/v1/adoption)",
}

func adminCommand(e env) *cobra.Command {
	cmd := groupCommand("admin", "Act on records through a running server's admin API (--admin-token-file)", e)
	for _, name := range admin.Subcommands {
		sub := &cobra.Command{
			Use:                name + " [flags]",
			Short:              adminHelp[name],
			DisableFlagParsing: true, // package flag in internal/admin parses them
			Args:               cobra.ArbitraryArgs,
			RunE: func(cmd *cobra.Command, args []string) error {
				if done, err := preParse(cmd, admin.Flags(name, e.getenv), args, e.stderr); done {
					return err
				}
				if code := admin.RunCLI(cmd.Context(), append([]string{name}, args...), e.getenv, e.stdout, e.stderr); code != 0 {
					return exitCode(code)
				}
				return nil
			},
		}
		sub.Flags().AddGoFlagSet(admin.Flags(name, e.getenv))
		cmd.AddCommand(sub)
	}
	return cmd
}

func versionCommand(e env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, the VCS revision and the Go version",
		Args:  cobra.NoArgs,
		Run: func(*cobra.Command, []string) {
			fmt.Fprintln(e.stdout, version.Get())
		},
	}
}
