package inbox

import (
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"syscall"
)

// classifyConnErr recognises a lost connection whatever the driver, for
// errors of the store's own calls only. After one, a COMMIT's outcome is
// unknown; retrying is still safe because the retry's claim finds the
// record if the commit went through.
func classifyConnErr(err error) error {
	var oe *net.OpError
	switch {
	case errors.Is(err, driver.ErrBadConn),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.EPIPE),
		errors.As(err, &oe):
		return Transient(err)
	}
	return err
}
