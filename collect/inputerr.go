package collect

import (
	"errors"

	"msmemscope/trace"
)

// InputError is an error of the capture being converted (a spool cut short
// or damaged, a folder that is not a capture), not of the conversion: the
// CLI's usage error (exit 2) for --input.
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

// IsInputError reports whether err is, or wraps, an InputError.
func IsInputError(err error) bool {
	var ie *InputError
	return errors.As(err, &ie)
}

// BadInput marks err (nil stays nil) as the input's.
func BadInput(err error) error {
	if err == nil || IsInputError(err) {
		return err
	}
	return &InputError{err}
}

// inputNext marks what next (a decoder's NextInto) fails with as the input's.
func inputNext(next func(*trace.Event) (*trace.Event, error)) func(*trace.Event) (*trace.Event, error) {
	return func(dst *trace.Event) (*trace.Event, error) {
		e, err := next(dst)
		return e, BadInput(err)
	}
}
