// Command ibvbridge receives SPEAD streams into a shared-memory ring that C, Python and Go consumers read
// zero-copy. Subcommands: recv, send, stat, ls, rm, consume, devices, bench.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/ibvbridge/ibvbridge/internal/version"
	"github.com/ibvbridge/ibvbridge/ring"
)

// exitError carries a process exit status through the command functions.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageError marks a command-line mistake: one clear line, exit status 2.
func usageError(format string, args ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, args...)}
}

type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"recv", "receive SPEAD streams into a ring", runRecv},
		{"send", "send a generated SPEAD stream", runSend},
		{"stat", "show a ring's geometry, cursors and counters (--watch: live)", runStat},
		{"ls", "list the rings on this host", runLs},
		{"rm", "remove rings nobody holds (NAME... or --stale)", runRm},
		{"consume", "read a ring as its consumer (verification and benchmarks)", runConsume},
		{"devices", "list RDMA devices and their capabilities", runDevices},
		{"bench", "benchmarks: " + strings.Join(benchKinds, ", "), runBench},
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: ibvbridge COMMAND [flags] [args]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nrun 'ibvbridge COMMAND -h' for a command's flags; 'ibvbridge --version' for the version")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "version" {
		fmt.Fprintf(stdout, "ibvbridge %s (ring layout %d.%d)\n", version.Version, ring.MajorVersion, ring.MinorVersion)
		return 0
	}
	for _, c := range commands() {
		if c.name == args[0] {
			err := c.run(args[1:], stdout, stderr)
			if err == nil || errors.Is(err, flag.ErrHelp) {
				return 0
			}
			var ee *exitError
			if errors.As(err, &ee) {
				if ee.err != nil && ee.err.Error() != "" {
					fmt.Fprintf(stderr, "ibvbridge %s: %v\n", c.name, ee.err)
				}
				return ee.code
			}
			fmt.Fprintf(stderr, "ibvbridge %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "ibvbridge: unknown command %q (commands: %s)\n", args[0], commandNames())
	return 2
}

func commandNames() string {
	var n []string
	for _, c := range commands() {
		n = append(n, c.name)
	}
	return strings.Join(n, ", ")
}

// newFlagSet makes a flag set whose parse errors become one clear line and exit status 2.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("ibvbridge "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(os.Stderr)
		fs.Usage()
		return err
	}
	if err != nil {
		return usageError("%v (see -h)", err)
	}
	return nil
}

// newLogger builds the zerolog logger for --log-format console|json. The console has colour only on a
// terminal (and not with NO_COLOR set), and its own millisecond clock: zerolog's timestamp field is
// formatted with whole seconds (its global TimeFieldFormat), which printed every millisecond as .000.
func newLogger(format string, w io.Writer) (zerolog.Logger, error) {
	switch format {
	case "console", "":
		cw := zerolog.ConsoleWriter{Out: w, NoColor: !colourTerminal(w)}
		return zerolog.New(cw).Hook(consoleClock{}), nil
	case "json":
		return zerolog.New(w).With().Timestamp().Logger(), nil
	}
	return zerolog.Nop(), usageError("--log-format %q: want console or json", format)
}

// logNow is the console log's clock (a variable so a test can fix it).
var logNow = time.Now

// consoleClock stamps each console line with the local time to the millisecond.
type consoleClock struct{}

func (consoleClock) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	e.Str(zerolog.TimestampFieldName, logNow().Format("15:04:05.000"))
}

// colourTerminal reports whether w is a terminal that may take colour codes.
func colourTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("NO_COLOR") != "" {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
