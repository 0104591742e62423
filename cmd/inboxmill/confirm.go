package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// errNotConfirmed: the operator did not answer yes to a destructive
// action's question. Nothing was changed.
var errNotConfirmed = errors.New("not confirmed; nothing changed")

// stdinTerminal reports whether r, the command's standard input, is a
// terminal: only there is someone to answer a question.
func stdinTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// addYesFlag adds --yes to a destructive command.
func addYesFlag(cmd *cobra.Command, yes *bool) {
	cmd.Flags().BoolVarP(yes, "yes", "y", false,
		"go ahead without asking (for scripts; without it the command asks on a terminal, and refuses when standard input is not one)")
}

// mayAsk checks, before anything is opened, that a destructive command
// can be confirmed: with --yes, or by asking on a terminal. Without
// either it refuses (a usage error, exit 2) rather than act unasked or
// wait for an answer no one will type.
func (a *app) mayAsk(cmd *cobra.Command, yes bool) error {
	if yes || a.isTerminal(a.stdin) {
		return nil
	}
	return usageErr(fmt.Errorf("%s changes the inbox and asks for confirmation on a terminal, and standard input is not one: "+
		"pass --yes to go ahead (or --dry-run to see what it would do)", cmd.Name()))
}

// confirm asks question on standard error and reads the answer from
// standard input: "yes" or "y" goes ahead; anything else, or the end of
// the input, is errNotConfirmed. An interrupt while it waits ends the
// command (exit 130), as anywhere else.
func (a *app) confirm(ctx context.Context, question string) error {
	fmt.Fprintf(a.stderr, "%s\ntype yes to go ahead: ", question)
	answer := make(chan string, 1)
	go func() {
		// The read cannot be cancelled; on an interrupt the process
		// exits with it still waiting.
		line, _ := bufio.NewReader(a.stdin).ReadString('\n')
		answer <- line
	}()
	select {
	case <-ctx.Done():
		fmt.Fprintln(a.stderr)
		return ctx.Err()
	case line := <-answer:
		switch strings.ToLower(strings.TrimSpace(line)) {
		case "yes", "y":
			return nil
		}
		if !strings.HasSuffix(line, "\n") {
			fmt.Fprintln(a.stderr)
		}
		return errNotConfirmed
	}
}
