// Package version holds msmemscope's version, written into every config.json.
package version

import (
	_ "embed"
	"strings"
)

// The one place the version is written: the Python package reads the same
// file (pyproject.toml's dynamic version, and msmemscope.__version__).
//
//go:embed VERSION
var file string

// Version of msmemscope (library, CLI and Python package alike).
var Version = strings.TrimSpace(file)
