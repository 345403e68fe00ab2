// Command composecheck loads a Compose file the way `docker compose config` does, with compose-go (the library
// the compose plugin parses files with), and prints the resolved project; it exits 1 with the loader's message
// when the file does not validate (schema, undefined services, bad values). It needs no Docker engine.
//
// Used by `make compose-check` and .ci/run on machines without the compose plugin:
//
//	cd deploy/composecheck && go run . ../../docker-compose.yml
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: composecheck FILE [FILE...]")
		os.Exit(2)
	}
	opts, err := cli.NewProjectOptions(os.Args[1:], cli.WithOsEnv, cli.WithDotEnv, cli.WithConsistency(true))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, err := project.MarshalYAML()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Stdout.Write(out)
}
