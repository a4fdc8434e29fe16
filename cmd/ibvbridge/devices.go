package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/ibvbridge/ibvbridge/verbs"
)

func runDevices(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("devices", stderr)
	asJSON := fs.Bool("json", false, "print the devices as JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError("devices takes no arguments, got %q", pos[0])
	}
	devs, err := verbs.Devices()
	switch {
	case errors.Is(err, verbs.ErrNoDevices):
		// Not an error of the command: the machine has none. Say so and why; JSON readers get an empty list.
		if *asJSON {
			fmt.Fprintln(stderr, err)
			return json.NewEncoder(stdout).Encode([]verbs.Device{})
		}
		fmt.Fprintln(stdout, err)
		return nil
	case err != nil:
		return fmt.Errorf("list RDMA devices: %w", err)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(devs)
	}
	return verbs.Format(stdout, devs)
}
