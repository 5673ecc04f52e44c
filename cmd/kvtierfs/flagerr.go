package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// parseFlags parses args and turns pflag's errors into usage errors that
// name the flag, the value given and what the flag accepts.
func parseFlags(fl *pflag.FlagSet, args []string) error {
	err := fl.Parse(args)
	if err == nil || errors.Is(err, pflag.ErrHelp) {
		return err
	}
	return usageError{explainFlagError(fl, err)}
}

// explainFlagError rewrites a pflag parse error for an operator.
func explainFlagError(fl *pflag.FlagSet, err error) error {
	help := fmt.Sprintf("run 'kvtierfs %s --help' for its flags", fl.Name())
	var invalid *pflag.InvalidValueError
	var missing *pflag.ValueRequiredError
	var unknown *pflag.NotExistError
	switch {
	case errors.As(err, &invalid):
		f := invalid.GetFlag()
		return fmt.Errorf("--%s %q: want %s (%s)", f.Name, invalid.GetValue(), allowedValues(f), f.Usage)
	case errors.As(err, &missing):
		f := missing.GetFlag()
		return fmt.Errorf("--%s needs a value: %s (%s)", f.Name, allowedValues(f), f.Usage)
	case errors.As(err, &unknown):
		return fmt.Errorf("unknown flag: --%s (%s)", unknown.GetSpecifiedName(), help)
	}
	return fmt.Errorf("%w: %s", err, help)
}

// allowedValues describes what a flag of the given type accepts.
func allowedValues(f *pflag.Flag) string {
	switch t := f.Value.Type(); t {
	case "duration":
		return "a duration such as 500ms, 10s or 10m"
	case "int", "int64", "uint", "uint64":
		return "an integer"
	case "bool":
		return "true or false"
	case "string", "stringArray":
		return "a string"
	default:
		if strings.Contains(t, "|") {
			return "one of " + strings.ReplaceAll(t, "|", ", ")
		}
		return "a value of type " + t
	}
}
