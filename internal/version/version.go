// Package version holds msmemscope's version, written into every config.json.
package version

// Version of msmemscope (library, CLI and Python package alike).
const Version = "0.1.0"
